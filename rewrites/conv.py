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
a partitioned conv output (the partitioner bug of seed 000, ``docs/seeds.md``). The input's T, H and W must be
static multiples of the kernel (a conv would drop the remainder).
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ._core import (
    CONV,
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
    static,
)


def conv1x1_to_linear(gm: fx.GraphModule, context: RewriteContext = RewriteContext()) -> RewriteReport:
    where, skipped = [], []
    for node in list(gm.graph.nodes):
        if calls(node, CONV) and _kernel(node) and all(k == 1 for k in _kernel(node)):
            path = module_path(node)
            try:
                _check_plain(node, stride=(1,) * CONV[node.target])
                _conv1x1(gm.graph, node)
                where.append(path)
            except Skip as why:
                skipped.append(note(path, why))
    finish(gm)
    return report("conv1x1", where, skipped)


def patch_embed_to_linear(gm: fx.GraphModule, context: RewriteContext = RewriteContext()) -> RewriteReport:
    where, skipped = [], []
    for node in list(gm.graph.nodes):
        if calls(node, CONV) and CONV[node.target] == 3 and _tokens_out(node) is not None:
            path = module_path(node)
            try:
                kernel = _kernel(node)
                _check_plain(node, stride=kernel)
                _check_divisible(node, kernel)
                _patch_embed(gm.graph, node, kernel)
                where.append(path)
            except Skip as why:
                skipped.append(note(path, why))
    finish(gm)
    return report("patch_embed", where, skipped)


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


def _conv1x1(graph: fx.Graph, conv: fx.Node) -> None:
    a = _conv_args(conv)
    emit = Emitter(graph, conv, conv)
    x = emit.method("movedim", a["input"], 1, -1)
    y = emit.call(torch._C._nn.linear, x, emit.method("flatten", a["weight"], 1), a["bias"], name="linear")
    replace(conv, emit.method("movedim", y, -1, 1))


def _tokens_out(conv: fx.Node):
    """The ``transpose(1, 2)`` of ``conv.flatten(2).transpose(1, 2)``, when that is the conv's only use."""
    flatten = only_user(conv)
    if (
        flatten is None
        or not calls_method(flatten, "flatten")
        or tuple(flatten.args[1:]) not in {(2,), (2, -1), (2, 4)}
    ):
        return None
    transpose = only_user(flatten)
    if transpose is None or not calls_method(transpose, "transpose") or tuple(sorted(transpose.args[1:])) != (1, 2):
        return None
    return transpose


def _patch_embed(graph: fx.Graph, conv: fx.Node, kernel: tuple) -> None:
    a = _conv_args(conv)
    kt, kh, kw = kernel
    transpose = _tokens_out(conv)
    flatten = only_user(conv)
    emit = Emitter(graph, conv, conv)
    patches = emit.method("unflatten", a["input"], 4, (-1, kw))
    patches = emit.method("unflatten", patches, 3, (-1, kh))
    patches = emit.method("unflatten", patches, 2, (-1, kt))
    patches = emit.method("permute", patches, 0, 2, 4, 6, 1, 3, 5, 7)
    patches = emit.method("flatten", emit.method("flatten", patches, 4), 1, 3, name="patches")
    weight = emit.method("flatten", a["weight"], 1)
    tokens = emit.call(torch._C._nn.linear, patches, weight, a["bias"], name="tokens")
    replace(transpose, tokens)
    graph.erase_node(flatten)
    graph.erase_node(conv)
