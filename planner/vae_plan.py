"""`plan_vae`: a captured Wan VAE decode graph (full-T or one chunk) + mesh + hardware -> `Plan`.

The VAE decode as a model family of `planner.engine`, in parts by job:

- `planner.vae_macros`: its macros (residual blocks, attention, upsamplers, head, tail), found by
  module path, and the stream layouts between them;
- `planner.vae_strategies`: each macro's options (spatial, channel, gather, frames, replicated) and
  the presets;
- this module: `VaeFamily` (each group's options priced by the op rules, `planner.pricing`; the
  stream edges, `planner.macros.stream_edges`; the decisions), `plan_vae` and `halo_convs`;
- `planner.vae_assemble`: the plan from the solved problem.

ILP groups are macros of identical ops and shapes (identical residual blocks share one variable, the
cost multiplied by their count); edges carry the stream layout between consecutive macros.
"""

from __future__ import annotations

import re
from typing import Mapping, Optional

from planner import engine, pricing
from planner.cost_model import to_ns
from planner.graph import Graph
from planner.hardware import HardwareProfile
from planner.ilp import Edge, Group
from planner.macros import Macro, crossing, restrict, stream_edges
from planner.mesh import MeshSpec
from planner.plan import Decision, Plan, PlanError
from planner.propagate import Evaluation
from planner.request import PlanRequest
from planner.vae_assemble import assemble
from planner.vae_macros import FORBIDDEN_NS, find_macros, is_vae_graph, local_transition, stream_layout
from planner.vae_strategies import PRESETS, VaeStrategy, macro_strategies, spans_space

__all__ = ["VaeFamily", "find_macros", "halo_convs", "is_vae_graph", "plan_vae"]


class VaeFamily(pricing.MacroPricing):
    """The VAE decode as a model family of `planner.engine`: its macros (`find_macros`, identical
    residual blocks sharing one group), their options priced by the op rules, the stream edges;
    its decisions and its plan."""

    subject = "the VAE decode"

    def __init__(self, graph: Graph, request: PlanRequest):
        preset, mesh = request.preset, request.mesh
        self.target = request.target
        self.halo = self.target.spatial_halo
        if preset not in PRESETS:
            raise PlanError(f"unknown VAE plan preset {preset!r}; choose one of {sorted(PRESETS)}")
        self.g, self.mesh, self.hw, self.vals = graph, mesh, request.hw, dict(request.values)
        self.preset, self.restricts = preset, (PRESETS[preset], dict(request.only))
        self.model = request.model or graph.model
        self.macros = find_macros(graph)
        self.macro_of = {x: m.name for m in self.macros for x in m.nodes}
        self.by_name = {m.name: m for m in self.macros}
        groups: dict[tuple, list[Macro]] = {}
        for m in self.macros:
            groups.setdefault(m.signature, []).append(m)
        self.group_of = {m.name: ms[0].name for ms in groups.values() for m in ms}
        self.members = {ms[0].name: ms for ms in groups.values()}

    def crossing(self, m: Macro) -> list[str]:
        return crossing(self.g, m)

    def evaluate(self, m: Macro, s: VaeStrategy) -> Evaluation:
        stream = {x: stream_layout(s.key, self.g[x].out) for x in self.crossing(m)}
        return self.evaluate_macro(m, params=s.params, stream=stream, forced=s.forced, halo=self.halo)

    def param_bytes(self, m: Macro, s: VaeStrategy) -> float:
        return self.macro_param_bytes(m, s.params)

    def reshard_seconds(self, tensor: str, k: tuple, l: tuple) -> float:
        meta = self.g[tensor].out
        return pricing.reshard_seconds(
            meta, stream_layout(k, meta), stream_layout(l, meta), self.mesh, self.hw, self.vals
        )

    def problem(self) -> engine.Problem:
        groups: list[Group] = []
        tables: dict[str, tuple[VaeStrategy, ...]] = {}
        excluded: dict = {}
        evals: dict[tuple[str, str], Evaluation] = {}
        for gname, members in self.members.items():
            rep = members[0]
            opts, why = macro_strategies(self.g, rep, self.mesh, self.crossing(rep), self.target)
            patterns = [self._pattern(r, rep) for r in self.restricts]
            kept, left = restrict(opts, patterns, f"restricted by preset {self.preset!r} / only")
            if not kept:
                wanted = [r.get(rep.name, r.get(rep.kind, r.get("*"))) for r in self.restricts]
                raise PlanError(
                    f"{rep.name} ({rep.kind}): no legal strategy matches preset {self.preset!r} and only="
                    f"{[w for w in wanted if w]!r}; legal: "
                    + ", ".join(s.name for s in opts)
                    + ("; excluded: " + "; ".join(f"{x.option}: {x.reason}" for x in dict.fromkeys(why)) if why else "")
                )
            options = []
            for s in kept:
                ev = evals[gname, s.name] = self.evaluate(rep, s)
                options.append(pricing.option(s.name, s.key, ev, self.param_bytes(rep, s) * len(members)))
            groups.append(Group(gname, tuple(options), len(members)))
            tables[gname], excluded[gname] = tuple(kept), tuple(why + left)
        hint = {g.name: next((i for i, o in enumerate(g.options) if o.key[0] == "hw"), 0) for g in groups}
        return engine.Problem(tuple(groups), tuple(self.edges(tables)), tables, excluded, evals, hint=hint)

    def _pattern(self, spec: Mapping[str, str], m: Macro) -> Optional[str]:
        """The regular expression `spec` (a preset, or ``only``) holds for macro `m`: by its name, else
        its kind, else ``*``; ``ALL`` stands for every mesh axis of size > 1 joined by ``+``."""
        pattern = spec.get(m.name, spec.get(m.kind, spec.get("*")))
        if pattern is None:
            return None
        axes = "+".join(a for a in self.mesh.axis_names if self.mesh.axis_size(a) > 1)
        return pattern.replace("ALL", re.escape(axes))

    def edges(self, tables: Mapping[str, tuple[VaeStrategy, ...]]) -> list[Edge]:
        """The stream edges between groups: the values one macro reads from another's group; a key
        change that is no `local_transition` is priced out (`FORBIDDEN_NS`)."""
        crossings: dict[tuple[str, str], list[str]] = {}
        for m in self.macros:
            dst = self.group_of[m.name]
            for x in self.crossing(m):
                src_macro = self.macro_of.get(x)
                if src_macro is None:
                    continue  # a graph input: laid out as the consuming macro wants (no collective)
                src = self.group_of[src_macro]
                if src != dst:
                    crossings.setdefault((src, dst), []).append(x)

        def price(tensors, k, l) -> int:
            if not local_transition(k, l):
                return FORBIDDEN_NS * len(tensors)
            return sum(to_ns(self.reshard_seconds(x, k, l)) for x in tensors)

        keys = {name: {s.key for s in table} for name, table in tables.items()}
        return stream_edges(crossings, keys, price)

    def advice(self, budget: float) -> tuple[str, tuple[str, ...]]:
        return ", use more devices, or decode chunked-T with a smaller t_chunk", ()

    def decisions(self, problem: engine.Problem, solution: engine.Solution) -> tuple[Decision, ...]:
        """One typed Decision per group (`planner.explain.explain_choices`): costs per decode; the stream
        of an option is the layout of the group's first input under its key."""

        def stream(g: Group, key: tuple) -> str:
            crossing = self.crossing(self.by_name[g.name])
            return stream_layout(key, self.g[crossing[0]].out).show(self.mesh) if crossing else ""

        members = {name: tuple(m.name for m in ms) for name, ms in self.members.items() if len(ms) > 1}
        return engine.explain(problem, solution, "decode", stream=stream, members=members)

    def assemble(self, problem: engine.Problem, solution: engine.Solution, decisions) -> Plan:
        return assemble(self, problem, solution, decisions)


