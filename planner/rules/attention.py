"""Attention: ``scaled_dot_product_attention(q, k, v)`` on (B, H, L, d) tensors.

Per mesh axis: batch and head splits pass through (``S(0)``/``S(1)`` on q, k, v -> same on the
output); a split of the query tokens (``S(2)`` on q) passes through *if* k and v hold every key
token — so a token-sharded k/v is gathered on L (the SP K/V all-gather); the head dim d is never
split. This one rule prices all four attention macro-strategies (`planner.strategies`): head-TP
(heads split), SP + K/V all-gather (q tokens split, k/v gathered), Ulysses (heads split over the SP
axes after an all-to-all, imposed by constraints around the op), replicated.
"""

from __future__ import annotations

from planner.placements import Layout, numel
from planner.rules import OpView, RuleResult, register_rule


@register_rule("scaled_dot_product_attention")
def sdpa_rule(op: OpView) -> RuleResult:
    q, k, v = (op.tensor_arg(i, key) for i, key in enumerate(("query", "key", "value")))
    ql = op.keep(q) or Layout.replicated(4)
    heads = tuple(a for a in ql.dims[1])
    q_req = Layout((ql.dims[0], heads, ql.dims[2], ()))
    kv_req = Layout((ql.dims[0], heads, (), ()))
    reqs: list = [None] * len(op.ins)
    reqs[q], reqs[k], reqs[v] = q_req, kv_req, kv_req
    mask = op.tensor_arg(3, "attn_mask")
    if mask is not None:
        reqs[mask] = Layout.replicated(op.ndim(mask))
    ql_shape = op.local(op.shape(q), q_req)
    lk = op.shape(k)[2]
    flops = 4 * numel(ql_shape) * lk  # QK^T and PV: 2 * B*H*Lq*Lk*d each
    nbytes = (
        op.local_bytes(op.in_metas[q], q_req) * 2
        + op.local_bytes(op.in_metas[k], kv_req)
        + op.local_bytes(op.in_metas[v], kv_req)
    )
    return RuleResult(tuple(reqs), (q_req,), flops=flops, bytes=nbytes, kernel=True)
