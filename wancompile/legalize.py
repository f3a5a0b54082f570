"""Legalization: replace ops whose torch_xla lowering the SPMD partitioner cannot split well.

``layer_norm``: torch_xla lowers ``aten.native_layer_norm`` through XLA's batch-norm form on a
reshaped ``[1, tokens, D]`` operand, with the tokens as batch-norm's *feature* dim. GSPMD does not
partition that on the token dim, so a token-sharded (SP) activation is all-gathered before every
LayerNorm and sliced after it: on the tiny DiT under the tt-xla plan on 2x4, 7 all-gathers of the full
hidden state for 2 blocks (norm1/2/3 per block + norm_out) — the gathers DESIGN.md §4 first
attributed to K/V recomputation. Written as mean / centred mean-square / rsqrt, the same math is
a pair of reductions over D that GSPMD keeps token-local; the gathers disappear
(tests/test_lowering.py asserts both ways).

``t.to(<device>)``: dropped (`drop_device_moves`): dynamo bakes the traced-on device (the host) into
diffusers' ``shift.to(hidden_states.device)``; lowered, that copies to the host mid-trace and comes
back as a constant, which a replayed program would keep from its first call.

Tensor factories (``torch.tensor``, ``torch.arange``, ...) called with a device literal: retargeted to
the program's device (`place_factories`): dynamo bakes the traced-on host into e.g. SkyReels-V2's
``torch.tensor(fps, device=hidden_states.device)``, and a host tensor then meets XLA weights
(``embedding``: "Expected XLA tensor").

Both the sharded program and its one-device reference run the legalized graph, so verification
compares like with like; against the original op the decomposition differs by fp32 rounding only
(max-abs ~1e-7 on unit-scale activations, asserted in tests).
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
import torch.fx as fx
import torch.nn.functional as F


def layer_norm_decomposed(
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    eps: float = 1e-5,
    mark: Optional[Callable[[torch.Tensor, bool], None]] = None,
) -> torch.Tensor:
    """F.layer_norm as explicit reductions over the normalized dims (biased variance, as F.layer_norm).
    `mark(value, is_statistic)`, when given, is called on each intermediate (the lowering pins them:
    Shardy would otherwise choose their layouts, `wancompile.lowering.insert_constraints`)."""
    mark = mark or (lambda t, stat: None)
    dims = tuple(range(-len(normalized_shape), 0))
    mean = x.mean(dims, keepdim=True)
    mark(mean, True)
    centred = x - mean
    mark(centred, False)
    var = centred.square().mean(dims, keepdim=True)
    mark(var, True)
    y = centred * torch.rsqrt(var + eps)
    mark(y, False)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


_REPLACEMENTS = {F.layer_norm: layer_norm_decomposed, torch.layer_norm: layer_norm_decomposed}


def legalize(gm: fx.GraphModule) -> tuple[fx.GraphModule, int]:
    """Return a copy of `gm` with SPMD-unfriendly ops replaced, and how many were replaced; device-only
    ``.to`` moves are dropped too (`drop_device_moves`, not counted)."""
    gm, _ = drop_device_moves(gm)
    count = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _REPLACEMENTS:
            node.target = _REPLACEMENTS[node.target]
            count += 1
    gm.recompile()
    return gm, count


def drop_device_moves(gm: fx.GraphModule) -> tuple[fx.GraphModule, int]:
    """A copy of `gm` without ``t.to(<device>)`` calls that only name a device; returns it and how many went.

    diffusers writes ``t.to(x.device)`` in places (the DiT's ``norm_out`` shift/scale, the VAE causal
    conv's carried frames ``cache_x``). Dynamo records the device it traced with (the host CPU) as a
    literal, so the lowered program would copy the value to the host in mid-trace — a device
    execution — and read it back as a constant: frozen into a replayed program (the DiT's output then
    keeps the first call's timestep), or mixing host and XLA tensors (chunked-T ``torch.cat``). The
    lowered program runs every tensor on the XLA device, so such a move is an identity there."""
    gm = fx.GraphModule(gm, gm.graph.__deepcopy__())
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_method" or node.target != "to" or not isinstance(node.args[0], fx.Node):
            continue
        extra = set(node.kwargs) - {"device", "non_blocking", "copy"}
        devices = [*node.args[1:], *([node.kwargs["device"]] if "device" in node.kwargs else [])]
        if extra or len(devices) != 1 or not isinstance(devices[0], (torch.device, str)) or node.kwargs.get("copy"):
            continue
        if isinstance(devices[0], str) and devices[0].split(":")[0] not in ("cpu", "cuda", "xla", "meta"):
            continue  # a dtype name or something else, not a device
        node.replace_all_uses_with(node.args[0])
        gm.graph.erase_node(node)
        count += 1
    gm.graph.lint()
    gm.recompile()
    return gm, count


_FACTORIES = frozenset(
    {
        torch.tensor,
        torch.as_tensor,
        torch.arange,
        torch.zeros,
        torch.ones,
        torch.full,
        torch.empty,
        torch.linspace,
        torch.eye,
        torch.randn,
        torch.rand,
    }
)


def place_factories(gm: fx.GraphModule, device: torch.device) -> tuple[fx.GraphModule, int]:
    """A copy of `gm` whose tensor factories that name a device literal (the host dynamo traced on)
    create on `device` instead; returns it and how many were retargeted."""
    gm = fx.GraphModule(gm, gm.graph.__deepcopy__())
    count = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _FACTORIES:
            literal = node.kwargs.get("device")
            if isinstance(literal, (torch.device, str)) and torch.device(literal) != torch.device(device):
                node.kwargs = {**node.kwargs, "device": device}
                count += 1
    gm.recompile()
    return gm, count
