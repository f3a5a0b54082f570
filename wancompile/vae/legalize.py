"""The causal convs' spatial zero padding folded into the convolution, for spatially split decodes.

`WanCausalConv3d` pads H, W (and T, causally) with `F.pad` and convolves with padding 0. Under an
H/W split GSPMD shards the padded tensor evenly by ``ceil((H + 2) / n)`` rows: when ``H + 2`` does
not divide by n the shards no longer line up with the output's, and the partitioner adds a
realignment collective-permute and uneven halos (measured on 2x2 with H split 4 ways: 3 permutes per
conv instead of 2, 2.4x the bytes). Written as `F.pad` of T only and a conv3d with padding
(0, ph, pw) the same zeros are added inside the convolution, which GSPMD partitions as a plain halo
exchange (one row from each neighbour per split dim). Numerically identical (zeros either way).
"""

from __future__ import annotations

import torch
import torch.fx as fx
import torch.nn.functional as F


def fold_conv_padding(gm: fx.GraphModule) -> tuple[fx.GraphModule, int]:
    """A copy of `gm` with every ``conv3d(pad(x, (w, w, h, h, t0, t1)), padding=0)`` written as
    ``conv3d(pad(x, (0, 0, 0, 0, t0, t1)), padding=(0, h, w))``; returns it and how many were folded."""
    gm = fx.GraphModule(gm, gm.graph.__deepcopy__())
    count = 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in (F.conv3d, torch.conv3d):
            continue
        src = node.args[0]
        if not (isinstance(src, fx.Node) and src.op == "call_function" and _is_pad(src.target) and len(src.users) == 1):
            continue
        pads = list(src.args[1]) if len(src.args) > 1 else list(src.kwargs.get("pad", ()))
        mode = src.args[2] if len(src.args) > 2 else src.kwargs.get("mode", "constant")
        value = src.args[3] if len(src.args) > 3 else src.kwargs.get("value", None)
        args = list(node.args) + [None] * (7 - len(node.args))
        stride, padding, dilation, groups = args[3] or 1, args[4] or 0, args[5] or 1, args[6] or 1
        if len(pads) != 6 or mode != "constant" or value not in (None, 0, 0.0) or tuple(_triple(padding)) != (0, 0, 0):
            continue
        if pads[0] != pads[1] or pads[2] != pads[3] or not (pads[0] or pads[2]):
            continue
        src.args = (src.args[0], [0, 0, 0, 0, pads[4], pads[5]]) + tuple(src.args[2:])
        _unpad_meta(src, pads)
        node.args = (args[0], args[1], args[2], stride, (0, pads[2], pads[0]), dilation, groups)
        count += 1
    gm.recompile()
    return gm, count


def _is_pad(target) -> bool:
    return target is F.pad or getattr(target, "__name__", "") == "pad"


def _triple(v) -> tuple:
    return tuple(v) if isinstance(v, (list, tuple)) else (v, v, v)


def _unpad_meta(node: fx.Node, pads: list) -> None:
    """The pad's recorded output (dynamo's FakeTensor) without the H/W padding now inside the conv."""
    for key in ("example_value", "val"):
        old = node.meta.get(key)
        if isinstance(old, torch.Tensor):
            h, w = pads[2] + pads[3], pads[0] + pads[1]
            shape = (*old.shape[:-2], old.shape[-2] - h, old.shape[-1] - w)
            mode = getattr(old, "fake_mode", None)
            if mode is not None:
                with mode:
                    node.meta[key] = old.new_empty(shape)
            else:
                node.meta[key] = old.new_empty(shape)
