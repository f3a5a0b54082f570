"""GSPMD's reshard model: the collectives that turn one layout of a value into another.

`redistribute` is what the partitioner emits where an actual layout differs from the required one
(`planner.propagate.evaluate` prices it, the assemblers read it for stream edges):

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

Shardy (inside tt-mlir) reshards in fewer ways: `permutes` says where its reshard needs a
collective-permute, which tt-mlir does not lower (tt-mlir #3370), and `route` finds the layouts to go
through instead (every step one tt-mlir lowers); `redistribute` with such a target prices the route.

Where an all-reduce and a later slice of its value are one reduce-scatter: `sliced_first` (the axes
a reshard slices onto before any collective), `sliced_behind` (values only an elementwise chain to a
sliced value reads), `reduced_through` (the pass-throughs back to the reducing op).

Why one module of ~400 lines: GSPMD's model and Shardy's route are one recursion — `redistribute` for a
target that permutes takes the `route`, and `route` prices each step with `redistribute`'s own rules — so
two modules would import each other; the reduce-scatter walks are the same model's partial-sum case.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Callable, Collection, Optional

from planner.graph import Graph, TensorMeta
from planner.mesh import MeshSpec
from planner.placements import Layout, as_number, local_shape, numel, shard_count
from planner.rules.pointwise import POINTWISE

if TYPE_CHECKING:
    from planner.targets import Target


def redistribute(
    meta: TensorMeta,
    actual: Layout,
    required: Layout,
    mesh: MeshSpec,
    target: Optional["Target"] = None,
    reduced: bool = False,
) -> list[tuple[str, tuple[str, ...], tuple]]:
    """Collectives (kind, axes, per-device shape in HLO convention) turning `actual` into `required`, as
    GSPMD compiles them; with a `target` whose slices of a split value move data
    (`Target.slice_split_by_all_to_all`: tt-mlir), the split a value gains while it is already split
    elsewhere is an all-to-all over the added axes, not a local slice; with a target that lowers no
    collective-permute (`Target.unlowerable`), a reshard Shardy would make one (`permutes`) goes through
    the layouts `route` picks, each step priced as the target compiles it. `reduced`: `actual` is the
    all-reduced value of the op that makes it, which the partitioners reshard by the plain path (no
    minor-factor all-to-all, `_minor_factor_all_to_all`; seen on 8x4: tokens ``(batch)`` -> tokens
    ``(model)``, hidden ``(batch)`` right after a row-parallel linear's all-reduce over ``model``)."""
    if target is not None and "collective-permute" in target.unlowerable:
        vias = route(meta, actual, required, mesh, target)
        if vias:
            steps = (actual, *vias, required)
            return [c for a, b in zip(steps, steps[1:]) for c in _on_target(meta, a, b, mesh, target, reduced)]
    return _on_target(meta, actual, required, mesh, target, reduced)


def _on_target(
    meta: TensorMeta,
    actual: Layout,
    required: Layout,
    mesh: MeshSpec,
    target: Optional["Target"],
    reduced: bool = False,
) -> list[tuple[str, tuple[str, ...], tuple]]:
    out = _redistribute(meta, actual, required, mesh, reduced)
    if target is not None and target.slice_split_by_all_to_all and actual.axes:
        moved = {a for kind, axes, _ in out if kind in ("all-to-all", "reduce-scatter") for a in axes}
        added = tuple(a for a in mesh.axis_names if a in required.axes and a not in actual.axes and a not in moved)
        added = tuple(a for a in added if mesh.axis_size(a) > 1)
        if added:
            out.append(("all-to-all", added, local_shape(meta.shape, actual, mesh)))
    return out


def _redistribute(
    meta: TensorMeta, actual: Layout, required: Layout, mesh: MeshSpec, reduced: bool = False
) -> list[tuple[str, tuple[str, ...], tuple]]:
    out: list[tuple[str, tuple[str, ...], tuple]] = []
    cur = actual
    if actual.partial and set(actual.partial) - set(required.partial):
        axes = tuple(a for a in actual.partial if a not in required.partial)
        have = {a for d in cur.dims for a in d}
        scatter = {d: tuple(a for a in want if a in axes and a not in have) for d, want in enumerate(required.dims)}
        # a scatter lands at the minor end of what the dim keeps; where the dim also changes its other axes
        # both partitioners all-reduce and reshard after (seen on 8x4: tokens (batch) + partial (model) ->
        # tokens (model), hidden (batch))
        scatter = {d: a for d, a in scatter.items() if a and required.dims[d][: len(cur.dims[d])] == cur.dims[d]}
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
    minor = _minor_factor_all_to_all(meta, cur, required, moved, mesh) if moved and not reduced else None
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


def permutes(actual: Layout, required: Layout, mesh: MeshSpec) -> bool:
    """Whether Shardy's reshard of `actual` into `required` needs a collective-permute: its tiles would
    land on other devices than gathers, slices and all-to-alls put them. Measured on tt-mlir with one-op
    modules (every pair of layouts of a rank-3 value over a 2x4 mesh: 0 of 110 mispredicted;
    tests/test_tt_reshards.py), per dim, with `kept` the axes it has before and after:

    - `kept` is the common prefix of both (an axis that stays stays major, in its order);
    - the dim either loses axes (gathered, or moved to another dim) or gains them (sliced, or moved in),
      not both: ``(model)`` -> ``(batch)`` on one dim, or tokens and hidden swapping their axes, permutes;
    - of the axes it loses, those moving to another dim are the minor ones (an all-to-all moves the minor
      end; ``(batch, model)`` -> hidden ``(batch)`` permutes);
    - axes moving together from one dim to another keep their order.
    """
    if actual.partial or actual.ndim != required.ndim:
        return False
    big = {a for a in mesh.axis_names if mesh.axis_size(a) > 1}
    src = [tuple(a for a in axes if a in big) for axes in actual.dims]
    dst = [tuple(a for a in axes if a in big) for axes in required.dims]
    to = {a: d for d, axes in enumerate(dst) for a in axes}
    frm = {a: d for d, axes in enumerate(src) for a in axes}
    for d, (have, want) in enumerate(zip(src, dst)):
        kept = tuple(a for a in have if a in want)
        k = len(kept)
        if have[:k] != kept or want[:k] != kept:
            return True
        leaving, arriving = have[k:], want[k:]
        if leaving and arriving:
            return True
        moving = [a in to for a in leaving]
        if moving != sorted(moving):
            return True
        for e in range(len(dst)):
            if e != d and [a for a in have if to.get(a) == e] != [a for a in dst[e] if frm.get(a) == d]:
                return True
    return False


@functools.lru_cache(maxsize=65536)
def route(
    meta: TensorMeta, actual: Layout, required: Layout, mesh: MeshSpec, target: Optional["Target"] = None
) -> tuple[Layout, ...]:
    """The layouts to reshard through so that no step `permutes` (none where the direct reshard does
    not): the cheapest path over the value's layouts with its dims split evenly, each step priced by
    the bytes its collectives move per device as `target` compiles them (an all-reduce twice), fewer
    steps first on a tie; every step one the target compiles as predicted (`_direct`).
    E.g. tokens ``(batch)``, hidden ``(model)`` -> tokens ``(model)``, hidden ``(batch)`` (an axis
    swap): hidden gathered, ``model`` moved onto the tokens, ``batch`` sliced onto hidden."""
    if _direct(meta, actual, required, mesh, target):
        return ()
    return _route(meta, actual, required, mesh, target)


@functools.lru_cache(maxsize=65536)
def _direct(meta: TensorMeta, actual: Layout, required: Layout, mesh: MeshSpec, target: Optional["Target"]) -> bool:
    """Whether `target` compiles the reshard as `redistribute` predicts it: Shardy does not permute, and
    GSPMD's model of it holds no collective-permute (measured: where Shardy lowers such a reshard, it
    does it its own way, e.g. tokens ``(batch)`` -> hidden ``(batch, model)`` with two all-to-alls over
    ``model``)."""
    if permutes(actual, required, mesh):
        return False
    return actual.partial or all(
        k != "collective-permute" for k, _, _ in _on_target(meta, actual, required, mesh, target)
    )


def _route(
    meta: TensorMeta, actual: Layout, required: Layout, mesh: MeshSpec, target: Optional["Target"]
) -> tuple[Layout, ...]:
    import heapq

    nodes = _layouts(meta, mesh, actual.partial)
    total = max(as_number(numel(meta.shape), {}) if _numeric(meta.shape) else 1.0, 1.0)

    def cost(a: Layout, b: Layout) -> float:
        moved = 0.0
        for kind, _, shape in _on_target(meta, a, b, mesh, target):
            frac = as_number(numel(shape), {}) / total if _numeric(shape) else 1.0
            moved += frac * (2 if kind == "all-reduce" else 1)
        return moved

    best = {actual: (0.0, 0)}
    prev: dict[Layout, Layout] = {}
    heap = [(0.0, 0, 0, actual)]
    order = {lay: i for i, lay in enumerate(nodes)}
    while heap:
        c, hops, _, lay = heapq.heappop(heap)
        if lay == required:
            break
        if (c, hops) > best.get(lay, (float("inf"), 0)):
            continue
        for nxt in nodes:
            if nxt == lay or not _direct(meta, lay, nxt, mesh, target):
                continue
            step = (c + cost(lay, nxt), hops + 1)
            if step < best.get(nxt, (float("inf"), 0)):
                best[nxt] = step
                prev[nxt] = lay
                heapq.heappush(heap, (*step, order.get(nxt, -1), nxt))
    if required not in prev:
        return ()  # no lowerable path: the direct reshard stands (and tt-mlir will say so)
    path, lay = [], prev[required]
    while lay != actual:
        path.append(lay)
        lay = prev[lay]
    return tuple(reversed(path))


def _numeric(shape) -> bool:
    return all(isinstance(n, int) for n in shape)


def _layouts(meta: TensorMeta, mesh: MeshSpec, partial: tuple[str, ...] = ()) -> list[Layout]:
    """Every layout of `meta` over the mesh's axes of size > 1 (each axis on at most one dim, in either
    order where two share one) whose split dims divide evenly."""
    import itertools

    axes = [a for a in mesh.axis_names if mesh.axis_size(a) > 1]
    out: list[Layout] = []
    for places in itertools.product(range(-1, len(meta.shape)), repeat=len(axes)):
        groups: dict[int, list[str]] = {}
        for a, d in zip(axes, places):
            if d >= 0:
                groups.setdefault(d, []).append(a)
        for orders in itertools.product(*(itertools.permutations(g) for g in groups.values())):
            dims = [()] * len(meta.shape)
            for d, o in zip(groups, orders):
                dims[d] = tuple(o)
            n_ok = all(not isinstance(n, int) or n % shard_count(mesh, dims[d]) == 0 for d, n in enumerate(meta.shape))
            if n_ok:
                out.append(Layout(tuple(dims), partial))
    return out


def sliced_first(
    meta: TensorMeta, actual: Layout, required: Layout, mesh: MeshSpec, reduced: bool = False
) -> tuple[str, ...]:
    """The axes GSPMD slices `actual` onto locally before any collective of the reshard to `required`
    (`redistribute`): all it adds where nothing else moves; the axes it is replicated over that the
    minor-factor all-to-all slices onto its destination dim first (`_minor_factor_all_to_all`); else
    none. An all-reduce of partial sums right before and that slice are one reduce-scatter. `reduced`:
    as `redistribute`'s (the plain path: a pure slice only)."""
    if actual.partial:
        return ()
    added = tuple(a for a in mesh.axis_names if a in required.axes and a not in actual.axes and mesh.axis_size(a) > 1)
    if not added or not _redistribute(meta, actual, required, mesh):
        return added
    src = {a: d for d, axes in enumerate(actual.dims) for a in axes}
    dst = {a: d for d, axes in enumerate(required.dims) for a in axes}
    moved = tuple(a for a in mesh.axis_names if a in src and a in dst and src[a] != dst[a])
    if reduced or not moved or _gathered_first(actual, required, moved, mesh):
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


_PASS_THROUGH = ("dropout", "contiguous", "clone")


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
