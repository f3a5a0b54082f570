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

Pattern + replacement (`rewrites._pattern`): four patterns, with and without the ``.to`` cast and the
``+ 0.0``; the literals (dim, dtype, scale, the added float) are pattern arguments checked in `_check`.
"""

from __future__ import annotations

import numbers

import torch
import torch.fx as fx

from ._core import RewriteContext, RewriteReport, Skip, shape, value
from ._pattern import Match, Pattern, rewrite_patterns
from ._registry import Rewrite, register

F = torch.nn.functional


def _cast_plus_zero(x, dim, dtype, scale, gamma, zero):
    return F.normalize(x, dim=dim).to(dtype) * scale * gamma + zero


def _cast(x, dim, dtype, scale, gamma):
    return F.normalize(x, dim=dim).to(dtype) * scale * gamma


def _plus_zero(x, dim, scale, gamma, zero):
    return F.normalize(x, dim=dim) * scale * gamma + zero


def _plain(x, dim, scale, gamma):
    return F.normalize(x, dim=dim) * scale * gamma


def _rms_norm(m: Match):
    """The replacement for a match: one rms_norm over the channel dim (moved last and back if needed)."""
    ndim = len(shape(m["x"]))
    dim = m["dim"] % ndim
    channels = shape(m["x"])[dim]
    eps = m["normalize"].kwargs.get("eps", 1e-12) ** 2 / channels

    def replacement(x, gamma, **_):
        y = x if dim == ndim - 1 else x.movedim(dim, -1)
        y = F.rms_norm(y, (channels,), gamma.reshape((channels,)), eps)
        return y if dim == ndim - 1 else y.movedim(-1, dim)

    return replacement


def _check(m: Match):
    normalize, x, dim = m["normalize"], m["x"], m["dim"]
    if set(normalize.kwargs) - {"dim", "eps"} or not isinstance(dim, int):
        raise Skip(f"normalize with {normalize.kwargs} is not an L2 norm over one dim")
    if m.has("zero") and not (isinstance(m["zero"], numbers.Real) and m["zero"] == 0):
        return False  # a real bias: the pattern without the add takes it, the add stays
    if value(x).dtype != torch.float32:
        raise Skip(f"input is {value(x).dtype}, not fp32")
    ndim = len(shape(x))
    channels = shape(x)[dim % ndim]
    if m.has("to") and value(m["to"]).dtype != torch.float32:
        raise Skip(f"normalized values are cast to {value(m['to']).dtype}: not fp32 throughout")
    scale = m["mul"]
    if m["scale"] != channels**0.5:
        raise Skip(f"normalize is not followed by '* {channels}**0.5' (found {scale.format_node()})")
    gamma = m["gamma"]
    if not isinstance(gamma, fx.Node) or _strip_leading_ones(shape(gamma)) != (channels,) + (1,) * (
        ndim - 1 - dim % ndim
    ):
        raise Skip(f"gamma {_label(gamma)} is not a ({channels}, 1, ...) tensor aligned to dim {dim % ndim}")
    if value(gamma).dtype != torch.float32:
        raise Skip(f"gamma is {value(gamma).dtype}, not fp32")


def fuse_rmsnorm(gm: fx.GraphModule, context: RewriteContext = RewriteContext()) -> RewriteReport:
    patterns = [Pattern(p, _rms_norm, _check) for p in (_cast_plus_zero, _cast, _plus_zero, _plain)]
    return rewrite_patterns(gm, "rmsnorm", patterns)


register(
    Rewrite(
        "rmsnorm",
        fuse_rmsnorm,
        "F.normalize(x, dim=c) * C**0.5 * gamma (+ 0.0), fp32 (the VAE's WanRMS_norm) -> one F.rms_norm",
        order=20,
    )
)


def _strip_leading_ones(dims: tuple) -> tuple:
    while len(dims) > 1 and dims[0] == 1:
        dims = dims[1:]
    return dims


def _label(node) -> str:
    return node.name if isinstance(node, fx.Node) else repr(node)
