"""Convolutions that are really linears: 1×1(×1) convs, and the patch-embedding conv.

``conv1x1`` matches any conv1d/2d/3d whose kernel is all ones, with stride 1, no padding and one group
(the VAE's ``conv_shortcut``, ``quant_conv``/``post_quant_conv``, the mid-block attention's
``to_qkv``/``proj``), and emits a linear over the channel dim::

    y = conv3d(x, w, b)                                   # w: (O, C, 1, 1, 1)
    →  y = linear(x.movedim(1, -1), w.flatten(1), b).movedim(-1, 1)

``patch_embed`` matches a conv3d whose kernel equals its stride, with no padding, dilation 1 and one
group, when its only use is ``flatten(2).transpose(1, 2)`` (the DiT's patch embedding, k = s = (1, 2, 2),
producing tokens (B, L, D)), and emits the token-major form directly::

    tokens = conv3d(x, w, b, stride=k).flatten(2).transpose(1, 2)
    →  patches = x.unflatten(4, (-1, kw)).unflatten(3, (-1, kh)).unflatten(2, (-1, kt))  # B C T' kt H' kh W' kw
       patches = patches.permute(0, 2, 4, 6, 1, 3, 5, 7).flatten(4).flatten(1, 3)        # B L (C kt kh kw)
       tokens = linear(patches, w.flatten(1), b)                                          # B L D

so the (B, L, D) tensor the sequence-parallel shard applies to is a linear's output, not a reshape of
a partitioned conv output (the partitioner bug of seed 000, ``docs/seeds.md``). A patch conv whose output is
used some other way first (Wan Animate adds its pose patches into frames 1.. before flattening) takes the
same linear and is put back channels-first, so no 3-D convolution is left in the DiT::

    y = conv3d(x, w, b, stride=k)                                                        # B D T' H' W'
    →  y = linear(patches, w.flatten(1), b).unflatten(1, (T', H', W')).permute(0, 4, 1, 2, 3)

(tt-mlir's ``optimization_level`` 1, which keeps fused attention, refuses ``ttnn.conv3d``:
`wancompile.tt.check.compile_options`). The input's T, H and W must be static multiples of the kernel (a conv
would drop the remainder).

Both are pattern + replacement (`rewrites._pattern`): the pattern is the conv call as ``nn.ConvNd``
emits it (all seven arguments), the preconditions on the literals are `_check_plain`.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ._core import CONV, RewriteContext, RewriteReport, Skip, shape, static
from ._pattern import Match, Pattern, named, rewrite_patterns
from ._registry import Rewrite, register

_CONVS = {1: torch.conv1d, 2: torch.conv2d, 3: torch.conv3d}


def _conv_pattern(conv):
    def pattern(x, w, b, stride, padding, dilation, groups):
        return conv(x, w, b, stride, padding, dilation, groups)

    return pattern


def _patch_pattern(x, w, b, stride, padding, dilation, groups):
    return torch.conv3d(x, w, b, stride, padding, dilation, groups).flatten(2).transpose(1, 2)


def _linear_over_channels(m: Match):
    def replacement(x, w, b, **_):
        return torch._C._nn.linear(x.movedim(1, -1), w.flatten(1), b).movedim(-1, 1)

    return replacement


def _check_1x1(m: Match):
    conv = m.first
    if not all(k == 1 for k in _kernel(conv)):
        return False
    _check_plain(conv, stride=(1,) * CONV[conv.target])


def _tokens(x, w, b, kernel: tuple):
    kt, kh, kw = kernel
    patches = x.unflatten(4, (-1, kw)).unflatten(3, (-1, kh)).unflatten(2, (-1, kt))  # B C T' kt H' kh W' kw
    patches = named(patches.permute(0, 2, 4, 6, 1, 3, 5, 7).flatten(4).flatten(1, 3), "patches")  # B L (C kt kh kw)
    return named(torch._C._nn.linear(patches, w.flatten(1), b), "tokens")


def _patches_to_linear(m: Match):
    def replacement(x, w, b, **_):
        return _tokens(x, w, b, _kernel(m.first))

    return replacement


def _patches_to_channels_first(m: Match):
    grid = tuple(shape(m.first)[2:])  # T' H' W', static (`_check_divisible`)

    def replacement(x, w, b, **_):
        return _tokens(x, w, b, _kernel(m.first)).unflatten(1, grid).permute(0, 4, 1, 2, 3)

    return replacement


def _check_patch(m: Match):
    conv, flatten, transpose = m.nodes
    if tuple(flatten.args[1:]) not in {(2,), (2, -1), (2, 4)} or tuple(sorted(transpose.args[1:])) != (1, 2):
        return False
    kernel = _kernel(conv)
    _check_plain(conv, stride=kernel)
    _check_divisible(conv, kernel)


def _check_bare_patch(m: Match):
    conv = m.first
    kernel = _kernel(conv)
    if _as_tuple(_conv_args(conv)["stride"], 3) != kernel or all(k == 1 for k in kernel):
        return False  # not a patchify (a 1x1x1 conv is conv1x1's)
    _check_plain(conv, stride=kernel)
    _check_divisible(conv, kernel)


def conv1x1_to_linear(gm: fx.GraphModule, context: RewriteContext = RewriteContext()) -> RewriteReport:
    _positional(gm, lambda n: _kernel(n) and all(k == 1 for k in _kernel(n)))
    patterns = [Pattern(_conv_pattern(conv), _linear_over_channels, _check_1x1) for conv in _CONVS.values()]
    return rewrite_patterns(gm, "conv1x1", patterns)


def _positional(gm: fx.GraphModule, candidate) -> None:
    """Write the `candidate` conv calls made with keywords (``F.conv2d(x, w, bias=None, padding=0)``, as
    Animate's motion encoder calls them) in the seven-argument form ``nn.ConvNd`` emits, the form the
    pattern states: the same call."""
    names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target in CONV and n.kwargs and candidate(n):
            args = _conv_args(n)
            n.args, n.kwargs = tuple(args[k] for k in names), {}
    gm.recompile()


def patch_embed_to_linear(gm: fx.GraphModule, context: RewriteContext = RewriteContext()) -> RewriteReport:
    patterns = [
        Pattern(_patch_pattern, _patches_to_linear, _check_patch),
        Pattern(_conv_pattern(torch.conv3d), _patches_to_channels_first, _check_bare_patch),
    ]
    return rewrite_patterns(gm, "patch_embed", patterns)


register(
    Rewrite(
        "conv1x1",
        conv1x1_to_linear,
        "conv1d/2d/3d with kernel 1, stride 1, no padding -> linear over the channel dim",
        order=30,
    )
)
register(
    Rewrite(
        "patch_embed",
        patch_embed_to_linear,
        "conv3d with kernel == stride -> linear over patches giving (B, L, D) (channels-first again where not flattened)",
        order=40,
        after=("conv1x1",),  # a k = s = 1 conv takes conv1x1's cheaper form
    )
)


def _conv_args(node: fx.Node) -> dict:
    names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
    defaults = (None, None, None, 1, 0, 1, 1)
    args = dict(zip(names, defaults))
    args.update(zip(names, node.args))
    args.update(node.kwargs)
    return args


def _kernel(node: fx.Node) -> tuple:
    weight = _conv_args(node)["weight"]
    return tuple(shape(weight)[2:]) if isinstance(weight, fx.Node) else ()


def _as_tuple(v, n: int) -> tuple:
    return tuple(v) if isinstance(v, (tuple, list)) else (v,) * n


def _check_plain(node: fx.Node, stride: tuple) -> None:
    a, n = _conv_args(node), CONV[node.target]
    padding = a["padding"]
    if padding == "valid":
        padding = 0
    if _as_tuple(a["stride"], n) != tuple(stride):
        raise Skip(f"stride {a['stride']} is not {tuple(stride)}")
    if isinstance(padding, str) or any(_as_tuple(padding, n)):
        raise Skip(f"padding {padding!r}")
    if any(d != 1 for d in _as_tuple(a["dilation"], n)) and any(k != 1 for k in _kernel(node)):
        raise Skip(f"dilation {a['dilation']}")
    if a["groups"] != 1:
        raise Skip(f"groups={a['groups']}")
    if len(shape(a["input"])) != n + 2:
        raise Skip(f"input has no batch dim: {shape(a['input'])}")


def _check_divisible(node: fx.Node, kernel: tuple) -> None:
    spatial = shape(_conv_args(node)["input"])[2:]
    if not static(spatial) or any(s % k for s, k in zip(spatial, kernel)):
        raise Skip(f"input extent {spatial} is not a static multiple of the kernel {kernel}")
