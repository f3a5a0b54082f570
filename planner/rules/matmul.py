"""Matrix products: ``linear(x, W, b)`` with W of shape (N, K), and ``matmul``.

Einsum ``...k, nk -> ...n``. Per mesh axis (one-axis table):

- ``S(batch), R -> S(batch)``: rows split, weight replicated (sequence parallel);
- ``R, S(0) -> S(-1)``: column parallel (Megatron's first half), output features split;
- ``S(-1), S(1) -> P -> R``: row parallel (contraction split); the partial sums are all-reduced
  right after the product, before the bias (the bias is added once);
- an axis the weight is split on that also splits x's rows (FSDP: weights sharded over the
  sequence axes for memory) must be gathered on the weight first: an all-gather of the weight.

x's last dim is sliced locally (free) or gathered to match the weight's contraction split.
"""

from __future__ import annotations

from planner.placements import Layout, numel, shard_count
from planner.rules import InOpComm, OpView, RuleResult, register_rule


def _linear(op: OpView, x: int, w: int, b: int | None, w_nk: bool) -> RuleResult:
    xl = op.keep(x) or Layout.replicated(op.ndim(x))
    wl = op.keep(w) or Layout.replicated(op.ndim(w))
    n_dim, k_dim = (0, 1) if w_nk else (1, 0)
    batch_axes = {a for dims in xl.dims[:-1] for a in dims}
    n_axes = tuple(a for a in wl.dims[n_dim] if a not in batch_axes)
    k_axes = tuple(a for a in wl.dims[k_dim] if a not in batch_axes)
    w_req = [()] * 2
    w_req[n_dim], w_req[k_dim] = n_axes, k_axes
    x_req = Layout(xl.dims[:-1] + (k_axes,))
    out = Layout(xl.dims[:-1] + (n_axes,))
    reqs: list = [None] * len(op.ins)
    reqs[x], reqs[w] = x_req, Layout(tuple(w_req))
    if b is not None:
        reqs[b] = Layout((n_axes,))
    out_local = op.local(op.out.shape, out)
    k = op.shape(w)[k_dim]
    k_local = k / shard_count(op.mesh, k_axes) if k_axes else k
    comm = ()
    if k_axes:
        comm = (InOpComm("all-reduce", k_axes, out_local, op.out.itemsize, "row-parallel partial sums"),)
    flops = 2 * numel(out_local) * k_local
    nbytes = (
        op.local_bytes(op.in_metas[x], x_req)
        + op.local_bytes(op.in_metas[w], reqs[w])
        + numel(out_local) * op.out.itemsize
    )
    return RuleResult(tuple(reqs), (out,), comm=comm, flops=flops, bytes=nbytes, kernel=True)


@register_rule("linear")
def linear_rule(op: OpView) -> RuleResult:
    x, w = op.tensor_arg(0, "input"), op.tensor_arg(1, "weight")
    b = op.tensor_arg(2, "bias")
    return _linear(op, x, w, b, w_nk=True)


@register_rule("matmul", "mm", "bmm")
def matmul_rule(op: OpView) -> RuleResult:
    if op.ndim(1) != 2:  # batched right operand: compute replicated (not in the Wan graphs)
        from planner.rules import conservative_rule

        return conservative_rule(op)
    return _linear(op, 0, 1, None, w_nk=False)
