"""Sharding propagation: run the op rules over (part of) a graph and price what happens.

`evaluate` walks nodes in order with the layouts of their inputs; each op's rule (`planner.rules`)
says which input layouts it needs and what it produces. Where an actual layout differs from the
required one the engine inserts a redistribution (`planner.reshard.redistribute`: the collectives
GSPMD emits, re-exported here with the reshard helpers) and prices it with the cost model; an
all-reduce whose value the next op slices over the same axes becomes a reduce-scatter
(`_scatter_reduction`).

Forced layouts (the plan's activation constraints, the strategies' choices) are applied after the
op that produces them, exactly as the lowering inserts ``mark_sharding`` after that op. The result
lists every collective with the node it belongs to (the plan's predicted collectives), per-device
compute seconds, peak per-device tensor bytes, guards, and warnings for ops without a rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Iterable, Mapping, Optional

from planner.collective import Collective
from planner.cost_model import collective_seconds, op_seconds, roofline_seconds
from planner.graph import Graph, Node, TensorMeta
from planner.hardware import HardwareProfile
from planner.mesh import MeshSpec
from planner.placements import Guard, Layout, as_number, local_shape, numel
from planner.reshard import redistribute, reduced_through, sliced_behind, sliced_first
from planner.rules import OpView, rule_for

__all__ = ["Evaluation", "Layouts", "evaluate", "reduced_through", "redistribute", "sliced_behind", "sliced_first"]

if TYPE_CHECKING:
    from planner.targets import Target

Layouts = tuple[Layout, ...]


@dataclass
class Evaluation:
    layouts: dict[str, Layouts] = field(default_factory=dict)
    events: list[Collective] = field(default_factory=list)  # one per call (count 1), with reason and seconds
    compute_seconds: float = 0.0
    flops: float = 0.0
    bytes: float = 0.0  # per-device bytes the ops read and write (the roofline's memory term)
    peak_bytes: float = 0.0
    kernels: int = 0  # ops that launch a kernel (each pays the launch floor and the per-op overhead)
    roofline_seconds: float = 0.0  # the ops' rooflines at the profile's peak (`cost_model.roofline_seconds`)
    per_op: dict[str, tuple[float, bool]] = field(default_factory=dict)  # node -> (its roofline, a kernel?)
    warnings: list[str] = field(default_factory=list)
    guards: list[Guard] = field(default_factory=list)
    # node -> the layout its op produces where a forced layout then reshards it (the op computes in
    # this layout; the constraint's collectives come after it): what `planner.pins` pins first
    unforced: dict[str, Layout] = field(default_factory=dict)
    # the nodes from a reduction to the op that slices its result, where the pair is one reduce-scatter
    # (the reduced op, the pass-throughs, the slicing op): `planner.pins` leaves them open
    scattered: set[str] = field(default_factory=set)
    # (node, input index) -> the layout the op's rule reads that input in, where it differs from the
    # input's own (the reshard before the op): what `planner.pins` pins for parameters
    required: dict[tuple[str, int], Layout] = field(default_factory=dict)

    @property
    def comm_seconds(self) -> float:
        return sum(e.seconds for e in self.events)

    @property
    def seconds(self) -> float:
        return self.compute_seconds + self.comm_seconds


def _bytes(shape: tuple, itemsize: int, values: Optional[Mapping[str, int]]) -> int:
    return int(as_number(numel(shape), dict(values or {})) * itemsize)


def evaluate(
    graph: Graph,
    nodes: Iterable[Node],
    mesh: MeshSpec,
    hw: HardwareProfile,
    *,
    boundary: Mapping[str, Layouts],
    forced: Mapping[str, Layout] = {},
    forced_inputs: Mapping[tuple[str, int], Layout] = {},
    values: Optional[Mapping[str, int]] = None,
    target: Optional["Target"] = None,
    halo: bool = True,
) -> Evaluation:
    """Propagate layouts through `nodes` (in graph order).

    Args:
        boundary: layouts of values produced outside `nodes` (parameters, segment inputs); any
            other outside value is taken as replicated.
        forced: node name -> layout its (first) output is constrained to after the op.
        forced_inputs: (node name, input index) -> layout of the copy of that input the node reads
            (the value's other readers keep its layout), as the lowering inserts it: one copy, and one
            reshard, for every reader of a value in one layout.
        values: example sizes for symbolic dims (costs need numbers; guards keep the symbols).
        target: reshards as this partitioner compiles them (`redistribute`), and no all-reduce read
            as a reduce-scatter where the target does not fuse the pair (``None``: GSPMD).
        halo: spatially split convs get their halo from the partitioner; False: from the program, as
            the lowering writes it for a target without (`planner.rules.conv`, `wancompile.halo`).
    """
    ev = Evaluation()
    ev.layouts.update(boundary)
    reduced: dict[str, int] = {}  # node -> index of the all-reduce of its partial sums in ev.events
    copied: set[tuple[str, Layout]] = set()  # (value, layout) of the input copies made so far

    def charge(kind: str, axes: tuple[str, ...], shape: tuple, itemsize: int, where: str, reason: str) -> None:
        nbytes = _bytes(shape, itemsize, values)
        seconds = collective_seconds(kind, nbytes, axes, mesh, hw)
        ev.events.append(Collective(kind, axes, nbytes, where=where, reason=reason, seconds=seconds))

    for node in nodes:
        if node.op in ("placeholder", "output") or node.name in boundary:
            if node.op == "placeholder" and node.name not in ev.layouts:
                ev.layouts[node.name] = tuple(Layout.replicated(len(m.shape)) for m in node.outputs)
            continue
        if not node.outputs:
            continue  # integer/size arithmetic on symbolic dims (dynamic=True): nothing to shard
        ins, metas = _inputs(graph, node, ev)
        for i, have in enumerate(ins):
            want = forced_inputs.get((node.name, i))
            if want is None or have is None:
                continue
            if (node.inputs[i], want) in copied:  # readers of one value in one layout share the lowering's copy
                ins[i] = want
                continue
            copied.add((node.inputs[i], want))
            where, why = (
                str(graph[node.inputs[i]].location),
                f"activation constraint on {node.inputs[i]} read by {node.op}",
            )
            moves = redistribute(metas[i], have, want, mesh, target, _reduced(graph, node.inputs[i], reduced))
            if not moves:  # a slice of the copy: a reduction right before it and the slice are one reduce-scatter
                held = forced if target is not None and not target.fuses_across_constraints else None
                added = set(want.axes) - set(have.axes)
                _scatter_reduction(graph, node, added, reduced, ev, mesh, hw, held, read=node.inputs[i])
            for kind, axes, shape in moves:
                charge(kind, axes, shape, metas[i].itemsize, where, why)
            ins[i] = want
        idx = graph.picks(node)
        if idx is not None and ins and metas:
            src = graph[node.inputs[0]]
            have = ev.layouts[src.name][idx] if src.name in ev.layouts else Layout.replicated(len(node.out.shape))
            want = forced.get(node.name)  # a constraint on output idx of the tuple-valued op
            if want is not None and want != have:
                ev.unforced[node.name] = have
            if want is not None:
                for kind, axes, shape in redistribute(node.out, have, want, mesh, target):
                    charge(kind, axes, shape, node.out.itemsize, str(src.location), "activation constraint")
            ev.layouts[node.name] = (want or have,)
            continue
        fn, known = rule_for(node.op)
        if not known:
            ev.warnings.append(
                f"{node.location}: no sharding rule for op {node.op!r}; planned replicated (all inputs gathered)"
            )
        view = OpView(node, ins, metas, mesh, wanted=forced.get(node.name), halo=halo)
        res = fn(view)
        ev.guards.extend(res.guards)
        for i, (have, want) in enumerate(zip(ins, res.required)):
            if have is None or want is None or have == want:
                continue
            ev.required[node.name, i] = want
            for kind, axes, shape in redistribute(metas[i], have, want, mesh, target):
                charge(kind, axes, shape, metas[i].itemsize, str(node.location), f"{node.inputs[i]} for {node.op}")
        for c in res.comm:
            if c.kind == "all-reduce":
                reduced[node.name] = len(ev.events)
            charge(c.kind, c.axes, c.shape, c.itemsize, str(node.location), c.reason)
        outs = res.outputs
        if node.name in forced and outs:
            want = forced[node.name]
            moves = redistribute(node.out, outs[0], want, mesh, target, node.name in reduced)
            if want != outs[0]:
                ev.unforced[node.name] = outs[0]
            if not moves:
                held = forced if target is not None and not target.fuses_across_constraints else None
                _scatter_reduction(graph, node, set(want.axes) - set(outs[0].axes), reduced, ev, mesh, hw, held)
            for kind, axes, shape in moves:
                charge(kind, axes, shape, node.out.itemsize, str(node.location), "activation constraint")
            outs = (want,) + tuple(outs[1:])
        ev.layouts[node.name] = outs
        flops = as_number(res.flops, dict(values or {}))
        nbytes = as_number(res.bytes, dict(values or {}))
        kernel = res.kernel
        if not kernel and not hw.fuses_glue and (flops or nbytes):
            # one kernel per op (TTNN): the glue op reads its inputs back from DRAM
            kernel = True
            nbytes += sum(
                as_number(numel(local_shape(m.shape, lay, mesh)), dict(values or {})) * m.itemsize
                for m, have, want in zip(metas, ins, res.required)
                if m is not None and (lay := want or have) is not None
            )
        ev.flops += flops
        ev.bytes += nbytes
        ev.kernels += kernel
        ev.roofline_seconds += roofline_seconds(flops, nbytes, hw)
        ev.per_op[node.name] = (roofline_seconds(flops, nbytes, hw), bool(kernel))
        ev.compute_seconds += op_seconds(flops, nbytes, kernel, hw)
        live = sum(
            as_number(numel(local_shape(m.shape, lay, mesh)), dict(values or {})) * m.itemsize
            for m, lay in zip(node.outputs, outs)
        )
        ev.peak_bytes = max(
            ev.peak_bytes,
            live
            + sum(
                as_number(numel(local_shape(m.shape, lay, mesh)), dict(values or {})) * m.itemsize
                for m, have, want in zip(metas, ins, res.required)
                if m is not None and (lay := want or have) is not None
            ),
        )
    return ev


def _reduced(graph, name: str, reduced: dict) -> bool:
    """Whether `name` is (past pass-throughs) the all-reduced output of the op that made it."""
    return reduced_through(graph, name, stop=reduced)[-1] in reduced


def _scatter_reduction(
    graph, node, added: set, reduced: dict, ev: Evaluation, mesh, hw, held=None, read: Optional[str] = None
) -> None:
    """An all-reduce whose value's only consumer (past pass-throughs) is sliced over the same axes
    right after is a reduce-scatter: GSPMD emits the pair, the compilers fuse it (`redistribute`).
    The slice is `node`'s output constraint or, with `read`, the constrained copy through which `node`
    reads that input (`ActivationConstraint.input`; `node`'s own output is then no part of the pair).
    `held`: constrained nodes that keep the reduced value whole in between, which a target that does not
    fuse across a constraint (tt-mlir) compiles as the all-reduce then the slice."""
    if not added:
        return
    for name in node.inputs if read is None else (read,):
        chain = reduced_through(graph, name, stop=reduced)
        src = graph[chain.pop()]
        i = reduced.get(src.name)
        if i is None or set(ev.events[i].axes) != added or len(graph.users(src.name)) != 1:
            continue
        if held is not None and any(x in held for x in [*chain, src.name]):
            return
        ev.scattered.update([*chain, src.name] + ([node.name] if read is None else []))
        e = ev.events[i]
        ev.events[i] = replace(
            e,
            kind="reduce-scatter",
            reason=e.reason + ", sliced by the next op",
            seconds=collective_seconds("reduce-scatter", e.bytes, e.axes, mesh, hw),
        )
        del reduced[src.name]
        return
    if read is None and held is None:
        # behind elementwise ops only this output reads (an FFN's row-parallel output, gated, added
        # to the residual, constrained after): the slice moves up to the all-reduce (GSPMD + XLA)
        for x in sliced_behind(graph, node.name)[1:]:
            i = reduced.get(x)
            if i is not None and set(ev.events[i].axes) == added:
                ev.events[i] = replace(
                    ev.events[i],
                    kind="reduce-scatter",
                    reason=ev.events[i].reason + ", sliced after elementwise ops",
                    seconds=collective_seconds("reduce-scatter", ev.events[i].bytes, ev.events[i].axes, mesh, hw),
                )
                del reduced[x]
                return


def _inputs(graph: Graph, node: Node, ev: Evaluation) -> tuple[list[Optional[Layout]], list[Optional[TensorMeta]]]:
    ins: list[Optional[Layout]] = []
    metas: list[Optional[TensorMeta]] = []
    for name in node.inputs:
        src = graph[name]
        lays = ev.layouts.get(name)
        if not src.outputs:
            ins.append(None)
            metas.append(None)
            continue
        if lays is None:
            lays = tuple(Layout.replicated(len(m.shape)) for m in src.outputs)
        ins.append(lays[0] if lays else None)
        metas.append(src.outputs[0])
    return ins, metas
