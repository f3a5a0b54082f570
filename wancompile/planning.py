"""Which plan a captured graph gets (the backend's planning step): a saved ``plan.json``, the tt-xla
preset, or the planner's (DiT, VAE decode, else replicated), solved or read from the plan cache; and
`HeadPadder`, the head-padded graphs the DiT planner may choose between."""

from __future__ import annotations

import fnmatch
import logging
from typing import Any, Mapping, Optional

import torch
import torch.fx as fx

from planner.graph import Graph
from planner.hardware import default_hardware
from planner.mesh import MeshSpec
from planner.plan import Plan, PlanError, load_plan, replicated_params
from wancompile.capture import annotate
from wancompile.cfg_context import CFG_PAIR_SPLITTABLE
from wancompile.options import Options

log = logging.getLogger("wancompile")


class HeadPadder:
    """The graphs of one captured model with attention heads zero-padded (rewrites/pad_heads.py):
    the planner's ``pad_heads`` function (`planner.padding`), and the graph a plan that pads names.
    Each padding is made once."""

    def __init__(self, gm: fx.GraphModule, graph: Graph) -> None:
        self.gm, self.model = gm, graph.model
        # {pads} -> (GraphModule, planner graph, where the rewrite padded, why it skipped any)
        self._made: dict[frozenset, tuple] = {frozenset(): (gm, graph, (), ())}

    def __call__(self, pads: Mapping[str, int]) -> Graph:
        """The planner graph with `pads` applied; raises PlanError as `graphs` does (one check for
        the options the planner offers and the plans the backend builds)."""
        return self.graphs(pads)[1]

    def graphs(self, pads: Mapping[str, int]) -> tuple[fx.GraphModule, Graph]:
        """(GraphModule, planner graph) with `pads` applied ({}: the model's); raises PlanError when
        an attention cannot be padded as the plan says."""
        gm, graph, where, skipped = self._make(pads)
        missing = [p for p in pads if not any(fnmatch.fnmatchcase(w, p) for w in where)]
        if missing:
            raise PlanError(
                f"the plan runs {', '.join(missing)} on padded heads, but this model's attention there cannot be "
                f"padded ({'; '.join(skipped) or 'no such attention'}); re-plan for this model"
            )
        return gm, graph

    def _make(self, pads: Mapping[str, int]) -> tuple:
        from rewrites.pad_heads import pad_heads

        key = frozenset(pads.items())
        if key not in self._made:
            gm = fx.GraphModule(self.gm, self.gm.graph.__deepcopy__())
            report = pad_heads(gm, dict(pads))
            gm.recompile()
            self._made[key] = (gm, annotate(gm, model=self.model), report.where, report.skipped)
        return self._made[key]


def plan_for(
    graph: Graph, mesh: MeshSpec, opts: Options, values: dict[str, int], padder: HeadPadder
) -> tuple[Plan, bool]:
    """The plan for `graph` (`values`: its symbolic sizes, `symbol_values`) and whether it came from the
    plan cache (`wancompile.cache`)."""
    if opts.plan == "tt-xla":
        from planner.hand_plans import tt_xla_plan  # the tt-xla preset through the engine

        return tt_xla_plan(graph, mesh, opts.hardware or default_hardware(mesh), values=values), False
    if opts.plan is not None:
        plan = load_plan(opts.plan)
        if plan.user_mesh.shape != mesh.shape:
            raise PlanError(
                f"plan {opts.plan} was made for mesh {plan.user_mesh} but this compile uses mesh {mesh}; "
                f"pass mesh={str(plan.user_mesh)!r} or re-plan for {mesh}"
            )
        if plan.user_mesh.axis_names != mesh.axis_names:
            raise PlanError(
                f"plan {opts.plan} names mesh axes {plan.user_mesh.axis_names}, this mesh has {mesh.axis_names}"
            )
        if plan.weight_sets is not None and plan.weight_sets < opts.weight_sets:
            log.warning(
                "wan_autoshard: plan %s was budgeted for %d resident weight set(s) but weight_sets=%d; it may not "
                "fit device memory. Re-plan with weight_sets=%d (drop the `plan` option).",
                opts.plan,
                plan.weight_sets,
                opts.weight_sets,
                opts.weight_sets,
            )
        return plan, False
    return solved_plan(graph, mesh, opts, values, padder)


def solved_plan(
    graph: Graph, mesh: MeshSpec, opts: Options, values: Optional[dict[str, int]], padder: Optional[HeadPadder]
) -> tuple[Plan, bool]:
    """`solve`'s plan, read from the plan cache when it holds one (`wancompile.cache`), and whether it did."""
    from wancompile.cache import cached_plan

    settings = _plan_settings(opts, values, padder is not None)
    return cached_plan(opts.cache_dir, graph, mesh, settings, lambda: solve(graph, mesh, opts, values, padder))


