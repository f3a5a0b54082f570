"""RoPE without strided writes: the interleaved halves are stacked instead of scattered.

diffusers' Wan attention applies rotary embeddings by writing the two rotated halves into the even
and odd lanes of an empty tensor::

    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    ... out ...

The pass matches an ``empty_like`` whose first uses are exactly those two ``setitem``s (even lanes,
odd lanes, each of half the last dim) and emits::

    out = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).flatten(-2).to(x.dtype)

Exactly equal: lane 2i of the flattened stack is the even value i and lane 2i+1 the odd value i, and
the ``.to`` is the same rounding the write into ``out`` did (the tables are float64 in diffusers, so
the halves are float64 and ``out`` is x's dtype). The ``.to`` is left out when the dtypes agree.
No scatter (setitem on a strided slice) and no ``empty_like`` remain for the partitioner.

For a target whose compiler fuses RoPE (``context.rotary_kernel``: tt-mlir, whose
``RoPERotateHalfFusingPattern`` makes ``x * cos + rotate_half(x) * sin`` on ``[B, heads, tokens, D]`` one
``ttnn.rotary_embedding``), Wan's form (the halves ``x1 * cos - x2 * sin`` and ``x1 * sin + x2 * cos`` of
``x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)``, x of rank 4) is written in that kernel's terms instead::

    xt = x.unflatten(-1, (-1, 2)).permute(0, 2, 1, 4, 3).flatten(-2)   # [B, H, S, D], [evens | odds] per head
    xt = xt.to(promoted)                        # the dtype the halves are computed in (none where it is x's)
    c = cat([cos.transpose(1, 2)] * 2, -1); s = cat([sin.transpose(1, 2)] * 2, -1)
    r = xt * c + cat([-xt[..., D/2:], xt[..., :D/2]], -1) * s
    out = r.unflatten(-1, (2, -1)).permute(0, 2, 1, 4, 3).flatten(-2).to(x.dtype)       # [B, S, H, D], lanes

(one permute each way: tt-mlir runs a reshape, a permute and a reshape for each).

Exactly equal as well: lane i < D/2 of ``r`` is ``x1*cos + (-x2)*sin``, i.e. ``x1*cos - x2*sin`` (IEEE
negation is exact), lane D/2 + i is ``x2*cos + x1*sin``, the odd value with its sum's terms swapped
(addition commutes), and the reorders put them back in the even and odd lanes.

Then, where an attention's query and key were both rotated so and neither is used otherwise (past casts and the
[B, S, H, D] <-> [B, H, S, D] permutes; ``other.type_as(q)`` reads only q's dtype), both stay in halves order:
the reorder back is dropped (`_keep_halves`): ``r.to(x.dtype).transpose(1, 2)``, whose transpose the attention's
own permute to heads-first undoes (tt-mlir runs neither). The scores are the same sums of the same products, ``q . k``
over one permutation of the head dim on both sides, so the attention's output differs only by the order of
that sum (fp32 DiTs: max-abs 4e-7 on outputs of magnitude 2). Wan's self-attention is such a pair in every
family; its cross-attention reads no RoPE.

And where such an x is a projection's output split into heads (through casts and the RMSNorm across heads, the
projection separate or packed by `qkv`, and nothing else reads them), the reorder in is made on the parameters
instead (`_halves_from_weights`): the projection's rows, its bias and the norm's weight are put in halves order
once (``p.unflatten(0, (H, D/2, 2)).transpose(1, 2).flatten(0, 2)``, parameter-only ops that the lowering folds),
and per call x only moves its heads first (``x.transpose(1, 2)``). The projection then computes the same values
in other lanes, and the norm's mean square sums them in another order. On tt-mlir the tiny DiT's block runs 116
TTNN kernels instead of 148 (120 with the reorder in per call; docs/tenstorrent.md); tt-xla's PERF_AUDIT measured
the stack form ~580 ms slower than diffusers' strided writes on one A14B block, where a half-rotation form with
both reorders was 190 ms faster.

A hand matcher, not `rewrites._pattern`: the pattern is two in-place writes into a buffer, which no
dataflow path from the output reaches (``torch.fx.subgraph_rewriter`` rejects a pattern whose nodes
have no users), and it holds only if ``out`` is not read between the writes, an ordering condition.

Why one module of ~400 lines: the three steps (the rotary form, q and k kept in halves order, the reorder made on
the weights) each hold only where the one before was made, on the same sites (`_Back`).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from functools import partial
from typing import Optional

import torch
import torch.fx as fx

from ._core import (
    LINEAR,
    RMS_NORM,
    SDPA,
    Emitter,
    RewriteContext,
    RewriteReport,
    Skip,
    calls,
    calls_method,
    finish,
    linear_args,
    module_path,
    replace,
    rewrite_each,
    shape,
    value,
)
from ._registry import Rewrite, register

EVEN = (Ellipsis, slice(0, None, 2))
ODD = (Ellipsis, slice(1, None, 2))


def rope_without_scatter(gm: fx.GraphModule, context: RewriteContext = RewriteContext()) -> RewriteReport:
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    rotaries: list[_Back] = []

    def unscatter(out: fx.Node) -> None:
        even, odd = _writes(out, order)
        operands = _wan_rotation(even, odd) if context.rotary_kernel else None
        if operands is not None:
            rotaries.append(_rotate_half(gm.graph, out, even, odd, order, *operands))
        else:
            _rewrite(gm.graph, out, even, odd, order)

    buffers = [
        n for n in gm.graph.nodes if calls(n, torch.empty_like) and any(calls(u, operator.setitem) for u in n.users)
    ]
    done = rewrite_each(gm, "rope", ((module_path(n), partial(unscatter, n)) for n in buffers))
    if rotaries:
        _keep_halves(gm.graph, rotaries)
        for site in rotaries:
            _halves_from_weights(gm.graph, site)
        finish(gm)
    return done


register(
    Rewrite(
        "rope",
        rope_without_scatter,
        "out = empty_like(x); out[..., 0::2] = a; out[..., 1::2] = b -> stack([a, b], -1).flatten(-2)",
        order=50,
    )
)


def _writes(out: fx.Node, order: dict) -> tuple[fx.Node, fx.Node]:
    """The even-lane and odd-lane setitem nodes, if they are the first two uses and fill ``out``."""
    users = sorted(out.users, key=order.__getitem__)
    writes = [u for u in users if calls(u, operator.setitem)]
    if len(writes) != 2 or users[:2] != writes:
        raise Skip(f"{out.name} is not written by exactly two setitems before it is read")
    even = [w for w in writes if _index(w) == EVEN]
    odd = [w for w in writes if _index(w) == ODD]
    if len(even) != 1 or len(odd) != 1:
        raise Skip(f"writes {[_index(w) for w in writes]} are not [..., 0::2] and [..., 1::2]")
    full = shape(out)
    if full[-1] % 2:
        raise Skip(f"last dim {full[-1]} is odd")
    half = full[:-1] + (full[-1] // 2,)
    for w in writes:
        written = w.args[2]
        if not isinstance(written, fx.Node) or shape(written) != half:
            raise Skip(f"{w.name} writes a value of shape {_shape_of(written)}, not {half}")
    return even[0], odd[0]


def _index(setitem: fx.Node):
    index = setitem.args[1]
    return tuple(index) if isinstance(index, (tuple, list)) else index


def _rewrite(graph: fx.Graph, out: fx.Node, even: fx.Node, odd: fx.Node, order: dict) -> None:
    last = max(even, odd, key=order.__getitem__)
    emit = Emitter(graph, last, out, after=True)
    halves = [even.args[2], odd.args[2]]
    lanes = emit.method("flatten", emit.call(torch.stack, halves, -1), -2, name="rotated")
    if value(lanes).dtype != value(out).dtype:
        lanes = emit.method("to", lanes, value(out).dtype)
    graph.erase_node(even)
    graph.erase_node(odd)
    replace(out, lanes)


def _wan_rotation(even: fx.Node, odd: fx.Node) -> Optional[tuple[fx.Node, fx.Node, fx.Node]]:
    """(x, cos, sin) where the two writes are Wan's rotation of a rank-4 x, else None (the stack form is written)."""
    a, b = even.args[2], odd.args[2]
    if not (calls(a, operator.sub) and calls(b, operator.add)):
        return None
    products = [m for m in (*a.args, *b.args) if isinstance(m, fx.Node) and calls(m, operator.mul)]
    if len(products) != 4:
        return None
    (x1, cos), (x2, sin), sin_x1, cos_x2 = (tuple(m.args) for m in products)
    if sin_x1 != (x1, sin) or cos_x2 != (x2, cos):
        return None
    picks = [x1, x2]
    if not all(isinstance(p, fx.Node) and calls(p, operator.getitem) for p in picks):
        return None
    unbind = x1.args[0]
    if x2.args[0] is not unbind or (x1.args[1], x2.args[1]) != (0, 1) or not calls_method(unbind, "unbind"):
        return None
    pairs = unbind.args[0]
    if unbind.args[1:] not in ((-1,), ()) and unbind.kwargs.get("dim", -1) != -1:
        return None
    if not (calls_method(pairs, "unflatten") and tuple(pairs.args[1:]) == (-1, (-1, 2))):
        return None
    x = pairs.args[0]
    if not all(isinstance(t, fx.Node) and len(shape(t)) == 4 for t in (x, cos, sin)):
        return None
    return x, cos, sin


