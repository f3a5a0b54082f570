"""Convolutions: ``conv3d``/``conv2d``/``conv1d`` on (B, C, *spatial), weight (O, C/g, *kernel).

Per mesh axis: batch splits pass; output channels split like the weight's dim 0 (channel
Megatron, column-parallel); input channels split like the weight's dim 1 (row-parallel: each device
convolves its slice of channels, the output is a partial sum over those axes). A split spatial dim
passes through a non-overlapping conv (kernel == stride, no padding: the patch embedding) when the
output dim still divides; an overlapping kernel needs the neighbours' boundary rows: a halo exchange.

The halo is priced as GSPMD emits it (measured on 2x2 / 2x4 virtual CPU meshes, causal pad + conv3d
and padded conv2d): per split spatial dim, two collective-permutes (one per direction) of
``(k - 1) // 2`` rows each. Dims are exchanged in order; a slab carries the other split dims at
their per-device input size (``ceil(size / n)``), except dims already exchanged, which carry
their per-device output size plus ``k - 1`` (the halo corners travel with the later dims).

Where the partitioner exchanges no halo (``OpView.halo`` False: tt-mlir, `planner.targets`), the
lowering writes it into the program (`wancompile.halo`): per split spatial dim, each tile's first and
last ``(k - 1) // 2`` rows are all-gathered (as GSPMD reshards that edge tensor to replicated: one
all-gather per split dim of it, the last dim first), and the tiles move into the batch for an unpadded conv
and back — copies charged as bytes (cat and move in: 4x the haloed input tile, move out: 2x the
output tile). Only a same-size stride-1 window can be haloed so (`explicit_halo_ok`).
"""

from __future__ import annotations

from planner.placements import Layout, divides, numel, shard_count
from planner.rules import InOpComm, OpView, RuleResult, register_rule


def _tuple(v, n: int) -> tuple[int, ...]:
    if isinstance(v, list):
        return tuple(int(x) for x in v)
    if isinstance(v, int):
        return (v,) * n
    return (0,) * n if v in (None, "valid") else (1,) * n


def window(args: list, kwargs: dict, nsp: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(stride, padding, dilation) per spatial dim of a ``convNd(x, w, b, stride, padding, dilation, groups)``."""
    args = list(args) + [None] * 7
    return tuple(
        _tuple(kwargs[k] if k in kwargs else args[i] if args[i] is not None else dflt, nsp)
        for i, k, dflt in ((3, "stride", 1), (4, "padding", 0), (5, "dilation", 1))
    )


def explicit_halo_ok(kernel: int, stride: int, padding: int, dilation: int) -> bool:
    """Whether a split spatial dim's window can get its halo written into the program (`wancompile.halo`)."""
    return kernel == 1 or (stride == 1 and dilation == 1 and 2 * padding + 1 == kernel)


@register_rule("conv3d", "conv2d", "conv1d")
def conv_rule(op: OpView) -> RuleResult:
    xl = op.keep(0) or Layout.replicated(op.ndim(0))
    w = op.tensor_arg(1, "weight")
    b = op.tensor_arg(2, "bias")
    wl = op.keep(w) or Layout.replicated(op.ndim(w))
    nsp = op.ndim(0) - 2
    kernel = tuple(op.shape(w)[2:])
    stride, padding, _ = window(op.args, op.kwargs, nsp)
    used = {a for d in xl.dims[2:] for a in d} | set(xl.dims[0])
    out_ch = tuple(a for a in wl.dims[0] if a not in used)
    # row-parallel: input channels split like the weight's dim 1 -> partial sums over those axes
    in_ch = (
        tuple(xl.dims[1])
        if xl.dims[1] and tuple(wl.dims[1]) == tuple(xl.dims[1]) and not (set(xl.dims[1]) & (used | set(out_ch)))
        else ()
    )
    x_dims = [xl.dims[0], in_ch]
    out_dims = [xl.dims[0], out_ch]
    comm = []
    halo_dims: list[int] = []
    for s in range(nsp):
        axes = xl.dims[2 + s]
        if not axes:
            x_dims.append(())
            out_dims.append(())
            continue
        n = shard_count(op.mesh, axes)
        fits = divides(n, op.out.shape[2 + s])
        if fits is not True:
            x_dims.append(())
            out_dims.append(())
            continue
        x_dims.append(axes)
        out_dims.append(axes)
        if not (kernel[s] == stride[s] and padding[s] == 0) and kernel[s] > 1:
            halo_dims.append(s)
    reqs: list = [None] * len(op.ins)
    reqs[0] = Layout(tuple(x_dims))
    reqs[w] = Layout((out_ch, in_ch) + ((),) * (op.ndim(w) - 2))
    if b is not None:
        reqs[b] = Layout((out_ch,))
    out = Layout(tuple(out_dims), in_ch)
    out_local = op.local(op.out.shape, out)
    in_local = op.local(op.shape(0), reqs[0])
    extra_bytes = 0
    if not op.halo:
        comm, extra_bytes = _explicit_halo(op, halo_dims, x_dims, kernel, op.shape(0), out_local, in_local)
        halo_dims = []
    done: list[int] = []
    for s in halo_dims:
        halo = list(in_local)
        halo[2 + s] = max((kernel[s] - 1) // 2, 1)
        for e in done:
            halo[2 + e] = out_local[2 + e] + kernel[e] - 1
        for direction in ("up", "down"):
            comm.append(
                InOpComm(
                    "collective-permute",
                    x_dims[2 + s],
                    tuple(halo),
                    op.out.itemsize,
                    f"halo exchange of split spatial dim {2 + s} ({direction})",
                )
            )
        done.append(s)
    per_out = numel(op.shape(w)[1:])
    flops = 2 * numel(out_local) * per_out
    nbytes = (
        op.local_bytes(op.in_metas[0], reqs[0])
        + op.local_bytes(op.in_metas[w], reqs[w])
        + numel(out_local) * op.out.itemsize
        + extra_bytes
    )
    return RuleResult(tuple(reqs), (out,), comm=tuple(comm), flops=flops, bytes=nbytes, kernel=True)


def _explicit_halo(op: OpView, halo_dims, x_dims, kernel, in_shape, out_local, in_local) -> tuple[list, int]:
    """The all-gathers and copy bytes of `wancompile.halo` for the split dims `halo_dims`."""
    comm: list = []
    shape = list(in_shape)
    dims = [tuple(d) for d in x_dims]
    haloed = list(in_local)
    item = op.out.itemsize
    nbytes = 0
    for s in halo_dims:
        d, p = 2 + s, (kernel[s] - 1) // 2
        axes = dims[d]
        n = shard_count(op.mesh, axes)
        lead = numel(shape[:d])
        edges = [lead, n, 2 * p, *shape[d + 1 :]]
        lay = [dims[0], axes, (), *dims[d + 1 :]]
        for i, split in reversed(list(enumerate(lay))):  # GSPMD gathers the last split dim first (2x4)
            if not split:
                continue
            lay[i] = ()
            comm.append(
                InOpComm(
                    "all-gather",
                    tuple(a for a in op.mesh.axis_names if a in split),
                    tuple(op.local(tuple(edges), Layout(tuple(lay)))),
                    item,
                    f"explicit halo of split spatial dim {d}: every tile's edge rows gathered",
                )
            )
        haloed[d] = haloed[d] + 2 * p
        nbytes += 4 * numel(haloed) * item + 2 * numel(out_local) * item
        shape[0], shape[d] = n * shape[0], shape[d] // n + 2 * p
        dims[0], dims[d] = axes + dims[0], ()
    return comm, nbytes
