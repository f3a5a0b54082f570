"""Pointwise ops: elementwise math, casts, dropout, activations (numpy broadcasting).

One-axis table, expanded to every mesh axis by the broadcasting below (rows ``[out, *inputs]``):

- ``S(d), S(d)... -> S(d)``: elementwise maps commute with splitting any dim;
- ``S(d), R -> S(d)``: a replicated (or broadcast, size-1) operand is sliced locally, for free;
- ``P, P -> P`` for add/sub and ``P, R -> P`` for mul/truediv by a replicated value: sums commute
  with linear maps (only these keep partial sums; everything else reduces first);
- ``P -> P`` for unary linear ops (neg, casts, dropout, contiguous).

The output takes the layout of the most sharded operand; the others are asked for that layout
(size-1 broadcast dims stay unsharded).
"""

from __future__ import annotations

from planner.placements import Layout, numel
from planner.rules import OpView, RuleResult, register_rule

# keep alphabetically sorted
_UNARY_LINEAR = (
    "clone",
    "contiguous",
    "detach",
    "dropout",
    "float",
    "half",
    "bfloat16",
    "neg",
    "to",
    "type",
    "type_as",
)
_UNARY = (
    "abs",
    "cos",
    "erf",
    "exp",
    "gelu",
    "log",
    "relu",
    "rsqrt",
    "sigmoid",
    "silu",
    "sin",
    "sqrt",
    "square",
    "tanh",
)
_BINARY_ADDITIVE = ("add", "sub")
_BINARY_MULTIPLICATIVE = ("mul", "truediv")
_BINARY = ("eq", "floordiv", "ge", "gt", "le", "lt", "maximum", "minimum", "ne", "pow", "where")
# every op above: an elementwise map, which commutes with slicing any dim
POINTWISE = frozenset(_UNARY_LINEAR + _UNARY + _BINARY_ADDITIVE + _BINARY_MULTIPLICATIVE + _BINARY)


def _broadcast(op: OpView, tensor_inputs: list[int]) -> tuple[tuple[Layout | None, ...], Layout]:
    out_shape = op.out.shape
    nout = len(out_shape)
    best: tuple[int, int] | None = None  # (sharded axes count, input index)
    for i in tensor_inputs:
        lay = op.ins[i]
        if lay is None:
            continue
        shift = nout - lay.ndim
        score = sum(len(a) for d, a in enumerate(lay.dims) if op.shape(i)[d] == out_shape[d + shift])
        if best is None or score > best[0]:
            best = (score, i)
    dims: list[tuple[str, ...]] = [()] * nout
    if best is not None:
        i = best[1]
        lay, shift = op.ins[i], nout - op.ndim(i)
        for d, axes in enumerate(lay.dims):
            if op.shape(i)[d] == out_shape[d + shift]:
                dims[d + shift] = axes
    out = Layout(tuple(dims))
    required: list[Layout | None] = [None] * len(op.ins)
    for i in tensor_inputs:
        if op.ins[i] is None:
            continue
        shift = nout - op.ndim(i)
        req = tuple(
            () if op.shape(i)[d] == 1 and out_shape[d + shift] != 1 else dims[d + shift] for d in range(op.ndim(i))
        )
        required[i] = Layout(req)
    return tuple(required), out


def _partial(op: OpView, tensor_inputs: list[int]) -> tuple[str, ...]:
    """Partial-sum axes the output may keep (see the module table)."""
    kind = op.node.op
    parts = [op.ins[i].partial if op.ins[i] is not None else () for i in tensor_inputs]
    if not any(parts):
        return ()
    if kind in _UNARY_LINEAR:
        return parts[0]
    if kind in _BINARY_ADDITIVE and all(p == parts[0] for p in parts):
        return parts[0]
    if kind in _BINARY_MULTIPLICATIVE and sum(1 for p in parts if p) == 1:
        if kind == "truediv" and not parts[0]:
            return ()
        return next(p for p in parts if p)
    return ()


@register_rule(*_UNARY_LINEAR, *_UNARY, *_BINARY_ADDITIVE, *_BINARY_MULTIPLICATIVE, *_BINARY)
def pointwise_rule(op: OpView) -> RuleResult:
    tensor_inputs = list(range(len(op.ins)))
    if op.node.op == "type_as":  # type_as(x, other): only x's values flow; `other` gives a dtype
        tensor_inputs = tensor_inputs[:1]
    required, out = _broadcast(op, tensor_inputs)
    partial = _partial(op, tensor_inputs)
    if partial:
        required = tuple(None if r is None else Layout(r.dims, partial) for r in required)
        out = Layout(out.dims, partial)
    out_bytes = numel(op.local(op.out.shape, out)) * op.out.itemsize
    # XLA fuses elementwise chains: charge the output write only (cost_model docstring).
    return RuleResult(required, (out,), flops=numel(op.local(op.out.shape, out)), bytes=out_bytes)


@register_rule("arange", "empty", "full", "ones", "zeros", "rand", "randn")
def creation_rule(op: OpView) -> RuleResult:
    """Fresh tensors are made replicated (each device fills its own copy)."""
    return RuleResult(tuple(None for _ in op.ins), tuple(Layout.replicated(len(m.shape)) for m in op.node.outputs))


@register_rule("empty_like", "zeros_like", "ones_like", "full_like")
def like_rule(op: OpView) -> RuleResult:
    """``empty_like(x)`` is laid out like x (no data moves)."""
    lay = op.keep(0) or Layout.replicated(len(op.out.shape))
    return RuleResult((lay,), (lay,))
