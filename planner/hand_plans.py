"""The tt-xla hand plan for the Wan DiT (seed 000): the ``tt-xla`` preset of the DiT planner.

The one way to the seed's plan, for the backend (``plan="tt-xla"``), the CLI (``--preset tt-xla``,
``--hand tt-xla``), the benches and the calibration: `tt_xla_plan` checks the seed's preconditions
(whole heads per device on the TP axis, the tokens divided by the SP axis), words what to do when
they fail, and plans the ``tt-xla`` preset through the engine (`planner.autoplan.plan_graph`): every
block macro head-TP / Megatron on the last mesh axis with SP on the others, the embedders Megatron on
the last axis, STATE A, no FSDP. Its bill, constraints and prediction are the rules', as an auto plan's.

- TP on the ``model`` axis (the last mesh axis): Megatron col->row pairs on attn1/attn2
  (to_q/k/v column-parallel, to_out row-parallel), ffn (net.0.proj column, net.2 row), and the
  time/text embedder MLPs; norm_q/norm_k weights sharded like the activation they scale (their
  mean-square then needs a small stats all-reduce). Whole heads per device: heads % TP == 0.
- Replicated: patch_embedding, time_proj, proj_out, scale_shift_tables, norm2, rope buffers.
- SP on the ``batch`` axis (the first axis of a 2-D mesh): the flattened tokens at the block-stack
  entry are split on L; K/V of self-attention are all-gathered on it; proj_out's output is gathered
  back before unpatchify.

Unless the caller gives a budget, the plan is made whatever its memory (the seed's plan is what it is;
its prediction says what it needs).
"""

from __future__ import annotations

from typing import Optional

from planner.graph import Graph
from planner.hardware import HardwareProfile
from planner.mesh import MeshSpec
from planner.plan import Plan, PlanError
from planner.request import PlanRequest
from planner.structure import StructureError, block_stack_entry


def tp_sp_axes(mesh: MeshSpec) -> tuple[str, Optional[str]]:
    """TP on the last mesh axis, SP on the first of a 2-D mesh (tt-xla's convention)."""
    tp = mesh.axis_names[-1]
    sp = mesh.axis_names[0] if len(mesh.shape) >= 2 else None
    return tp, sp


# the budget of a plan made whatever its memory: 1 PB per device (the solver's integers stay in range)
UNLIMITED_GB = 1e6


def tt_xla_plan(
    graph: Graph,
    mesh: MeshSpec,
    hardware: str | HardwareProfile | None = None,
    *,
    model: str = "",
    memory_gb: Optional[float] = None,
    **how,
) -> Plan:
    """The seed's hand plan for a captured Wan DiT graph on `mesh`: the ``tt-xla`` preset through the
    engine (`planner.autoplan.plan_graph`; `hardware`, `memory_gb` and `how` — ``num_blocks``,
    ``weight_sets``, ``values``, ``time_limit_s``, ``target`` — as its). `memory_gb` None: no budget.

    Raises:
        PlanError: the heads do not divide over the last mesh axis, or the tokens over the first.
    """
    from planner.autoplan import plan_graph

    check_tt_xla(graph, mesh)
    budget = UNLIMITED_GB if memory_gb is None else memory_gb
    return plan_graph(graph, mesh, hardware, preset="tt-xla", memory_gb=budget, model=model, **how)


def tt_xla_request(graph: Graph, request: PlanRequest) -> Plan:
    """`tt_xla_plan` under `request` (`planner.request`): the ``tt-xla`` preset on its mesh, hardware and target;
    no budget unless the request has one."""
    from planner.autoplan import plan_request

    check_tt_xla(graph, request.mesh)
    budget = UNLIMITED_GB if request.memory_gb is None else request.memory_gb
    return plan_request(graph, request.variant(preset="tt-xla", memory_gb=budget))


def check_tt_xla(graph: Graph, mesh: MeshSpec) -> None:
    """The seed's preconditions on `mesh`, with what to do when one fails."""
    tp, sp = tp_sp_axes(mesh)
    ntp = mesh.axis_size(tp)
    heads = _num_heads(graph)
    if heads % ntp:
        raise PlanError(
            f"the tt-xla plan keeps whole heads per device, but {heads} heads do not divide over the '{tp}' axis of size {ntp}; "
            f"use a mesh whose last axis divides {heads}"
        )
    if sp is None or mesh.axis_size(sp) == 1:
        return
    try:
        entry = block_stack_entry(graph)
    except StructureError as e:
        raise PlanError(str(e)) from None
    tokens, nsp = entry.out.shape[1], mesh.axis_size(sp)
    if isinstance(tokens, int) and tokens % nsp:
        raise PlanError(
            f"the tt-xla plan splits the sequence of {tokens} tokens (latent frames x height/2 x width/2) over the "
            f"'{sp}' axis of size {nsp}, which does not divide {tokens}; add the sp_pad rewrite "
            f"(rewrites=['sp_pad']: pads the tokens to a multiple of {nsp} and masks the padding), or use a mesh "
            f"whose '{sp}' axis divides {tokens}, or a resolution / frame count whose token count {nsp} divides"
        )


def _num_heads(graph: Graph) -> int:
    for n in graph:
        if n.op == "unflatten" and n.module.endswith("attn1"):
            sizes = n.attrs["args"][2]
            if isinstance(sizes, list) and isinstance(sizes[0], int) and sizes[0] > 0:
                return sizes[0]
    raise PlanError("cannot find the attention head count (no unflatten in attn1); is this a Wan DiT graph?")
