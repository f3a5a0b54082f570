"""Normalizations: ``rms_norm``, ``layer_norm``, ``group_norm``, ``normalize``.

Reductions over the normalized (trailing) dims. Per mesh axis:

- a split of a kept dim (tokens, batch) passes through, nothing moves;
- a split of a normalized dim (Wan's ``norm_q``/``norm_k`` over the TP-split hidden dim,
  ``qk_norm="rms_norm_across_heads"``) leaves each device a partial sum of squares: the op runs a
  small all-reduce of the f32 statistics — one for RMSNorm (mean square), two for LayerNorm
  (mean, then the centred mean square, as wancompile.legalize writes it) — shaped like the
  activation with the normalized dims reduced to 1. The affine weight is split like those dims.
"""

from __future__ import annotations

from planner.placements import Layout, numel
from planner.rules import InOpComm, OpView, RuleResult, register_rule

_STATS_REDUCTIONS = {"rms_norm": 1, "layer_norm": 2, "group_norm": 2, "normalize": 1}


@register_rule("rms_norm", "layer_norm", "normalize")
def norm_rule(op: OpView) -> RuleResult:
    xl = op.keep(0) or Layout.replicated(op.ndim(0))
    if op.node.op == "normalize":
        ndims = 1
        dims = {int(op.arg(2, "dim", 1)) % xl.ndim}
    else:
        shape = op.arg(1, "normalized_shape")
        ndims = len(shape) if isinstance(shape, list) else 1
        dims = set(range(xl.ndim - ndims, xl.ndim))
    reqs: list = [None] * len(op.ins)
    reqs[0] = xl
    for i in range(1, len(op.ins)):
        if op.ins[i] is not None:  # affine weight / bias over the normalized dims
            reqs[i] = Layout(tuple(xl.dims[d] for d in sorted(dims))[-op.ndim(i) :])
    split = tuple(a for d in sorted(dims) for a in xl.dims[d])
    comm = ()
    if split:
        stats = tuple(1 if d in dims else n for d, n in enumerate(op.local(op.shape(0), xl)))
        comm = tuple(
            InOpComm("all-reduce", split, stats, 4, f"{op.node.op} statistics over a split dim")
            for _ in range(_STATS_REDUCTIONS[op.node.op])
        )
    local = numel(op.local(op.out.shape, xl))
    return RuleResult(tuple(reqs), (xl,), comm=comm, flops=5 * local, bytes=2 * local * op.out.itemsize, kernel=True)


@register_rule("group_norm")
def group_norm_rule(op: OpView) -> RuleResult:
    """(B, C, ...) normalized per group of channels: a channel split needs whole groups per device;
    kept simple: channels gathered, batch/spatial splits pass with a statistics all-reduce."""
    xl = op.keep(0) or Layout.replicated(op.ndim(0))
    req = xl.with_dim(1, ())
    spatial = tuple(a for d in range(2, xl.ndim) for a in req.dims[d])
    reqs = [req] + [None if lay is None else Layout.replicated(lay.ndim) for lay in op.ins[1:]]
    comm = ()
    if spatial:
        stats = (op.local(op.shape(0), req)[0], int(op.arg(1, "num_groups", 1)))
        comm = tuple(
            InOpComm("all-reduce", spatial, stats, 4, "group_norm statistics over split spatial dims") for _ in range(2)
        )
    local = numel(op.local(op.out.shape, req))
    return RuleResult(tuple(reqs), (req,), comm=comm, flops=5 * local, bytes=2 * local * op.out.itemsize, kernel=True)
