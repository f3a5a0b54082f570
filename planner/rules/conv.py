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


@register_rule("conv3d", "conv2d", "conv1d")
def conv_rule(op: OpView) -> RuleResult:
    xl = op.keep(0) or Layout.replicated(op.ndim(0))
    w = op.tensor_arg(1, "weight")
    b = op.tensor_arg(2, "bias")
    wl = op.keep(w) or Layout.replicated(op.ndim(w))
    nsp = op.ndim(0) - 2
    kernel = tuple(op.shape(w)[2:])
    stride = _tuple(op.arg(3, "stride", 1), nsp)
    padding = _tuple(op.arg(4, "padding", 0), nsp)
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
    )
    return RuleResult(tuple(reqs), (out,), comm=tuple(comm), flops=flops, bytes=nbytes, kernel=True)