def plan_vae(graph: Graph, mesh: MeshSpec, hardware: str | HardwareProfile | None = None, **fields) -> Plan:
    """Plan a captured Wan VAE decode graph.

    Args:
        graph: the captured full-T decode (or one chunk of a chunked-T decode).
        mesh, hardware: as `planner.plan_graph`; `fields` are `planner.request.PlanRequest`'s, of which the VAE
            reads memory_gb, values, time_limit_s (default 10 s), model, only, preset and target:
        only: macro name or kind (``resblock``, ``attention``, ``upsample``, ``shortcut``, ``head``,
            ``tail``, ``*`` for the rest) -> regular expression a strategy name must match
            (``ALL`` stands for every mesh axis of size > 1, joined by ``+``).
        preset: ``auto`` (the solver decides), ``spatial``, ``channel-megatron`` (the seed's hand
            plan), ``replicated``; a strategy must satisfy both the preset and `only`.
        target: the partitioner (`planner.targets`), recorded in the plan; for one that exchanges no
            conv halos (``tt-mlir``) a spatial split is priced with the halo the lowering writes into the
            program (`planner.rules.conv`, `wancompile.halo`), and offered only where every conv it
            splits has a same-size stride-1 window (otherwise excluded, with the reason in the decisions).

    Raises:
        PlanError: no plan fits the memory budget, or `only` leaves a macro without a legal strategy
            (the message lists why the wanted ones were excluded, e.g. an uneven spatial split).
    """
    return plan_request(graph, PlanRequest.make(mesh, hardware, **fields))


def plan_request(graph: Graph, request: PlanRequest) -> Plan:
    """The VAE decode plan for `graph` under `request`."""
    family = VaeFamily(graph, request)
    limit = request.time_limit_s if request.time_limit_s is not None else 10.0
    return engine.plan(family, request.budget_bytes, limit).with_(target=request.target.name)


def halo_convs(graph: Graph, plan: Plan) -> list[str]:
    """Locations of the convs `plan` splits on a spatial dim their window spans: the ones whose halo
    depends on the target (the partitioner's exchange, or the program's: `planner.targets.Target.spatial_halo`)."""
    out, at = [], graph.by_location()
    for a in plan.activations:
        node = at.get(a.location)
        if node is None or node.op not in ("conv3d", "conv2d") or a.input is not None or not spans_space(graph, node):
            continue
        kernel = graph[node.inputs[1]].out.shape[2:]
        if any(e is not None and k > 1 for e, k in zip(tuple(a.spec)[-len(kernel) :], kernel)):
            out.append(str(a.location))
    return list(dict.fromkeys(out))
