"""QKV fusion: one linear for the q, k and v projections of an attention, packed head-interleaved.

Matches, per attention module ``P`` (diffusers' ``WanAttention``), the linears of ``P.to_q``,
``P.to_k`` and ``P.to_v``. When all three read the same input (self-attention) they become one linear;
when only ``to_k`` and ``to_v`` share an input (cross-attention: keys and values from the prompt) those
two do. For self-attention the pass emits::

    w = cat([w_q.unflatten(0, (H, d)), w_k.unflatten(0, (H, d)), w_v.unflatten(0, (H, d))], 1).flatten(0, 1)
    b = cat([b_q.unflatten(0, (H, d)), b_k.unflatten(0, (H, d)), b_v.unflatten(0, (H, d))], 1).flatten(0, 1)
    qkv = linear(x, w, b).unflatten(-1, (H, 3, d)).unbind(-2)   # rows: [h0: q k v][h1: q k v]...
    q, k, v = qkv[0].flatten(-2), qkv[1].flatten(-2), qkv[2].flatten(-2)   # (B, L, H*d) as before

Why head-interleaved: sharding the packed weight's dim 0 over any TP degree that divides H gives each
device whole q, k and v heads of the same head group, so the fused linear is column-parallel exactly
like the three it replaces. q, k and v come back in their (B, L, H*d) layout, so ``norm_q``/``norm_k``
(RMSNorm across all heads) and the following ``unflatten(2, (H, -1))`` read them unchanged.

H is read off the ``unflatten(2, (H, -1))`` that follows each projection (through at most a norm).
Preconditions — the projections share their input node, all have or all lack a bias, weights have the
same shape and agree on H — are checked per attention; one that cannot be proven leaves that
attention's graph as it was and is reported in ``skipped``.

A hand matcher, not `rewrites._pattern`: the three linears are grouped by module path (``P.to_q``,
``P.to_k``, ``P.to_v``), not by dataflow alone. As a subgraph pattern (three linears on one input)
``torch.fx.subgraph_rewriter`` enumerates every triple of linears sharing an input, and every
cross-attention's ``to_k``/``to_v`` read the same prompt: 80 of them on a 40-block DiT, 14 s of
matching (measured; 0.26 s at 10 blocks, cubic) against 0.6 s for this pass on A14B.
"""

from __future__ import annotations

from collections import defaultdict
from functools import partial

import torch
import torch.fx as fx

from ._core import (
    LINEAR,
    Emitter,
    RewriteContext,
    RewriteReport,
    Skip,
    calls,
    calls_method,
    linear_args,
    module_path,
    parent_stack,
    replace,
    rewrite_each,
    shape,
    static,
    value,
)
from ._registry import Rewrite, register

ROLES = ("to_q", "to_k", "to_v")


def fuse_qkv(gm: fx.GraphModule, context: RewriteContext = RewriteContext()) -> RewriteReport:
    order = {node: i for i, node in enumerate(gm.graph.nodes)}

    def fuse(attention: str, projections: dict[str, fx.Node]) -> None:
        group = _group(attention, projections)
        _pack(gm.graph, group, _heads(group), order)

    attentions = _attentions(gm.graph).items()
    return rewrite_each(gm, "qkv", ((a, partial(fuse, a, p)) for a, p in attentions))


register(
    Rewrite(
        "qkv",
        fuse_qkv,
        "P.to_q/to_k/to_v linears on one input (to_k/to_v for cross-attention) -> one head-interleaved linear",
        order=10,
    )
)


def _attentions(graph: fx.Graph) -> dict[str, dict[str, fx.Node]]:
    """Module path of each attention → {"to_q": linear node, ...} for the projections present."""
    found: dict[str, dict[str, fx.Node]] = defaultdict(dict)
    for node in graph.nodes:
        if calls(node, LINEAR):
            parent, _, role = module_path(node).rpartition(".")
            if role in ROLES:
                found[parent][role] = node
    return dict(found)


