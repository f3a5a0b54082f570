"""`plan_graph`: captured DiT graph + mesh + hardware -> `Plan`, through the ILP.

`DitFamily` (`planner.dit_family`, one module per job beside it) is the DiT's side of
`planner.engine` (which solves, words the failures and calls back to explain and assemble; the VAE
is the other family, `planner.vae_plan`). `price_plan` / `evaluate_forward` (`planner.forward`)
price any plan under the same rules. Pipeline (each step is its own module):

1. `structure.find_structure` splits the graph into prologue, one representative block (its macros
   with their glue), epilogue; `strategies.strategies` lists each macro's legal options.
2. Every option is priced by running the op rules over the macro's ops (`propagate.evaluate`): the
   collectives it implies, roofline compute, parameter and activation bytes per device. Stream
   edges between macros are priced as redistributions of the (B, L, D) tokens.
3. `ilp.solve` picks one option per macro (blocks share variables, costs × N) under the memory
   budget, hinted with the tt-xla style plan (head-TP on the last axis, SP on the others).
4. The chosen plan is evaluated end to end once more: its collectives (HLO units, ``where``
   naming the op), predicted compute/comm/memory, guards; then expanded by name to all N blocks.
"""

from __future__ import annotations

from planner import engine
from planner.dit_family import DitFamily
from planner.dit_problem import PRESETS
from planner.forward import Forward, evaluate_forward, price_plan
from planner.graph import Graph
from planner.hardware import HardwareProfile
from planner.mesh import MeshSpec
from planner.plan import Plan
from planner.request import PlanRequest

__all__ = [
    "PRESETS",
    "DitFamily",
    "Forward",
    "PlanRequest",
    "evaluate_forward",
    "plan_graph",
    "plan_request",
    "price_plan",
]


def plan_graph(graph: Graph, mesh: MeshSpec, hardware: str | HardwareProfile | None = None, **fields) -> Plan:
    """Plan a captured Wan DiT graph on one mesh (no CFG choice: `planner.cfg.plan_dit` adds it): the request
    `PlanRequest.make(mesh, hardware, **fields)` (`planner.request`) planned by `plan_request`.

    Args:
        graph: the captured graph (`wancompile.capture`); one or two blocks suffice.
        mesh: the logical mesh (axes of size 1 are ignored).
        hardware: a profile name (`planner.hardware.PROFILES`) or profile; None: the system with
            this mesh shape (`planner.hardware.default_hardware`).
        fields: `PlanRequest`'s, of which the DiT reads:
            memory_gb: per-device budget (default: the profile's DRAM).
            num_blocks: how many identical blocks the model has (default: as captured). Block decisions
                are shared; parameters and constraints are written for all of them by name.
            weight_sets: weight sets resident per device (2 for both A14B experts).
            values: example sizes for symbolic dims (costs need numbers; the plan keeps guards).
            time_limit_s: the solver's limit (default 5 s).
            sequence_parallel: False restricts block macros to unsplit tokens (TP / replicated only).
            only: macro name (``attn1``, ``ffn``, ``condition_embedder.time_embedder``) -> regular
                expression a strategy name must match (``{"attn1": "^Ulysses"}``): restricts the
                choice, e.g. to compile and check a strategy the cost model would not pick here.
            batch_axes: mesh axes that split the batch dim (dim 0) of every batch-carrying value and that no
                macro may use otherwise (CFG parallel: ``("cfg",)``, `planner.cfg`); parameters stay
                replicated over them. Batch-carrying = the values whose propagated layout, from the
                batch-split model inputs, keeps the split on dim 0 (the op rules decide, no name lists).
            stream_layouts: offer the split stream layouts between macros (STATE B: hidden split over
                the TP axes; sequence-parallel Megatron: tokens also split over them) besides STATE A
                (hidden whole). False: STATE A only, the seed's plans.
            preset: ``auto`` (the solver decides) or ``tt-xla``: the seed's hand plan through this same
                engine — every block macro head-TP / Megatron on the last mesh axis with SP on the others,
                the embedders Megatron on the last axis, STATE A, no FSDP — so its bill is the rules'
                (`PRESETS`); the other options are recorded as excluded by the preset.
            target: the partitioner (`planner.targets`): options and stream edges are priced with the
                reshards it compiles (tt-mlir: a split added to a split value is an all-to-all), while the
                plan's ``collectives`` stay GSPMD's (its prediction for the target: `planner.pins`).
            pad_heads: {block-generic attention module: heads} -> the planner graph of this model with
                those attentions' heads zero-padded (`planner.padding`). Given, attentions whose heads a
                split of the mesh does not divide are also offered head-TP / Ulysses on padded heads,
                priced on that graph; a plan that chooses one names ops of the padded graph and records
                the padding in its decisions (`Plan.head_padding`). None: no padded options.
            fsdp_blocks: block macro -> how many of its blocks run the FSDP twin of its chosen strategy
                (0 .. num_blocks - 1; fixes the ILP's w, `planner.ilp` (e)): with ``only``, transfers a
                plan's FSDP block range to another model (``bench/bench_score.py``). None: the solver
                decides, for every block macro, how many blocks (the last ones) memory needs on the twin.

    Raises:
        MemoryBudgetError: no plan fits the budget; ``need_gb`` is a budget that plans (found by a
            minimise-memory solve), ``meshes`` the larger system meshes that would plan within it.
        SolverTimeout: the solver hit ``time_limit_s`` before finding any plan.
    """
    return plan_request(graph, PlanRequest.make(mesh, hardware, **fields))


def plan_request(graph: Graph, request: PlanRequest) -> Plan:
    """The DiT plan for `graph` under `request` on its mesh, as it is (no CFG choice)."""
    family = DitFamily(graph, request)
    limit = request.time_limit_s if request.time_limit_s is not None else 5.0
    return engine.plan(family, request.budget_bytes, limit).with_(target=request.target.name)
