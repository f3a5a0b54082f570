"""A DiT plan evaluated over one forward by the op rules: `evaluate_forward`, and `price_plan`, its
prediction.

Prices any plan (a loaded plan.json, a preset's) under the ILP's cost model; `planner.calibration`
takes the `Forward` apart into the terms of its free factors.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping, Optional

from planner import pricing
from planner.collective import Collective
from planner.graph import Graph
from planner.hardware import HardwareProfile, get_profile
from planner.placements import Layout
from planner.plan import Plan, Predicted
from planner.plan_records import ActivationConstraint
from planner.propagate import Evaluation, evaluate
from planner.structure import Structure, dit_graph, family_of, find_structure


def price_plan(graph: Graph, plan: Plan, hardware: str | HardwareProfile, **how) -> Predicted:
    """Price any plan (a hand plan, a loaded plan.json) under the same cost model as the ILP; `how`:
    ``num_blocks``, ``weight_copies``, ``values`` as `evaluate_forward`'s."""
    return evaluate_forward(graph, plan, hardware, **how).predicted


@dataclass(frozen=True)
class Forward:
    """One forward of a plan, evaluated by the op rules: what `price_plan` sums and
    `planner.calibration` takes apart."""

    graph: Graph  # the planner graph the evaluations name
    # (prologue | the representative block under one block range's decisions | epilogue, times per forward)
    parts: tuple[tuple[Evaluation, int], ...]
    # every collective call: (the call, its calls per forward, the index in `parts` of the part making it)
    events: tuple[tuple[Collective, int, int], ...]
    weight_bytes: float  # per device, every block's parameters under its own specs

    @property
    def memory_bytes(self) -> float:
        """Per device: the weights and the activation estimate of the largest live set of any part
        (`planner.pricing.activation_bytes`). The planner's own prediction counts the blocks' and the
        embedders' live sets but not the rest of the prologue's and epilogue's (`dit_assemble`)."""
        return self.weight_bytes + max(pricing.activation_bytes(ev) for ev, _ in self.parts)

    @property
    def predicted(self) -> Predicted:
        compute = sum(ev.compute_seconds * times for ev, times in self.parts)
        comm = sum(e.seconds * times for e, times, _ in self.events)
        return Predicted(compute + comm, compute, comm, int(self.memory_bytes))


def evaluate_forward(
    graph: Graph,
    plan: Plan,
    hardware: str | HardwareProfile,
    *,
    num_blocks: Optional[int] = None,
    weight_copies: int = 1,
    values: Optional[Mapping[str, int]] = None,
) -> Forward:
    """The op rules over one forward of `graph` under `plan`: the prologue, the representative block
    once per run of blocks that share their decisions (`block_runs`: the blocks of an FSDP block range
    are priced with their own weight specs and pins, not block 0's) and the epilogue."""
    hw = hardware if isinstance(hardware, HardwareProfile) else get_profile(hardware)
    graph = dit_graph(graph)
    st = find_structure(graph)
    n = num_blocks or st.captured_blocks
    vals = dict(values or {})
    mesh = plan.mesh
    b0 = [x for x in graph if st.in_rep(graph, x) and x.op != "placeholder"]
    b0_names = {x.name for x in b0}
    pro = [graph[x] for x in st.prologue]
    blocks: list[tuple[Evaluation, int]] = []
    events: list[tuple[Collective, int, int]] = []
    for view, run in block_runs(graph, st, plan, n):
        forced, copies = view.constraint_layouts(graph)
        boundary = {p.name: (Layout.from_spec(view.params[p.param]),) for p in graph.params() if p.param in view.params}
        how = dict(forced=forced, forced_inputs=copies, values=vals)
        # the block as it follows the prologue (its collectives), then alone (its compute)
        ev_pre = evaluate(graph, pro + b0, mesh, hw, boundary=boundary, **how)
        outside = {k: v for k, v in {**ev_pre.layouts, **boundary}.items() if k not in b0_names}
        blocks.append((evaluate(graph, b0, mesh, hw, boundary=outside, **how), len(run)))
        events += [(e, len(run), len(blocks)) for e in ev_pre.events if graph.generic(e.where) != e.where]
        if 0 in run:
            ev_pro = evaluate(graph, pro, mesh, hw, boundary=boundary, **how)
            events += [(e, 1, 0) for e in ev_pre.events if graph.generic(e.where) == e.where]
        if n - 1 in run:  # the epilogue reads the last block's output
            tail = ({**ev_pre.layouts, **boundary}, ev_pre.layouts[st.block_output], how)
    outer, out_lay, how = tail
    epi_in = {}
    for x in st.epilogue:
        for i in graph[x].inputs:
            if graph[i].block is not None and graph[i].outputs and graph[i].out.shape == graph[st.entry].out.shape:
                epi_in[i] = out_lay
    ev_epi = evaluate(graph, [graph[x] for x in st.epilogue], mesh, hw, boundary={**outer, **epi_in}, **how)
    events += [(e, 1, len(blocks) + 1) for e in ev_epi.events]
    parts = ((ev_pro, 1), *blocks, (ev_epi, 1))
    weights = pricing.weight_bytes(graph, st, plan.params, mesh, vals, n, weight_copies)
    return Forward(graph, parts, tuple(events), weights)


def block_runs(graph: Graph, st: Structure, plan: Plan, num_blocks: int) -> list[tuple[Plan, tuple[int, ...]]]:
    """Blocks ``0 .. num_blocks - 1`` grouped by their decisions, in block order: (`plan` with the
    representative block's parameter specs and pins those of the group's blocks, the group's blocks).
    A block's decisions are the specs of its parameters and the pins at its ops (`Plan.params`,
    `Plan.activations` name every block); a block the plan does not name reads the representative's."""
    prefix = family_of(st.root)
    rep = [p for p in graph.params() if st.in_rep(graph, p)]
    common: list[ActivationConstraint] = []
    pins: dict[int, list[ActivationConstraint]] = {}
    for a in plan.activations:
        at = plan.block_of(a.location.module)
        if at is None or at[0] != prefix:
            common.append(a)
        else:  # read at the representative block's op
            loc = replace(a.location, module=st.root + at[2])
            pins.setdefault(at[1], []).append(replace(a, location=loc))
    own_rep = tuple(pins.get(int(st.root.rsplit(".", 1)[1]), ()))
    runs: dict[tuple, list[int]] = {}
    for k in range(num_blocks):
        specs = tuple(plan.params.get(graph.in_block(p, p.param, k), plan.params.get(p.param)) for p in rep)
        runs.setdefault((specs, tuple(pins[k]) if k in pins else own_rep), []).append(k)
    out = []
    for (specs, own), run in runs.items():
        params = {**plan.params, **{p.param: s for p, s in zip(rep, specs) if s is not None}}
        out.append((plan.with_(params=params, activations=(*common, *own)), tuple(run)))
    return out