def _rotate_half(
    graph: fx.Graph, out: fx.Node, even: fx.Node, odd: fx.Node, order: dict, x: fx.Node, cos: fx.Node, sin: fx.Node
) -> "_Back":
    last = max(even, odd, key=order.__getitem__)
    emit = Emitter(graph, last, out, after=True)
    half = shape(x)[-1] // 2
    # [B, S, H, D/2, 2] -> [B, H, S, 2, D/2]: heads first and the pairs' lanes apart, in one permute
    xt = into = emit.method("flatten", emit.method("permute", emit.method("unflatten", x, -1, (half, 2)), *_APART), -2)
    computed = torch.promote_types(value(x).dtype, value(cos).dtype)
    if value(xt).dtype != computed:
        xt = emit.method("to", xt, computed)
    tables = [emit.method("transpose", t, 1, 2) for t in (cos, sin)]
    c, s = (emit.call(torch.cat, [t, t], -1) for t in tables)
    upper = emit.call(operator.neg, emit.getitem(xt, (Ellipsis, slice(half, None))))
    rotated = emit.call(torch.cat, [upper, emit.getitem(xt, (Ellipsis, slice(None, half)))], -1)
    r = emit.call(operator.add, emit.call(operator.mul, xt, c), emit.call(operator.mul, rotated, s), name="rotary")
    pairs = emit.method("unflatten", r, -1, (2, half))
    swap = emit.method("permute", pairs, *_APART)  # its own inverse
    result = emit.method("flatten", swap, -2)
    chain = (result, swap, pairs)
    if value(result).dtype != value(out).dtype:
        result = emit.method("to", result, value(out).dtype)
        chain = (result, *chain)
    reorder = _Back(r, chain, x, into)
    halves = [even.args[2], odd.args[2]]
    graph.erase_node(even)
    graph.erase_node(odd)
    replace(out, result)
    # the diffusers rotation it replaces, users before what they read (the tables stay: the new form reads them)
    products = [m for h in halves for m in h.args]
    picks = list(dict.fromkeys(m.args[0] for m in products))
    unbind = picks[0].args[0]
    for node in dict.fromkeys([*halves, *products, *picks, unbind, unbind.args[0]]):
        if not node.users:
            graph.erase_node(node)
    return reorder


