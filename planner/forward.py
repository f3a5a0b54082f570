"""A DiT plan evaluated over one forward by the op rules: `evaluate_forward`, and `price_plan`, its
prediction.

Prices any plan (a loaded plan.json, a preset's) under the ILP's cost model; `planner.calibration`
takes the `Forward` apart into the terms of its free factors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

from planner import pricing
from planner.collective import Collective
from planner.graph import Graph
from planner.hardware import HardwareProfile, get_profile
from planner.placements import Layout
from planner.plan import (
    Plan,
    Predicted,
)
from planner.propagate import Evaluation, evaluate
from planner.structure import dit_graph, find_structure


def price_plan(graph: Graph, plan: Plan, hardware: str | HardwareProfile, **how) -> Predicted:
    """Price any plan (a hand plan, a loaded plan.json) under the same cost model as the ILP; `how`:
    ``num_blocks``, ``weight_copies``, ``values`` as `evaluate_forward`'s."""
    return evaluate_forward(graph, plan, hardware, **how).predicted


@dataclass(frozen=True)
class Forward:
    """One forward of a plan, evaluated by the op rules: what `price_plan` sums and
    `planner.calibration` takes apart."""

    graph: Graph  # the planner graph the evaluations name
    parts: tuple[tuple[Evaluation, int], ...]  # (prologue | one block | epilogue, times per forward)
    events: tuple[tuple[Collective, int], ...]  # every collective call, with its calls per forward
    memory_bytes: float

    @property
    def predicted(self) -> Predicted:
        compute = sum(ev.compute_seconds * times for ev, times in self.parts)
        comm = sum(e.seconds * times for e, times in self.events)
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
    """The op rules over one forward of `graph` under `plan`: the prologue, block 0 (standing for
    all `num_blocks`) and the epilogue."""
    hw = hardware if isinstance(hardware, HardwareProfile) else get_profile(hardware)
    graph = dit_graph(graph)
    st = find_structure(graph)
    n = num_blocks or st.captured_blocks
    vals = dict(values or {})
    mesh = plan.mesh
    forced, copies = plan.constraint_layouts(graph)
    boundary = {p.name: (Layout.from_spec(plan.params[p.param]),) for p in graph.params() if p.param in plan.params}
    b0 = [x for x in graph if st.in_rep(graph, x) and x.op != "placeholder"]
    pro = [graph[x] for x in st.prologue]
    epi_in = {}
    ev_pre = evaluate(graph, pro + b0, mesh, hw, boundary=boundary, forced=forced, forced_inputs=copies, values=vals)
    out_lay = ev_pre.layouts[st.block_output]
    for x in st.epilogue:
        for i in graph[x].inputs:
            if graph[i].block is not None and graph[i].outputs and graph[i].out.shape == graph[st.entry].out.shape:
                epi_in[i] = out_lay
    ev_epi = evaluate(
        graph,
        [graph[x] for x in st.epilogue],
        mesh,
        hw,
        boundary={**ev_pre.layouts, **boundary, **epi_in},
        forced=forced,
        forced_inputs=copies,
        values=vals,
    )
    b0_names = {x.name for x in b0}
    events = [(e, 1) for e in ev_epi.events]
    events += [(e, n if graph.generic(e.where) != e.where else 1) for e in ev_pre.events]
    ev_blk = evaluate(
        graph,
        b0,
        mesh,
        hw,
        boundary={k: v for k, v in {**ev_pre.layouts, **boundary}.items() if k not in b0_names},
        forced=forced,
        forced_inputs=copies,
        values=vals,
    )
    ev_pro = evaluate(graph, pro, mesh, hw, boundary=boundary, forced=forced, forced_inputs=copies, values=vals)
    memory = pricing.weight_bytes(graph, st, plan.params, mesh, vals, n, weight_copies)
    memory += pricing.ACTIVATION_FACTOR * max(ev_blk.peak_bytes, ev_pro.peak_bytes, ev_epi.peak_bytes)
    return Forward(graph, ((ev_pro, 1), (ev_blk, n), (ev_epi, 1)), tuple(events), memory)
