"""Sharding propagation: run the op rules over (part of) a graph and price what happens.

`evaluate` walks nodes in order with the layouts of their inputs; each op's rule (`planner.rules`)
says which input layouts it needs and what it produces. Where an actual layout differs from the
required one the engine inserts a redistribution and prices it with the cost model:

- an axis dropped from the minor end of a dim: all-gather (result bytes), grouped per dim;
- an axis moved from one dim to another: all-to-all (operand bytes);
- an axis added at the minor end of a dim: a local slice, free;
- partial sums dropped: all-reduce (operand bytes); dropped onto a dim the required layout splits
  over the same axes: reduce-scatter (operand bytes) — what XLA's GPU ``ReduceScatterCreator`` and
  tt-mlir's Shardy CCL canonicalisation make of GSPMD's all-reduce + dynamic-slice (the XLA CPU
  pipeline leaves the pair; `wancompile.hlo` reads it as the reduce-scatter it is);
- a dim whose axes change in another order (the same axes reordered, ``(model)`` -> ``(batch,
  model)``, ``(batch)`` -> ``(model)``, ...): the tiles live on other devices, and GSPMD moves them
  with a collective-permute (plus an all-gather when the split gets coarser), `_reshard_dim`.

Forced layouts (the plan's activation constraints, the strategies' choices) are applied after the
op that produces them, exactly as the lowering inserts ``mark_sharding`` after that op. The result
lists every collective with the node it belongs to (the plan's predicted collectives), per-device
compute seconds, peak per-device tensor bytes, guards, and warnings for ops without a rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Collection, Iterable, Mapping, Optional

from planner.collective import Collective
from planner.cost_model import collective_seconds, op_seconds, roofline_seconds
from planner.graph import Graph, Node, TensorMeta
from planner.hardware import HardwareProfile
from planner.mesh import MeshSpec
from planner.placements import Guard, Layout, as_number, local_shape, numel, shard_count
from planner.rules import OpView, rule_for
from planner.rules.pointwise import POINTWISE

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


def redistribute(
    meta: TensorMeta, actual: Layout, required: Layout, mesh: MeshSpec, target: Optional["Target"] = None
) -> list[tuple[str, tuple[str, ...], tuple]]:
    """Collectives (kind, axes, per-device shape in HLO convention) turning `actual` into `required`, as
    GSPMD compiles them; with a `target` whose slices of a split value move data
    (`Target.slice_split_by_all_to_all`: tt-mlir), the split a value gains while it is already split
    elsewhere is an all-to-all over the added axes, not a local slice."""
    out = _redistribute(meta, actual, required, mesh)
    if target is not None and target.slice_split_by_all_to_all and actual.axes:
        moved = {a for kind, axes, _ in out if kind in ("all-to-all", "reduce-scatter") for a in axes}
        added = tuple(a for a in mesh.axis_names if a in required.axes and a not in actual.axes and a not in moved)
        added = tuple(a for a in added if mesh.axis_size(a) > 1)
        if added:
            out.append(("all-to-all", added, local_shape(meta.shape, actual, mesh)))
    return out


def _redistribute(
    meta: TensorMeta, actual: Layout, required: Layout, mesh: MeshSpec
) -> list[tuple[str, tuple[str, ...], tuple]]:
    out: list[tuple[str, tuple[str, ...], tuple]] = []
    cur = actual
    if actual.partial and set(actual.partial) - set(required.partial):
        axes = tuple(a for a in actual.partial if a not in required.partial)
        have = {a for d in cur.dims for a in d}
        scatter = {d: tuple(a for a in want if a in axes and a not in have) for d, want in enumerate(required.dims)}
        scatter = {d: a for d, a in scatter.items() if a}
        reduced = tuple(a for a in axes if not any(a in s for s in scatter.values()))
        if reduced:
            out.append(("all-reduce", reduced, local_shape(meta.shape, cur, mesh)))
        for d, sc in scatter.items():
            # the partial sums land split on dim d: one reduce-scatter, not an all-reduce + slice
            out.append(("reduce-scatter", sc, local_shape(meta.shape, cur, mesh)))
            cur = cur.with_dim(d, tuple(a for a in required.dims[d] if a in cur.dims[d] or a in sc))
        cur = Layout(cur.dims, tuple(a for a in cur.partial if a in required.partial))
    src = {a: d for d, axes in enumerate(cur.dims) for a in axes}
    dst = {a: d for d, axes in enumerate(required.dims) for a in axes}
    moved = tuple(a for a in mesh.axis_names if a in src and a in dst and src[a] != dst[a])
    dropped = _gathered_first(cur, required, moved, mesh)
    if dropped:
        cur = Layout(tuple(tuple(a for a in axes if a not in dropped) for axes in cur.dims), cur.partial)
        out.append(("all-gather", dropped, local_shape(meta.shape, cur, mesh)))
    minor = _minor_factor_all_to_all(meta, cur, required, moved, mesh) if moved else None
    if minor is not None:
        out.extend(minor)
        cur = Layout(required.dims, cur.partial)
    elif moved:
        out.append(("all-to-all", moved, local_shape(meta.shape, cur, mesh)))
        dims = [tuple(a for a in axes if a not in moved) for axes in cur.dims]
        for a in moved:
            dims[dst[a]] = dims[dst[a]] + (a,)
        cur = Layout(tuple(dims), cur.partial)
    for d in range(cur.ndim):
        steps, cur = _reshard_dim(meta, cur, d, required.dims[d], mesh)
        out.extend(steps)
    return out


def sliced_first(meta: TensorMeta, actual: Layout, required: Layout, mesh: MeshSpec) -> tuple[str, ...]:
    """The axes GSPMD slices `actual` onto locally before any collective of the reshard to `required`
    (`redistribute`): all it adds where nothing else moves; the axes it is replicated over that the
    minor-factor all-to-all slices onto its destination dim first (`_minor_factor_all_to_all`); else
    none. An all-reduce of partial sums right before and that slice are one reduce-scatter."""
    if actual.partial:
        return ()
    added = tuple(a for a in mesh.axis_names if a in required.axes and a not in actual.axes and mesh.axis_size(a) > 1)
    if not added or not _redistribute(meta, actual, required, mesh):
        return added
    src = {a: d for d, axes in enumerate(actual.dims) for a in axes}
    dst = {a: d for d, axes in enumerate(required.dims) for a in axes}
    moved = tuple(a for a in mesh.axis_names if a in src and a in dst and src[a] != dst[a])
    if not moved or _gathered_first(actual, required, moved, mesh):
        return ()
    if _minor_factor_all_to_all(meta, actual, required, moved, mesh) is None:
        return ()
    return added


def _gathered_first(cur: Layout, required: Layout, moved: tuple[str, ...], mesh: MeshSpec) -> tuple[str, ...]:
    """The axes GSPMD all-gathers *before* an all-to-all that moves `moved` between dims: those the
    required layout drops (replicated there), each at the minor end of its dim, together fewer devices
    than the moved axes (measured on 2x4, tests/test_tight_budget_fidelity.py): tokens ``(batch)``,
    hidden ``(model)`` -> tokens ``(model)``: batch all-gathered off the tokens, then the all-to-all
    over model. With the dropped axes the larger (model dropped, batch moved) GSPMD permutes and
    gathers in other ways, not modelled: () there, as where nothing moves or the value is partial."""
    if not moved or cur.partial:
        return ()
    dropped = tuple(a for a in mesh.axis_names if a in cur.axes and a not in required.axes and mesh.axis_size(a) > 1)
    if not dropped or shard_count(mesh, dropped) >= shard_count(mesh, moved):
        return ()
    dims = [axes for axes in cur.dims if any(a in dropped for a in axes)]
    if len(dims) != 1 or set(dims[0][len(dims[0]) - len(dropped) :]) != set(dropped):
        return ()  # one all-gather of the minor end of one dim, or not this
    return dropped


def _minor_factor_all_to_all(
    meta: TensorMeta, cur: Layout, required: Layout, moved: tuple[str, ...], mesh: MeshSpec
) -> Optional[list[tuple[str, tuple[str, ...], tuple]]]:
    """GSPMD's all-to-all from dim s to dim d, where the plain one over the moved axes is not what it
    emits (measured on 2x4, tests/test_fidelity.py): it first slices the axes the value is replicated
    over onto d (free), then moves the *minor* factor of s's tiles that d lacks (its group: the devices
    that differ only there; an axis cut in part counts whole, its devices differ) and fixes the device
    order with one collective-permute of the result tiles. E.g. tokens ``(model, batch)`` -> ``(batch)``,
    hidden ``()`` -> ``(model)``: all-to-all over batch+model, then a permute; tokens ``(model)`` ->
    ``(batch)``, hidden -> ``(model)``: batch sliced onto hidden, all-to-all over model, a permute.
    None where the moved axes are the minor end of s and nothing is sliced first (the plain all-to-all,
    then `_reshard_dim`), or where more than that would be left."""
    sources = {d for d, axes in enumerate(cur.dims) if any(a in moved for a in axes)}
    targets = {d for d, axes in enumerate(required.dims) if any(a in moved for a in axes)}
    if len(sources) != 1 or len(targets) != 1 or cur.partial:
        return None
    s, d = sources.pop(), targets.pop()
    fresh = tuple(a for a in required.axes if a not in cur.axes and mesh.axis_size(a) > 1)
    if any(a in required.dims[s] for a in fresh) and s > d:
        return None  # measured: GSPMD moves the tiles first and slices after (the plain all-to-all)
    have = cur.dims[s]
    leaving = tuple(a for a in have if a in moved)
    if not fresh and have[len(have) - len(leaving) :] == leaving:
        return None
    start = cur.with_dim(d, cur.dims[d] + fresh)  # the free slice onto d
    counts = [shard_count(mesh, axes) for axes in start.dims]
    want = [shard_count(mesh, axes) for axes in required.dims]
    factor = counts[s] // want[s] if want[s] and counts[s] % want[s] == 0 else 0
    if factor <= 1 or counts[d] * factor != want[d]:
        return None
    if any(counts[i] != want[i] for i in range(len(counts)) if i not in (s, d)):
        return None
    group, size = [], 1
    for a in reversed(have):
        if size >= factor:
            break
        group.append(a)
        size *= mesh.axis_size(a)
    out = [("all-to-all", tuple(a for a in mesh.axis_names if a in group), local_shape(meta.shape, start, mesh))]
    cut = len(have) - len(group)
    if size == factor and start.with_dim(s, have[:cut]).with_dim(d, start.dims[d] + have[cut:]) == required:
        return out  # the moved tiles land in the required device order
    changed = {
        a for i in range(cur.ndim) if start.dims[i] != required.dims[i] for a in start.dims[i] + required.dims[i]
    }
    changed = tuple(a for a in mesh.axis_names if a in changed)
    return out + [("collective-permute", changed, local_shape(meta.shape, required, mesh))]


def _reshard_dim(meta: TensorMeta, cur: Layout, d: int, want: tuple[str, ...], mesh: MeshSpec):
    """One dim from ``cur.dims[d]`` (S) to `want` (D), as GSPMD reshards it (measured on 2x4 for every
    pair of (), (batch), (model), (batch, model), (model, batch); docs/planner.md). With P their
    common prefix: D = P + more is a local slice; S = P + more an all-gather of the rest. Otherwise
    the tiles a device needs sit on other devices: a finer (or as fine) D is a local slice plus one
    collective-permute of the D tiles; a coarser D is a collective-permute of the S tiles plus an
    all-gather over the axes of S not in D. Axes are named in mesh order, as the HLO's groups are.
    Returns (collectives, the layout with dim d = D)."""
    have = cur.dims[d]
    done = cur.with_dim(d, want)
    k = next((i for i, (a, b) in enumerate(zip(have, want)) if a != b), min(len(have), len(want)))
    if k == len(have):
        return [], done  # nothing, or a local slice

    def in_mesh_order(axes) -> tuple[str, ...]:
        return tuple(a for a in mesh.axis_names if a in axes)

    if k == len(want):
        return [("all-gather", in_mesh_order(have[k:]), local_shape(meta.shape, done, mesh))], done
    involved = in_mesh_order(have + want)
    if shard_count(mesh, want) % shard_count(mesh, have) == 0:
        return [("collective-permute", involved, local_shape(meta.shape, done, mesh))], done
    return [
        ("collective-permute", involved, local_shape(meta.shape, cur, mesh)),
        ("all-gather", in_mesh_order(tuple(a for a in have if a not in want)), local_shape(meta.shape, done, mesh)),
    ], done


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
            (the value's other readers keep its layout), as the lowering inserts it.
        values: example sizes for symbolic dims (costs need numbers; guards keep the symbols).
        target: reshards as this partitioner compiles them (`redistribute`), and no all-reduce read
            as a reduce-scatter where the target does not fuse the pair (``None``: GSPMD).
        halo: spatially split convs get their halo from the partitioner; False: from the program, as
            the lowering writes it for a target without (`planner.rules.conv`, `wancompile.halo`).
    """
    ev = Evaluation()
    ev.layouts.update(boundary)
    reduced: dict[str, int] = {}  # node -> index of the all-reduce of its partial sums in ev.events

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
            where, why = (
                str(graph[node.inputs[i]].location),
                f"activation constraint on {node.inputs[i]} read by {node.op}",
            )
            moves = redistribute(metas[i], have, want, mesh, target)
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
            moves = redistribute(node.out, outs[0], want, mesh, target)
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


