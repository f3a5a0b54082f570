"""RMSNorm fusion: the VAE's ``WanRMS_norm`` chain becomes one ``rms_norm`` over the channel dim.

Matches (fp32; ``c`` = 1 for channel-first, -1 for channel-last; ``C`` = channels)::

    y = F.normalize(x, dim=c).to(x.dtype) * C**0.5 * gamma + bias      # bias: a tensor, or the float 0.0

and emits (the ``movedim`` pair only when ``c`` is not the last dim; a float ``+ 0.0`` is dropped)::

    y = F.rms_norm(x.movedim(c, -1), (C,), gamma.reshape(C), eps=eps**2 / C).movedim(-1, c) + bias

Equality. With n = ||x||₂ over the channels and e the normalize eps (1e-12), the original computes
sqrt(C)·x/max(n, e) and the rewrite sqrt(C)·x/sqrt(n² + e²) (that is what eps = e²/C inside
rsqrt(mean(x²) + eps) gives). The two agree to the factor r = max(n, e)/sqrt(n² + e²) ∈ [1/√2, 1]:

    |y_rewrite - y_original| ≤ |y_original| · (1 - r),   1 - r ≤ e²/(2n²) when n ≥ e, ≤ n²/(2e²) when n < e

so for any channel vector with n ≥ 1e-6 the difference is below 5e-13 relative — under one fp32
rounding, i.e. the eps clamp is inactive and the forms differ by rounding only — and a zero vector
gives 0 in both (no 0/0). Below that the eps regimes differ, bounded as above by 1 - 1/√2 relative.

Only fires where the ``.to(x.dtype)`` is a no-op (fp32 input): for bf16/fp16 diffusers normalizes in
fp32 and rounds before scaling, which one ``rms_norm`` would not reproduce. The scale must be exactly
``C**0.5`` and gamma a (C, 1, ...) or (C,) tensor of x's dtype; otherwise the chain is left alone and the
reason reported.
"""

from __future__ import annotations

import numbers
import operator
from dataclasses import dataclass

import torch
import torch.fx as fx

from ._core import (
    Emitter,
    RewriteContext,
    RewriteReport,
    Skip,
    calls,
    calls_method,
    finish,
    module_path,
    note,
    only_user,
    replace,
    report,
    shape,
    value,
)

NORMALIZE = (torch.nn.functional.normalize,)
MUL = (operator.mul, torch.mul)
ADD = (operator.add, torch.add)


def fuse_rmsnorm(gm: fx.GraphModule, context: RewriteContext = RewriteContext()) -> RewriteReport:
    where, skipped = [], []
    for node in list(gm.graph.nodes):
        if calls(node, NORMALIZE):
            path = module_path(node)
            try:
                _rewrite(gm.graph, _match(node))
                where.append(path)
            except Skip as why:
                skipped.append(note(path, why))
    finish(gm)
    return report("rmsnorm", where, skipped)


@dataclass
class _Chain:
    """The matched nodes, oldest first, and what the rewrite needs from them."""

    nodes: list[fx.Node]
    x: fx.Node
    dim: int
    eps: float
    gamma: fx.Node


def _match(normalize: fx.Node) -> _Chain:
    x = normalize.args[0]
    p, dim, eps = _arg(normalize, 1, "p", 2.0), _arg(normalize, 2, "dim", 1), _arg(normalize, 3, "eps", 1e-12)
    if p != 2 or not isinstance(dim, int):
        raise Skip(f"normalize with p={p}, dim={dim} is not an L2 norm over one dim")
    if value(x).dtype != torch.float32:
        raise Skip(f"input is {value(x).dtype}, not fp32")
    ndim = len(shape(x))
    dim = dim % ndim
    channels = shape(x)[dim]
    nodes = [normalize]

    node = _single_user(normalize)
    if calls_method(node, "to") or calls_method(node, "type_as"):
        if value(node).dtype != torch.float32:
            raise Skip(f"normalized values are cast to {value(node).dtype}: not fp32 throughout")
        nodes.append(node)
        node = _single_user(node)
    if _scalar_factor(node) != channels**0.5:
        raise Skip(f"normalize is not followed by '* {channels}**0.5' (found {node.format_node()})")
    nodes.append(node)

    gamma_mul = _single_user(node)
    gamma = _other_operand(gamma_mul, node)
    if not isinstance(gamma, fx.Node) or _strip_leading_ones(shape(gamma)) != (channels,) + (1,) * (ndim - 1 - dim):
        raise Skip(f"gamma {_label(gamma)} is not a ({channels}, 1, ...) tensor aligned to dim {dim}")
    if value(gamma).dtype != torch.float32:
        raise Skip(f"gamma is {value(gamma).dtype}, not fp32")
    nodes.append(gamma_mul)

    zero_add = only_user(gamma_mul)
    if zero_add is not None and calls(zero_add, ADD) and _adds_zero(zero_add, gamma_mul):
        nodes.append(zero_add)
    return _Chain(nodes, x, dim, eps, gamma)


def _rewrite(graph: fx.Graph, chain: _Chain) -> None:
    channels = shape(chain.x)[chain.dim]
    channel_last = chain.dim == len(shape(chain.x)) - 1
    emit = Emitter(graph, chain.nodes[0], chain.nodes[0])
    x = chain.x if channel_last else emit.method("movedim", chain.x, chain.dim, -1)
    weight = emit.method("reshape", chain.gamma, (channels,))
    y = emit.call(torch.nn.functional.rms_norm, x, (channels,), weight, chain.eps**2 / channels, name="rms_norm")
    if not channel_last:
        y = emit.method("movedim", y, -1, chain.dim)
    replace(chain.nodes[-1], y)
    for old in reversed(chain.nodes[:-1]):
        graph.erase_node(old)


def _strip_leading_ones(dims: tuple) -> tuple:
    while len(dims) > 1 and dims[0] == 1:
        dims = dims[1:]
    return dims


def _arg(node: fx.Node, index: int, name: str, default):
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def _single_user(node: fx.Node) -> fx.Node:
    user = only_user(node)
    if user is None:
        raise Skip(f"{node.name} has {len(node.users)} users, the chain needs exactly one")
    return user


def _scalar_factor(node: fx.Node):
    if not calls(node, MUL):
        return None
    a, b = node.args[:2]
    scalar = b if isinstance(a, fx.Node) else a
    return scalar if isinstance(scalar, numbers.Real) else None


def _other_operand(node: fx.Node, known: fx.Node) -> object:
    if not calls(node, MUL) or len(node.args) != 2:
        raise Skip(f"expected a multiply by gamma after the scale, found {node.format_node()}")
    a, b = node.args
    return b if a is known else a


def _adds_zero(add: fx.Node, known: fx.Node) -> bool:
    a, b = add.args[:2]
    other = b if a is known else a
    return isinstance(other, numbers.Real) and other == 0 and not add.kwargs


def _label(node) -> str:
    return node.name if isinstance(node, fx.Node) else repr(node)
