"""Indexing and splitting: getitem (tensor indexing), chunk, split, unbind, cat, setitem.

- ``x[..., a:b:c]``: a full slice (``:``) keeps the dim's shard; a partial or strided slice of a
  sharded dim needs the dim whole first (which rows a device holds would change); ``None`` inserts
  an unsharded dim; an int index removes its dim (which must be unsharded).
- advanced indexing, ``x[[0, -1]]`` or ``x[:, idx]`` with an integer index tensor: the indexed dim
  is gathered (unsharded), the index read whole, the other dims keep their shard; the index's dims
  enter the result unsharded where NumPy's rule puts them. A bool mask (data-dependent shape) is
  computed replicated.
- ``chunk``/``split`` along d keep the input layout on every piece iff d is unsharded; ``unbind``
  drops d (unsharded). ``cat`` along d needs every input alike and d unsharded.
- ``setitem(x, idx, v)`` (in-place write, RoPE's strided ``out[..., 0::2] = ...``): x's indexed dims
  unsharded, v laid out like ``x[idx]``.

(``getitem`` that selects one output of a tuple-valued op is resolved by the propagation engine.)
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from planner.graph import TensorMeta
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


def _list_ndim(value: Any) -> Optional[int]:
    """Dims an advanced list index adds (``[0, -1]``: 1, ``[[0, 1], [2, 3]]``: 2); None for a bool
    mask or a list holding tensors (data-dependent)."""
    if isinstance(value, bool) or (isinstance(value, dict) and "node" in value):
        return None
    if not isinstance(value, list):
        return 0
    inner = [_list_ndim(v) for v in value]
    if any(d is None for d in inner):
        return None
    return 1 + max(inner, default=0)


IndexMap = tuple[list[tuple[Optional[int], bool]], set[int]]


def index_map(
    index: Any, ndim: int, meta_of: Callable[[Any], Optional[TensorMeta]] = lambda ref: None
) -> Optional[IndexMap]:
    """For ``x[index]``: per output dim (input dim it comes from or None, keeps shard?), and the
    input dims that must be unsharded. None where the result's shape depends on data (a bool mask)
    or an index tensor's metadata is unknown (`meta_of` gives it for ``{"node": ...}``).

    Advanced indexing (a ``{"list": [...]}`` or an integer index tensor) gathers along its dim, which
    must be unsharded; its index dims (one per dim of the index, broadcast across advanced items)
    take the place of the first advanced item when the advanced items are adjacent, else they lead
    the result (PyTorch applies integer items first as selects, then NumPy's rule)."""
    items = index if isinstance(index, list) else [index]
    consuming = sum(1 for it in items if it is not None and it != "...")
    tokens: list[tuple[str, Optional[int], int]] = []  # (kind, input dim, index ndim)
    d = 0
    for it in items:
        if it == "...":
            for _ in range(ndim - consuming):
                tokens.append(("full", d, 0))
                d += 1
        elif it is None:
            tokens.append(("new", None, 0))
        elif isinstance(it, bool):
            return None
        elif isinstance(it, int):
            tokens.append(("select", d, 0))
            d += 1
        elif isinstance(it, dict) and "slice" in it:
            tokens.append(("full" if _is_full(it) else "slice", d, 0))
            d += 1
        elif isinstance(it, dict) and ("list" in it or "node" in it):
            if "list" in it:
                k = _list_ndim(it["list"])
            else:
                meta = meta_of(it)
                k = None if meta is None or meta.dtype in ("bool", "uint8") else len(meta.shape)
            if k is None:
                return None
            tokens.append(("advanced", d, k))
            d += 1
        else:
            return None
    while d < ndim:
        tokens.append(("full", d, 0))
        d += 1
    must_unshard = {d for kind, d, _ in tokens if kind in ("select", "slice", "advanced")}
    tokens = [t for t in tokens if t[0] != "select"]
    adv = [i for i, t in enumerate(tokens) if t[0] == "advanced"]
    index_dims = [(None, False)] * max((tokens[i][2] for i in adv), default=0)
    adjacent = not adv or adv[-1] - adv[0] + 1 == len(adv)
    out: list[tuple[Optional[int], bool]] = [] if adjacent else list(index_dims)
    for i, (kind, src, _) in enumerate(tokens):
        if kind == "advanced":
            if adjacent and i == adv[0]:
                out.extend(index_dims)
        elif kind == "new":
            out.append((None, False))
        else:
            out.append((src, kind == "full"))
    return out, must_unshard


def _mapping(op: OpView, ndim: int) -> Optional[IndexMap]:
    """`index_map` of the op's index, or None if it does not describe the op's result."""
    mapping = index_map(
        op.args[1] if len(op.args) > 1 else None,
        ndim,
        lambda ref: None if op.input_index(ref) is None else op.in_metas[op.input_index(ref)],
    )
    if mapping is not None and op.node.op == "getitem" and len(mapping[0]) != len(op.out.shape):
        return None
    return mapping


@register_rule("getitem")
def getitem_rule(op: OpView) -> RuleResult:
    lay = op.keep(0)
    if lay is None:
        return RuleResult(tuple(None for _ in op.ins), (Layout.replicated(len(op.out.shape)),))
    mapping = _mapping(op, lay.ndim)
    if mapping is None:  # a bool mask (data-dependent shape), or an index we cannot read: gather
        req = Layout.replicated(lay.ndim)
        return RuleResult(
            (req,) + tuple(None if v is None else Layout.replicated(v.ndim) for v in op.ins[1:]),
            (Layout.replicated(len(op.out.shape)),),
            note="mask or unreadable index: indexing computed replicated",
        )
    out_dims, unshard = mapping
    req = Layout(tuple(() if d in unshard else a for d, a in enumerate(lay.dims)))
    out = Layout(tuple(req.dims[src] if src is not None and keep else () for src, keep in out_dims))
    # index tensors are read whole by every device
    return RuleResult((req,) + tuple(None if v is None else Layout.replicated(v.ndim) for v in op.ins[1:]), (out,))


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
    mapping = _mapping(op, lay.ndim)
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
