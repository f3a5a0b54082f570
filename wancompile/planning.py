"""Which plan a captured graph gets (the backend's planning step): the one `planner.request.PlanRequest`
a compile plans under (`request_for`, built from the backend's options), and the plan for it: a saved
``plan.json``, the tt-xla preset, or its family's planner (`planner.families`: DiT, VAE decode; else
replicated), solved or read from the plan cache; and `HeadPadder`, the head-padded graphs the DiT planner
may choose between."""

from __future__ import annotations

import fnmatch
import logging
from pathlib import Path
from typing import Any, Mapping, Optional

import torch
import torch.fx as fx

from planner.graph import Graph
from planner.mesh import MeshSpec
from planner.plan import Plan, PlanError, replicated_params
from planner.request import PlanRequest
from wancompile.capture import annotate
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


def request_for(
    opts: Options, mesh: MeshSpec, *, target: Optional[str] = None, on_target_mesh: bool = False, **fields: Any
) -> PlanRequest:
    """The one request a compile plans under (`planner.request.PlanRequest`), from the backend's options:
    its hardware, target (`target`, else `Options.resolved_target`), budget, weight sets, CFG mode and
    whether the caller can split a CFG pair;
    `fields` add the rest (``values``, ``pad_heads``, ``num_blocks``). `on_target_mesh`: `mesh` as the
    target's partitioner accepts it (`planner.targets.Target.runs_on`)."""
    return PlanRequest.make(
        mesh,
        opts.hardware,
        target or opts.resolved_target,
        on_target_mesh=on_target_mesh,
        memory_gb=opts.memory_gb,
        weight_sets=opts.weight_sets,
        cfg_parallel=opts.cfg_parallel,
        cfg_pair_splittable=opts.cfg_pair_splittable,
        **fields,
    )


def plan_for(graph: Graph, request: PlanRequest, opts: Options, saved: Optional[Plan] = None) -> tuple[Plan, bool]:
    """The plan for `graph` under `request` (`saved`: the plan.json the ``plan`` option names, loaded) and
    whether it came from the plan cache (`wancompile.cache`)."""
    mesh = request.mesh
    if opts.plan == "tt-xla":
        from planner.hand_plans import tt_xla_request  # the tt-xla preset through the engine

        return tt_xla_request(graph, request.variant(memory_gb=None)), False  # made whatever its memory
    if saved is not None:
        plan = saved
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
    return solved_plan(graph, request, opts.cache_dir)


def solved_plan(graph: Graph, request: PlanRequest, cache_dir: Optional[Path] = None) -> tuple[Plan, bool]:
    """`solve`'s plan, read from the plan cache when it holds one (`wancompile.cache`), and whether it did."""
    from wancompile.cache import cached_plan

    return cached_plan(cache_dir, graph, request.mesh, _plan_settings(request), lambda: solve(graph, request))


def _plan_settings(request: PlanRequest) -> dict[str, Any]:
    """What besides the graph and the mesh a solved plan depends on: its plan-cache key (`wancompile.cache`)."""
    return dict(
        hardware=request.hw.name,
        memory_gb=request.memory_gb,
        weight_sets=request.weight_sets,
        cfg_parallel=request.cfg_parallel,
        target=request.target.name,
        values=dict(request.values),
        pad_heads=request.pad_heads is not None,
        sequential=request.cfg_pair_splittable,
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


def solve(graph: Graph, request: PlanRequest) -> Plan:
    """A plan for `graph` under `request` without a saved plan: its family's planner (`planner.families`: the
    VAE planner's for a Wan VAE decode graph, the DiT planner's for a Wan DiT graph, with padded-head options
    where the request has ``pad_heads``), else replicated (`replicated_plan`)."""
    from planner.families import family_of

    family = family_of(graph)
    if family is None:
        return replicated_plan(graph, request)
    return family.plan(graph, request)


def replicated_plan(graph: Graph, request: PlanRequest) -> Plan:
    """The plan for a graph no planner family recognises (no repeated attention blocks, not a Wan VAE decode):
    every parameter replicated, within ``memory_gb`` (its parameters, times ``weight_sets``, on each
    device) or a `MemoryBudgetError` naming the budget that holds them."""
    from planner.plan import MemoryBudgetError

    mesh, memory_gb, weight_sets = request.mesh, request.memory_gb, request.weight_sets
    need_gb = sum(int(p.out.nbytes) for p in graph.params()) * weight_sets / 1e9
    if memory_gb is not None and need_gb > memory_gb:
        raise MemoryBudgetError(
            f"{_graph_name(graph)} has no repeated attention blocks and is not a Wan VAE decode, so it runs "
            f"replicated, and its parameters ({weight_sets} weight set(s)) need {need_gb:.6g} GB per device, "
            f"over memory_gb={memory_gb:.6g}. Raise memory_gb to at least {need_gb:.6g}, or compile the "
            "part of the model that holds the weights (the transformer, the VAE decode) by itself",
            budget_gb=memory_gb,
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
