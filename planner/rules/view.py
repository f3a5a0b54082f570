"""View ops: permute, movedim, transpose, unsqueeze, expand, flatten, unflatten, view, reshape, squeeze;
repeat_interleave (a broadcast that materialises).

Reshapes are matched group by group: input dims and output dims whose products are equal form a
group (``(F, H, W) -> L``, ``D -> (H, d)``). Within a group a shard survives only on the *leading*
non-unit dim, and only if the leading output dim divides by the shard count:

- merge ``(F/n, H, W) -> L/n``: each device holds a contiguous run of L — the shard survives;
- split ``D/n -> (H/n, d)``: survives iff ``H % n == 0`` (whole heads per device);
- a shard on a trailing dim (``(F, H/n) -> L``) does not: the rule asks for it gathered.

Products are compared with sympy, so symbolic token counts work; divisibility that sympy cannot
decide becomes a recorded `Guard`.
"""

from __future__ import annotations

from typing import Sequence

import sympy

from planner.placements import Dim, Guard, Layout, divides, shard_count
from planner.rules import OpView, RuleResult, conservative_rule, norm_dim, register_rule


def _eq(a: Dim, b: Dim) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return sympy.simplify(sympy.sympify(a) - sympy.sympify(b)) == 0


def _more_input(acc_in: Dim, acc_out: Dim) -> bool:
    """True if the input side of a group must take another dim (its product is the smaller)."""
    if isinstance(acc_in, int) and isinstance(acc_out, int):
        return acc_in < acc_out
    num, den = sympy.fraction(sympy.simplify(sympy.sympify(acc_out) / sympy.sympify(acc_in)))
    return den == 1 and num != 1


def reshape_groups(src: Sequence[Dim], dst: Sequence[Dim]) -> list[tuple[list[int], list[int]]]:
    """Pair runs of input dims with runs of output dims of equal product (unit dims alone)."""
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(src) or j < len(dst):
        if i < len(src) and _eq(src[i], 1):
            groups.append(([i], []))
            i += 1
            continue
        if j < len(dst) and _eq(dst[j], 1):
            groups.append(([], [j]))
            j += 1
            continue
        if i >= len(src) or j >= len(dst):
            raise ValueError(f"cannot match reshape {tuple(src)} -> {tuple(dst)}")
        gi, gj, pi, pj = [i], [j], src[i], dst[j]
        i, j = i + 1, j + 1
        while not _eq(pi, pj):
            if _more_input(pi, pj) and i < len(src):
                pi = pi * src[i]
                gi.append(i)
                i += 1
            elif j < len(dst):
                pj = pj * dst[j]
                gj.append(j)
                j += 1
            else:
                raise ValueError(f"cannot match reshape {tuple(src)} -> {tuple(dst)}")
        groups.append((gi, gj))
    return groups


def reshape_layout(
    op: OpView, src: Sequence[Dim], dst: Sequence[Dim], lay: Layout
) -> tuple[Layout, Layout, list[Guard]]:
    """(required input layout, output layout, guards) for a reshape src -> dst."""
    req = list(lay.dims)
    out: list[tuple[str, ...]] = [()] * len(dst)
    guards: list[Guard] = []
    for gi, gj in reshape_groups(src, dst):
        lead_in = next((d for d in gi if not _eq(src[d], 1)), None)
        lead_out = next((d for d in gj if not _eq(dst[d], 1)), None)
        for d in gi:
            if not lay.dims[d]:
                continue
            ok = d == lead_in and lead_out is not None
            if ok:
                fit = divides(shard_count(op.mesh, lay.dims[d]), dst[lead_out])
                if isinstance(fit, Guard):
                    guards.append(Guard(fit.expr, fit.divisor, f"shard of {op.node.location} dim {lead_out}"))
                elif not fit:
                    ok = False
            if ok:
                out[lead_out] = lay.dims[d]
            else:
                req[d] = ()
    return Layout(tuple(req)), Layout(tuple(out)), guards