def _plan_settings(opts: Options, values: Optional[dict[str, int]], padded: bool) -> dict[str, Any]:
    """What besides the graph and the mesh a solved plan depends on: its plan-cache key (`wancompile.cache`)."""
    return dict(
        hardware=opts.hardware,
        memory_gb=opts.memory_gb,
        weight_sets=opts.weight_sets,
        cfg_parallel=opts.cfg_parallel,
        target=opts.resolved_target,
        values=values or {},
        pad_heads=padded,
        sequential=CFG_PAIR_SPLITTABLE.get(),
    )


def symbol_values(gm: fx.GraphModule) -> dict[str, int]:
    """Example sizes of the symbolic dims of a ``dynamic=True`` capture (the sizes dynamo saw), which
    the planner prices with while the plan keeps the symbols in its guards."""
    out = {}
    for n in gm.graph.nodes:
        v = n.meta.get("example_value")
        if n.op == "placeholder" and isinstance(v, torch.SymInt) and v.node.hint is not None:
            out[str(v.node.expr)] = int(v.node.hint)
    return out


def solve(
    graph: Graph,
    mesh: MeshSpec,
    opts: Options,
    values: Optional[dict[str, int]] = None,
    padder: Optional[HeadPadder] = None,
    num_blocks: Optional[int] = None,
) -> Plan:
    """A plan for `graph` on `mesh` without a saved plan: the VAE planner's for a Wan VAE decode
    graph, the DiT planner's for a Wan DiT graph (with padded-head options where `padder` is
    given; `num_blocks`: the blocks of the whole model when the graph holds fewer), else replicated
    (`replicated_plan`)."""
    from planner.cfg import plan_dit
    from planner.hardware import resolve_hardware
    from planner.targets import get_target
    from planner.vae_plan import is_vae_graph, plan_vae

    # priced as the target compiles: what its partitioner cannot lower is priced out (Target.profile)
    profile = get_target(opts.resolved_target).profile(resolve_hardware(opts.hardware, mesh))
    common = dict(memory_gb=opts.memory_gb, model=graph.model, target=opts.resolved_target)  # both planners'
    if is_vae_graph(graph):  # a full-T VAE decode (wancompile.enable_full_t) or one chunk of it
        if opts.cfg_parallel == "on":
            log.info("wan_autoshard: cfg_parallel=on applies to DiT graphs; the VAE decode is planned without it")
        return plan_vae(graph, mesh, profile, **common)
    if any(n.op == "scaled_dot_product_attention" for n in graph) and graph.blocks():
        # A batch-2 graph (the CFG pair as one forward) gets the costed CFG-parallel choice (planner.cfg).
        return plan_dit(
            graph,
            mesh,
            profile,
            cfg_parallel=opts.cfg_parallel,
            values=values or None,
            weight_copies=opts.weight_sets,
            pad_heads=padder,
            sequential=CFG_PAIR_SPLITTABLE.get(),
            num_blocks=num_blocks,
            **common,
        )
    return replicated_plan(graph, mesh, opts)


def replicated_plan(graph: Graph, mesh: MeshSpec, opts: Options) -> Plan:
    """The plan for a graph neither planner plans (no repeated attention blocks, not a Wan VAE decode):
    every parameter replicated, within ``memory_gb`` (its parameters, times ``weight_sets``, on each
    device) or a `MemoryBudgetError` naming the budget that holds them."""
    from planner.plan import MemoryBudgetError

    need_gb = sum(int(p.out.nbytes) for p in graph.params()) * opts.weight_sets / 1e9
    if opts.memory_gb is not None and need_gb > opts.memory_gb:
        raise MemoryBudgetError(
            f"{_graph_name(graph)} has no repeated attention blocks and is not a Wan VAE decode, so it runs "
            f"replicated, and its parameters ({opts.weight_sets} weight set(s)) need {need_gb:.6g} GB per device, "
            f"over memory_gb={opts.memory_gb:.6g}. Raise memory_gb to at least {need_gb:.6g}, or compile the "
            "part of the model that holds the weights (the transformer, the VAE decode) by itself",
            budget_gb=opts.memory_gb,
            need_gb=need_gb,
        )
    log.warning(
        "wan_autoshard: %s has no repeated attention blocks and is not a Wan VAE decode: running it "
        "replicated on mesh %s (%.6g GB of parameters per device)",
        _graph_name(graph),
        mesh,
        need_gb,
    )
    return Plan(graph.model, mesh, replicated_params(graph), notes=("no repeated attention blocks: replicated",))


def _graph_name(graph: Graph) -> str:
    return f"graph {graph.model}" if graph.model not in ("", "graph") else "the graph"