@dataclass(frozen=True)
class _Back:
    """A rotary site's way back to diffusers' layout: the rotation `rotary` ([B, H, S, D], halves order) and the
    ops from it back to [B, S, H, D] in lane order (users first; the first is what the rest of the graph reads);
    its input `x` ([B, S, H, D], lane order) and `into`, the last of the three ops reordering x into [B, H, S, D] in
    halves order."""

    rotary: fx.Node
    chain: tuple[fx.Node, ...]
    x: fx.Node
    into: fx.Node


_APART = (0, 2, 1, 4, 3)  # [B, S, H, D/2, 2] <-> [B, H, S, 2, D/2]


# ops that neither mix nor cut the head dim: a rotated q or k passes them on its way into an attention, and a
# projection's output on its way to the rotation
_CARRY = {"type_as", "to", "float", "bfloat16", "contiguous"}


def _carried(node: fx.Node) -> bool:
    if calls_method(node, "permute"):
        return tuple(node.args[1:]) == (0, 2, 1, 3)
    if calls_method(node, "transpose"):
        return sorted(d % 4 for d in node.args[1:]) == [1, 2]
    return node.op == "call_method" and node.target in _CARRY


def _attentions(start: fx.Node) -> Optional[list[tuple[fx.Node, str]]]:
    """(attention, "query" | "key") for every use of `start`'s value, past `_carried` ops; None where some use
    is anything else (a value, a mask, another op)."""
    found, todo = [], [start]
    while todo:
        node = todo.pop()
        for user in node.users:
            if calls(user, SDPA):
                query = user.kwargs.get("query", user.args[0] if user.args else None)
                key = user.kwargs.get("key", user.args[1] if len(user.args) > 1 else None)
                if node is not query and node is not key or node is query and node is key:
                    return None
                found.append((user, "query" if node is query else "key"))
            elif _carried(user) and user.args[0] is node:
                todo.append(user)
            elif calls_method(user, "type_as") and node not in user.args[:1]:
                continue  # `other.type_as(q)` reads q's dtype only (diffusers casts the attention's output so)
            else:
                return None
    return found


