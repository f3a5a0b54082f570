"""Matrix products: ``linear(x, W, b)`` with W of shape (N, K), and ``matmul``.

Einsum ``...k, nk -> ...n``. Per mesh axis (one-axis table):

- ``S(batch), R -> S(batch)``: rows split, weight replicated (sequence parallel);
- ``R, S(0) -> S(-1)``: column parallel (Megatron's first half), output features split;
- ``S(-1), S(1) -> P -> R``: row parallel (contraction split); the partial sums are all-reduced
  right after the product, before the bias (the bias is added once); ``-> P -> S(d)`` when the
  plan constrains the output split over those axes: a reduce-scatter (Megatron-LM's sequence
  parallelism onto the tokens, tt-metal's hidden-split stream onto the features);
- an axis the weight is split on that also splits x's rows (FSDP: weights sharded over the
  sequence axes for memory) must be gathered on the weight first: an all-gather of the weight.

x's last dim is sliced locally (free) or gathered to match the weight's contraction split; an x split
on K over axes the weight does not use (a hidden-split stream entering a replicated projection) is
met by slicing the weight instead, the output then reduced — what GSPMD does rather than gather x.

x's leading dims: a ``linear`` on a 3-D x of batch B != 1 (the DiT's (B, L, D) stream of a CFG pair) is
lowered as a dot that keeps B and L as two free dims (`keeps_leading_dims`, `wancompile.legalize`), so
the batch is simply carried and any split of B or L survives — sequence parallelism under a whole batch
of 2. Otherwise torch_xla flattens them into the dot's rows: a split there that would not leave each
device one contiguous run of rows is gathered first (`_rows`).
"""

from __future__ import annotations

from planner.placements import Layout, numel, shard_count
from planner.rules import InOpComm, OpView, RuleResult, register_rule


def keeps_leading_dims(op: str, shape) -> bool:
    """The lowering keeps x's leading dims as the dot's free dims (no flattening into rows): a ``linear``
    whose x is 3-D with a batch (dim 0) other than 1 (`wancompile.legalize.linear_unflattened`; measured:
    (2, L, D) split on L over 8 devices compiles with no collective, where the flattened form gathers)."""
    return op == "linear" and len(shape) == 3 and bool(shape[0] != 1)


def _rows(op: OpView, x: int, xl: Layout) -> Layout:
    """x's layout as the product can keep it. torch_xla lowers the product as a 2-D dot over x's
    leading dims flattened into rows: their split survives only while each device's rows stay one
    contiguous run (every dim before the last split one has one element per device), else the rows
    are gathered first (measured: a conv1x1-rewritten VAE linear on an H/W-split (B, T, H, W, C)
    all-gathers H and W; the DiT's (B, L, D) with B whole or split to 1 keeps L split)."""
    if keeps_leading_dims(op.node.op, op.shape(x)):
        return xl
    lead = xl.dims[:-1]
    split = [i for i, axes in enumerate(lead) if axes]
    if not split:
        return xl
    local = op.local(op.shape(x)[:-1], Layout(lead))
    if all(local[i] == 1 for i in range(split[-1])):
        return xl
    return Layout(((),) * len(lead) + (xl.dims[-1],))


def _linear(op: OpView, x: int, w: int, b: int | None, w_nk: bool) -> RuleResult:
    xl = _rows(op, x, op.keep(x) or Layout.replicated(op.ndim(x)))
    wl = op.keep(w) or Layout.replicated(op.ndim(w))
    n_dim, k_dim = (0, 1) if w_nk else (1, 0)
    batch_axes = {a for dims in xl.dims[:-1] for a in dims}
    n_axes = tuple(a for a in wl.dims[n_dim] if a not in batch_axes)
    k_axes = tuple(a for a in wl.dims[k_dim] if a not in batch_axes)
    if not k_axes and not set(xl.dims[-1]) & (set(wl.axes) | batch_axes):
        k_axes = tuple(xl.dims[-1])  # x split on K, the weight whole there: slice the weight to match (free)
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
    # partial sums the output constraint splits onto a dim stay partial here: the constraint's
    # redistribution reduce-scatters them (`planner.reshard.redistribute`); the rest are all-reduced
    wanted = op.wanted.axes if op.wanted is not None else ()
    scattered = tuple(a for a in k_axes if a in wanted)
    reduced = tuple(a for a in k_axes if a not in scattered)
    if reduced:
        comm = (InOpComm("all-reduce", reduced, out_local, op.out.itemsize, "row-parallel partial sums"),)
    if scattered:
        out = Layout(out.dims, scattered)
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