_PASS_THROUGH = ("dropout", "contiguous", "clone")


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


def sliced_behind(graph: Graph, name: str, within: Optional[Callable[[str], bool]] = None) -> list[str]:
    """`name` and the values behind it through elementwise ops (`POINTWISE`) whose value only the
    next of them reads (and `within` accepts): all of them reach the program only through `name`,
    so where `name` is sliced the partitioned program computes just that slice of each (XLA moves the
    slice up through the elementwise fusion). An all-reduce of one of them, read only sliced, is a
    reduce-scatter."""
    out, todo = [name], [name]
    while todo:
        n = graph[todo.pop()]
        if n.op not in POINTWISE:
            continue
        for x in dict.fromkeys(n.inputs):
            if x not in out and len(graph.users(x)) == 1 and (within is None or within(x)):
                out.append(x)
                todo.append(x)
    return out


def reduced_through(graph: Graph, name: str, stop: Collection[str] = ()) -> list[str]:
    """`name` and the values behind it through pass-throughs (dropout, clone, ...) that each have one
    reader, up to the op that made them (or one in `stop`), that op last: where an all-reduce of that
    op's partial sums meets a slice of `name`, the partitioner's pair is one reduce-scatter."""
    chain = [name]
    src = graph[name]
    while src.op in _PASS_THROUGH and src.name not in stop and len(graph.users(src.name)) == 1:
        src = graph[src.inputs[0]]
        chain.append(src.name)
    return chain


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