@register_rule("view", "reshape", "flatten", "unflatten", "squeeze")
def reshape_rule(op: OpView) -> RuleResult:
    lay = op.keep(0) or Layout.replicated(op.ndim(0))
    try:
        req, out, guards = reshape_layout(op, op.shape(0), op.out.shape, lay)
    except ValueError:  # products not provably equal (symbolic dims that sympy cannot relate)
        req, out = Layout.replicated(op.ndim(0)), Layout.replicated(len(op.out.shape))
        return RuleResult((req,) + (None,) * (len(op.ins) - 1), (out,), note="reshape groups not provable: replicated")
    return RuleResult((req,) + (None,) * (len(op.ins) - 1), (out,), guards=tuple(guards))


def _int_list(values: list) -> list[int]:
    if len(values) == 1 and isinstance(values[0], list):
        values = values[0]
    return [int(v) for v in values]


@register_rule("permute")
def permute_rule(op: OpView) -> RuleResult:
    lay = op.keep(0) or Layout.replicated(op.ndim(0))
    perm = [norm_dim(d, lay.ndim) for d in _int_list(op.args[1:] or [op.kwargs.get("dims")])]
    return RuleResult((lay,), (Layout(tuple(lay.dims[p] for p in perm)),))


@register_rule("movedim", "moveaxis")
def movedim_rule(op: OpView) -> RuleResult:
    """``movedim(x, source, destination)``: a permute (the conv1x1 / rmsnorm rewrites' channel-last moves)."""
    lay = op.keep(0) or Layout.replicated(op.ndim(0))
    nd = lay.ndim
    src, dst = (
        [norm_dim(int(d), nd) for d in (v if isinstance(v, list) else [v])]
        for v in (op.arg(1, "source"), op.arg(2, "destination"))
    )
    order: list = [None] * nd
    for s, d in zip(src, dst):
        order[d] = s
    rest = iter(d for d in range(nd) if d not in src)
    perm = [s if s is not None else next(rest) for s in order]
    return RuleResult((lay,), (Layout(tuple(lay.dims[p] for p in perm)),))


@register_rule("transpose")
def transpose_rule(op: OpView) -> RuleResult:
    lay = op.keep(0) or Layout.replicated(op.ndim(0))
    a, b = (norm_dim(int(op.arg(i, k)), lay.ndim) for i, k in ((1, "dim0"), (2, "dim1")))
    dims = list(lay.dims)
    dims[a], dims[b] = dims[b], dims[a]
    return RuleResult((lay,), (Layout(tuple(dims)),))


@register_rule("unsqueeze")
def unsqueeze_rule(op: OpView) -> RuleResult:
    lay = op.keep(0) or Layout.replicated(op.ndim(0))
    d = norm_dim(int(op.arg(1, "dim")), lay.ndim + 1)
    dims = list(lay.dims)
    dims.insert(d, ())
    return RuleResult((lay,), (Layout(tuple(dims)),))


@register_rule("expand", "expand_as", "broadcast_to")
def expand_rule(op: OpView) -> RuleResult:
    """Broadcast dims (size 1 -> n) are unsharded; new leading dims too; the rest keep their shard."""
    lay = op.keep(0) or Layout.replicated(op.ndim(0))
    src, dst = op.shape(0), op.out.shape
    shift = len(dst) - len(src)
    dims = [()] * shift + [lay.dims[d] if _eq(src[d], dst[d + shift]) else () for d in range(len(src))]
    return RuleResult((lay,) + (None,) * (len(op.ins) - 1), (Layout(tuple(dims)),))


@register_rule("repeat_interleave")
def repeat_interleave_rule(op: OpView) -> RuleResult:
    """``repeat_interleave(x, r, dim)`` with an integer ``r`` (Wan 2.2's ``DupUp3D`` channel
    duplication): the other dims keep their split; ``dim`` itself is asked whole. Tensor repeats
    (data-dependent sizes) or no ``dim`` (a flattened result): computed replicated."""
    lay = op.keep(0) or Layout.replicated(op.ndim(0))
    repeats, dim = op.arg(1, "repeats"), op.arg(2, "dim")
    if not isinstance(repeats, int) or dim is None:
        return conservative_rule(op)
    d = norm_dim(int(dim), lay.ndim)
    req = lay.with_dim(d, ())
    return RuleResult((req,), (req,), bytes=op.local_bytes(op.in_metas[0], req) + op.local_bytes(op.out, req))
