"""Explicit halos: a spatially split convolution written so that no partitioner has to exchange one.

Shardy (inside tt-mlir) treats a convolution's spatial dims as pass-through: split H over 4 chips and
each chip convolves its own rows padded with zeros where its neighbours' rows belong (tt-mlir #8216),
and Shardy's own collective-permute has no lowering (tt-mlir #3370). For a target like that
(`planner.targets.Target.spatial_halo` False) the lowering writes the halo into the program, per
split spatial dim d (n tiles of s rows, padding p = (k - 1) // 2, stride 1), in ops every partitioner
compiles the same way:

1. ``x.reshape(L, n, s, ...)``: the tiles as a dim of their own (L: the dims before d, merged);
2. each tile's first and last p rows, **all-gathered** (the only collective: 2p rows per tile, gathered
   over every split axis, so that the step back is a slice of a replicated value, which tt-mlir
   compiles as a local ``ttnn.mesh_partition``; a slice of a value split elsewhere would be an
   all-to-all there);
3. shifted by one tile (zeros past the edges) and sliced back to the tiles' layout: each tile's halo
   rows from its neighbours;
4. ``cat([top, tiles, bottom])`` and the tile dim moved into the batch: ``(n * B, ..., s + 2p, ...)``;

then the convolution runs with padding 0 on the haloed dims (every tile is now a batch element: no
partitioner needs a neighbour), and the output's tile dims move back, last dim first. A 2-D split
does H, then W on the H-haloed tensor, so the corners travel with the W halo. Every intermediate is
pinned (`mark`): on a pinned target nothing is left for the partitioner to choose. Values stay at
rank <= 5 (torch_xla refuses annotations of more: `planner.pins.MAX_PINNED_RANK`).

The collectives (one all-gather per split spatial dim, over every split axis) and the extra copies
are what `planner/rules/conv.py` prices for such a target. No torch_xla import: `mark(tensor, spec)`
is the lowering's.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import torch

from planner.mesh import AxisEntry, PartitionSpec, entry_axes, normalize_spec
from planner.rules.conv import explicit_halo_ok

Mark = Callable[[torch.Tensor, PartitionSpec], None]


def _ntuple(v, n: int) -> tuple[int, ...]:
    return tuple(int(x) for x in v) if isinstance(v, (list, tuple)) else (int(v),) * n


def _join(*entries: AxisEntry) -> AxisEntry:
    axes = tuple(a for e in entries for a in entry_axes(e))
    return None if not axes else axes[0] if len(axes) == 1 else axes


def haloed_dims(weight_shape: Sequence[int], spec: PartitionSpec, stride, padding, dilation) -> list[int]:
    """Spatial dims (offsets from 2) of a conv with output layout `spec` whose window needs neighbours'
    rows: split, with a kernel over 1. Raises ValueError for one this module cannot halo (stride or
    dilation over 1, or padding other than (k - 1) // 2 on the split dim)."""
    nsp = len(weight_shape) - 2
    kernel = tuple(int(k) for k in weight_shape[2:])
    stride, padding, dilation = (_ntuple(v, nsp) for v in (stride, padding, dilation))
    # a non-overlapping window (kernel == stride, no padding: a patch embedding) needs no neighbour
    dims = [
        s
        for s in range(nsp)
        if entry_axes(spec[2 + s]) and kernel[s] > 1 and not (kernel[s] == stride[s] and padding[s] == 0)
    ]
    for s in dims:
        if not explicit_halo_ok(kernel[s], stride[s], padding[s], dilation[s]):
            raise ValueError(
                f"spatial dim {2 + s} is split but its convolution (kernel {kernel[s]}, stride {stride[s]}, padding "
                f"{padding[s]}, dilation {dilation[s]}) is not a same-size stride-1 window: no explicit halo for it"
            )
    return dims


def halo_conv(
    conv: Callable,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    stride=1,
    padding=0,
    dilation=1,
    groups=1,
    *,
    spec: PartitionSpec,
    sizes: dict[str, int],
    mark: Mark,
) -> torch.Tensor:
    """``conv(x, weight, bias, stride, padding, dilation, groups)`` (``torch.conv2d``/``conv3d``) whose
    output layout is `spec`, with the halo of every split spatial dim written out (module docstring).
    `sizes`: mesh axis -> size. A conv whose window needs no neighbours runs as it is."""
    spec = normalize_spec(spec)
    dims = haloed_dims(weight.shape, spec, stride, padding, dilation)
    if not dims:
        return conv(x, weight, bias, stride, padding, dilation, groups)
    nsp = x.dim() - 2
    pads = list(_ntuple(padding, nsp))
    lay = [spec[0], spec[1]] + [spec[2 + s] for s in range(nsp)]
    mark(x := x.clone(), tuple(lay))
    undo = []
    for s in dims:
        d = 2 + s
        n = math.prod(sizes[a] for a in entry_axes(lay[d]))
        undo.append((d, n, lay[d], lay[0]))
        if any(entry_axes(e) for e in lay[1:d]):
            raise ValueError(f"dims 1..{d - 1} of a conv input split on dim {d} must be whole for its halo ({lay})")
        x, lay = _tile(x, d, n, pads[s], lay, mark)
        pads[s] = 0
    y = conv(x, weight, bias, stride, tuple(pads), dilation, groups)
    lay[1] = spec[1]
    mark(y, tuple(lay))
    for d, n, axes, batch in reversed(undo):
        y, lay = _untile(y, d, n, axes, batch, lay, mark)
    return y


def _tile(x: torch.Tensor, d: int, n: int, p: int, lay: list, mark: Mark):
    """(x with dim d's n tiles moved into the batch, each with p halo rows a side; its layout)."""
    shape = tuple(x.shape)
    lead, s, rest = math.prod(shape[:d]), shape[d] // n, shape[d + 1 :]
    axes, batch = lay[d], lay[0]
    tiles_lay = (batch, axes, None, *lay[d + 1 :])
    v = x.reshape(lead, n, s, *rest)
    mark(v, tiles_lay)
    edges = torch.cat([v[:, :, :p], v[:, :, s - p :]], dim=2)
    mark(edges, tiles_lay)
    every = edges.clone()
    mark(every, (None,) * every.dim())  # the all-gather of every tile's edges
    whole = (None,) * every.dim()
    zeros = every.new_zeros((lead, 1, p, *rest))
    above, below = every[:, : n - 1, p:], every[:, 1:, :p]
    mark(above, whole)
    mark(below, whole)
    shifted = [torch.cat([zeros, above], dim=1), torch.cat([below, zeros], dim=1)]
    top, bottom = [], []
    for t in shifted:
        mark(t, whole)
        mine = t.clone()  # each tile's halo rows: a local slice of the replicated shift
        mark(mine, tiles_lay)
        (top if not top else bottom).append(mine)
    top, bottom = top[0], bottom[0]
    t = torch.cat([top, v, bottom], dim=2)
    mark(t, tiles_lay)
    t = t.movedim(1, 0)
    mark(t, (axes, batch, None, *lay[d + 1 :]))
    t = t.reshape(n * shape[0], *shape[1:d], s + 2 * p, *rest)
    new = [_join(axes, batch)] + lay[1:d] + [None] + lay[d + 1 :]
    mark(t, tuple(new))
    return t, new


def _untile(y: torch.Tensor, d: int, n: int, axes: AxisEntry, batch: AxisEntry, lay: list, mark: Mark):
    """The inverse move of `_tile` for the conv output: tiles back from the batch into dim d."""
    shape = tuple(y.shape)
    b = shape[0] // n
    inner, rest = math.prod(shape[1:d]), shape[d + 1 :]
    v = y.reshape(n, b * inner, shape[d], *rest)
    mark(v, (axes, batch, None, *lay[d + 1 :]))
    v = v.movedim(0, 1)
    mark(v, (batch, axes, None, *lay[d + 1 :]))
    out = v.reshape(b, *shape[1:d], n * shape[d], *rest)
    new = [batch] + lay[1:d] + [axes] + lay[d + 1 :]
    mark(out, tuple(new))
    return out, new