def _group(attention: str, projections: dict[str, fx.Node]) -> list[fx.Node]:
    """The projections to fuse, in q, k, v order; raises Skip with the reason when none can be."""
    missing = [r for r in ROLES if r not in projections]
    if "to_k" in missing or "to_v" in missing:
        raise Skip(f"missing {', '.join(missing)}")
    q, k, v = (projections.get(r) for r in ROLES)
    x_k, x_v = linear_args(k)[0], linear_args(v)[0]
    if x_k is not x_v:
        raise Skip(f"to_k and to_v read different inputs ({_name(x_k)}, {_name(x_v)})")
    group = [q, k, v] if q is not None and linear_args(q)[0] is x_k else [k, v]
    biased = [linear_args(n)[2] is not None for n in group]
    if any(biased) and not all(biased):
        has = [module_path(n).rpartition(".")[2] for n, b in zip(group, biased) if b]
        lacks = [module_path(n).rpartition(".")[2] for n, b in zip(group, biased) if not b]
        raise Skip(f"{', '.join(has)} has a bias but {', '.join(lacks)} has none")
    weights = [linear_args(n)[1] for n in group]
    if not all(isinstance(w, fx.Node) for w in weights):
        raise Skip("a projection weight is not a graph node")
    shapes = {shape(w) for w in weights}
    if len(shapes) != 1 or len(next(iter(shapes))) != 2 or not static(next(iter(shapes))):
        raise Skip(f"projection weights differ in shape or are not static 2-D: {sorted(shapes)}")
    if len({value(w).dtype for w in weights}) != 1:
        raise Skip("projection weights differ in dtype")
    return group


def _heads(group: list[fx.Node]) -> int:
    """Head count, read off the ``unflatten(2, (heads, -1))`` after each projection; all must agree."""
    features = shape(linear_args(group[0])[1])[0]
    counts = {_heads_after(node, features) for node in group}
    if None in counts:
        raise Skip("head count not found: no unflatten(2, (heads, -1)) within two ops of every projection")
    if len(counts) != 1:
        raise Skip(f"projections disagree on the head count: {sorted(counts)}")
    return counts.pop()


def _heads_after(node: fx.Node, features: int, depth: int = 2) -> int | None:
    for user in node.users:
        if not isinstance(user.meta.get("example_value"), torch.Tensor):
            continue
        if calls_method(user, "unflatten") or calls(user, torch.unflatten):
            dim, sizes = (list(user.args[1:]) + list(user.kwargs.values()))[:2]
            ndim = len(shape(node))
            if dim % ndim == ndim - 1 and len(sizes) == 2:
                heads = sizes[0] if sizes[0] != -1 else features // sizes[1]
                if heads > 0 and features % heads == 0:
                    return heads
        if depth > 0 and shape(user) == shape(node):
            found = _heads_after(user, features, depth - 1)
            if found is not None:
                return found
    return None


def _pack(graph: fx.Graph, group: list[fx.Node], heads: int, order: dict[fx.Node, int]) -> None:
    first = min(group, key=lambda n: order[n])
    emit = Emitter(graph, first, group[0], stack=parent_stack(group[0]))
    x = linear_args(group[0])[0]
    features = shape(linear_args(group[0])[1])[0]
    head_dim = features // heads

    def interleave(tensors: list[fx.Node], name: str) -> fx.Node:
        per_head = [emit.method("unflatten", t, 0, (heads, head_dim)) for t in tensors]
        return emit.method("flatten", emit.call(torch.cat, per_head, 1), 0, 1, name=name)

    weight = interleave([linear_args(n)[1] for n in group], "packed_weight")
    bias = (
        interleave([linear_args(n)[2] for n in group], "packed_bias") if linear_args(group[0])[2] is not None else None
    )
    fused = emit.call(torch._C._nn.linear, x, weight, bias, name="qkv" if len(group) == 3 else "kv")
    parts = emit.method("unbind", emit.method("unflatten", fused, -1, (heads, len(group), head_dim)), -2)
    outputs = []
    for i, projection in enumerate(group):
        emit_part = Emitter(graph, first, projection)
        outputs.append(emit_part.method("flatten", emit_part.getitem(parts, i), -2))
    for projection, output in zip(group, outputs):
        replace(projection, output)


def _name(node) -> str:
    return node.name if isinstance(node, fx.Node) else repr(node)