def _keep_halves(graph: fx.Graph, rotaries: list["_Back"]) -> None:
    """Leave q and k in halves order where they meet only each other: an attention whose query and key were
    both rotated here, and nothing else, sees the same scores with both heads' dims in one order
    (q . k sums the same products), so the reorder back of each is dropped."""
    uses = {b: _attentions(b.chain[0]) for b in rotaries}
    keep = {b for b, found in uses.items() if found}
    while True:
        by_role: dict[fx.Node, dict[str, set]] = {}
        for b in keep:
            for att, role in uses[b]:
                by_role.setdefault(att, {}).setdefault(role, set()).add(b)
        # an attention keeps its operands' order only when both come from kept rotaries
        lost = {b for b in keep for att, _ in uses[b] if not _both_rotated(by_role[att])}
        if not lost:
            break
        keep -= lost
    for b in keep:  # cast where the reorder back was, then only the heads back in place (the attention's own
        end = b.chain[0]  # permute undoes that transpose: tt-mlir drops the pair)
        emit = Emitter(graph, b.rotary, end, after=True)
        cast = b.rotary if value(end).dtype == value(b.rotary).dtype else emit.method("to", b.rotary, value(end).dtype)
        end.replace_all_uses_with(emit.method("transpose", cast, 1, 2))
        for node in b.chain:
            graph.erase_node(node)


