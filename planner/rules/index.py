"""Indexing and splitting: getitem (tensor indexing), chunk, split, unbind, cat, setitem.

- ``x[..., a:b:c]``: a full slice (``:``) keeps the dim's shard; a partial or strided slice of a
  sharded dim needs the dim whole first (which rows a device holds would change); ``None`` inserts
  an unsharded dim; an int index removes its dim (which must be unsharded).
- ``chunk``/``split`` along d keep the input layout on every piece iff d is unsharded; ``unbind``
  drops d (unsharded). ``cat`` along d needs every input alike and d unsharded.
- ``setitem(x, idx, v)`` (in-place write, RoPE's strided ``out[..., 0::2] = ...``): x's indexed dims
  unsharded, v laid out like ``x[idx]``.

(``getitem`` that selects one output of a tuple-valued op is resolved by the propagation engine.)
"""

from __future__ import annotations

from typing import Any, Optional

from planner.placements import Layout
from planner.rules import OpView, RuleResult, norm_dim, register_rule


def _is_full(item: Any) -> bool:
    return (
        isinstance(item, dict)
        and "slice" in item
        and item["slice"][0] in (None, 0)
        and item["slice"][1] is None
        and item["slice"][2] in (None, 1)
    )


def index_map(index: Any, ndim: int) -> Optional[tuple[list[tuple[Optional[int], bool]], set[int]]]:
    """For ``x[index]``: per output dim (input dim it comes from or None, keeps shard?), and the
    input dims that must be unsharded. None for advanced (tensor) indexing."""
    items = index if isinstance(index, list) else [index]
    if any(isinstance(it, dict) and "node" in it for it in items):
        return None
    consuming = sum(1 for it in items if it is not None and it != "...")
    out: list[tuple[Optional[int], bool]] = []
    must_unshard: set[int] = set()
    d = 0
    for it in items:
        if it == "...":
            for _ in range(ndim - consuming):
                out.append((d, True))
                d += 1
        elif it is None:
            out.append((None, False))
        elif isinstance(it, int):
            must_unshard.add(d)
            d += 1
        elif isinstance(it, dict) and "slice" in it:
            full = _is_full(it)
            out.append((d, full))
            if not full:
                must_unshard.add(d)
            d += 1
        else:
            return None
    while d < ndim:
        out.append((d, True))
        d += 1
    return out, must_unshard


@register_rule("getitem")
def getitem_rule(op: OpView) -> RuleResult:
    lay = op.keep(0)
    if lay is None:
        return RuleResult(tuple(None for _ in op.ins), (Layout.replicated(len(op.out.shape)),))
    mapping = index_map(op.args[1] if len(op.args) > 1 else None, lay.ndim)
    if mapping is None:  # advanced indexing: gather the indexed tensor
        req = Layout.replicated(lay.ndim)
        return RuleResult(
            (req,) + tuple(None for _ in op.ins[1:]),
            (Layout.replicated(len(op.out.shape)),),
            note="advanced indexing computed replicated",
        )
    out_dims, unshard = mapping
    req = Layout(tuple(() if d in unshard else a for d, a in enumerate(lay.dims)))
    out = Layout(tuple(req.dims[src] if src is not None and keep else () for src, keep in out_dims))
    return RuleResult((req,) + tuple(None for _ in op.ins[1:]), (out,))


def _split_dim(op: OpView, pos: int, default: int = 0) -> int:
    return norm_dim(int(op.arg(pos, "dim", default)), op.ndim(0))


@register_rule("chunk", "split", "tensor_split")
def split_rule(op: OpView) -> RuleResult:
    lay = op.keep(0) or Layout.replicated(op.ndim(0))
    req = lay.with_dim(_split_dim(op, 2), ())
    return RuleResult((req,), tuple(req for _ in op.node.outputs))


@register_rule("unbind")
def unbind_rule(op: OpView) -> RuleResult:
    lay = op.keep(0) or Layout.replicated(op.ndim(0))
    d = _split_dim(op, 1)
    req = lay.with_dim(d, ())
    out = Layout(req.dims[:d] + req.dims[d + 1 :])
    return RuleResult((req,), tuple(out for _ in op.node.outputs))


@register_rule("cat", "concat", "concatenate", "stack")
def cat_rule(op: OpView) -> RuleResult:
    first = next((lay for lay in op.ins if lay is not None), None)
    nd = len(op.out.shape)
    if first is None:
        return RuleResult(tuple(op.ins), (Layout.replicated(nd),))
    if op.node.op == "stack":
        d = norm_dim(int(op.arg(1, "dim", 0)), nd)
        req = first.without_partial()
        out = Layout(req.dims[:d] + ((),) + req.dims[d:])
    else:
        d = norm_dim(int(op.arg(1, "dim", 0)), nd)
        req = first.without_partial().with_dim(d, ())
        out = req
    return RuleResult(tuple(None if lay is None else req for lay in op.ins), (out,))


@register_rule("setitem")
def setitem_rule(op: OpView) -> RuleResult:
    lay = op.keep(0)
    if lay is None:
        return RuleResult(tuple(op.ins), ())
    mapping = index_map(op.args[1] if len(op.args) > 1 else None, lay.ndim)
    if mapping is None:
        req = Layout.replicated(lay.ndim)
        return RuleResult((req,) + tuple(None if v is None else Layout.replicated(v.ndim) for v in op.ins[1:]), ())
    out_dims, unshard = mapping
    req = Layout(tuple(() if d in unshard else a for d, a in enumerate(lay.dims)))
    value = Layout(tuple(req.dims[src] if src is not None and keep else () for src, keep in out_dims))
    reqs: list[Optional[Layout]] = [req]
    for v in op.ins[1:]:
        reqs.append(None if v is None else (value if v.ndim == value.ndim else Layout.replicated(v.ndim)))
    return RuleResult(tuple(reqs), ())