def _halves_from_weights(graph: fx.Graph, site: _Back) -> None:
    """Where the rotated x is a projection's output split into heads — through casts, an RMSNorm across all heads
    and the `qkv` rewrite's packing, nothing else reading them — the projection's rows and the norm's weight are
    put in halves order instead (``w.unflatten(0, (H, D/2, 2)).transpose(1, 2).flatten(0, 2)``: parameter-only
    ops, which the lowering folds), so per call x only moves its heads first (``x.transpose(1, 2)``, one permute
    where the reorder was a reshape, a permute and a reshape). The norm's mean square then sums its features in
    another order; everything else computes the same values in other lanes."""
    sources = _sources(site.x) if _read_only_by(site.x, site.into.args[0].args[0]) else None
    if sources is None:
        return
    _, _, heads, head_dim = shape(site.x)
    for reader, param in sources:
        emit = Emitter(graph, reader, reader)
        rows = emit.method("unflatten", param, 0, (heads, head_dim // 2, 2))
        reader.replace_input_with(param, emit.method("flatten", emit.method("transpose", rows, 1, 2), 0, 2))
    permute = site.into.args[0]
    unflatten = permute.args[0]
    replace(site.into, Emitter(graph, site.into, site.into).method("transpose", site.x, 1, 2))
    graph.erase_node(permute)
    graph.erase_node(unflatten)


def _sources(x: fx.Node) -> Optional[list[tuple[fx.Node, fx.Node]]]:
    """(reader, parameter) for every parameter whose dim 0 lays out x's head dim, read by the op reading it: the
    projection's weight and bias (or, packed by `qkv`, x's part of them) and the across-heads norm's weight; None
    where x is not a head split of such a projection or a value on the way is read by anything else."""
    if not (calls_method(x, "unflatten") and x.args[1] in (2, -2) and len(shape(x)) == 4):
        return None
    found: list[tuple[fx.Node, fx.Node]] = []
    prev, y = x, x.args[0]
    while isinstance(y, fx.Node) and _read_only_by(y, prev):
        if calls(y, RMS_NORM):
            normalized = tuple(y.args[1] if len(y.args) > 1 else y.kwargs["normalized_shape"])
            weight = y.args[2] if len(y.args) > 2 else y.kwargs.get("weight")
            if normalized != shape(y)[-1:] or not (weight is None or _parameter(weight)):
                return None
            found += [(y, weight)] if weight is not None else []
        elif y.op == "call_method" and y.target in _CARRY:
            pass
        elif calls(y, LINEAR):
            _, w, b = linear_args(y)
            params = [p for p in (w, b) if p is not None]
            return found + [(y, p) for p in params] if all(_parameter(p) for p in params) else None
        elif calls_method(y, "flatten"):
            packed = _packed_part(y)
            return None if packed is None else found + packed
        else:
            return None
        prev, y = y, y.args[0]
    return None


def _packed_part(q: fx.Node) -> Optional[list[tuple[fx.Node, fx.Node]]]:
    """For ``q = linear(x, w, b).unflatten(-1, (H, 3, d)).unbind(-2)[j].flatten(-2)`` (`qkv`'s packing, its w and b
    ``cat([p.unflatten(0, (H, d)) for p in q/k/v], 1).flatten(0, 1)``): (the j-th ``unflatten``, the j-th parameter)
    of w and of b."""
    pick = q.args[0]
    if not (q.args[1:] == (-2,) and calls(pick, operator.getitem) and len(pick.users) == 1):
        return None
    unbind = pick.args[0]
    split = unbind.args[0] if calls_method(unbind, "unbind") and unbind.args[1:] == (-2,) else None
    if split is None or not (calls_method(split, "unflatten") and split.args[1] == -1 and calls(split.args[0], LINEAR)):
        return None
    if not (_read_only_by(split.args[0], split) and _read_only_by(split, unbind)):
        return None
    found = []
    for packed in linear_args(split.args[0])[1:]:
        if packed is None:
            continue
        cat = packed.args[0] if calls_method(packed, "flatten") and packed.args[1:] == (0, 1) else None
        if cat is None or not calls(cat, torch.cat) or len(cat.args[0]) <= pick.args[1]:
            return None
        part = cat.args[0][pick.args[1]]
        if not (calls_method(part, "unflatten") and part.args[1] == 0 and _parameter(part.args[0])):
            return None
        found.append((part, part.args[0]))
    return found


def _parameter(node) -> bool:
    return isinstance(node, fx.Node) and node.op in ("placeholder", "get_attr")


def _read_only_by(node: fx.Node, reader: fx.Node) -> bool:
    """Whether `reader` is `node`'s only reader, but for ``other.type_as(node)`` (its dtype only)."""
    return all(u is reader or calls_method(u, "type_as") and u.args[0] is not node for u in node.users)


def _both_rotated(roles: dict[str, set]) -> bool:
    """An attention's query and key each trace to one kept rotary (`roles`: role -> the rotaries)."""
    return all(len(roles.get(r, ())) == 1 for r in ("query", "key"))


def _shape_of(node) -> object:
    return shape(node) if isinstance(node, fx.Node) else type(node).__name__
