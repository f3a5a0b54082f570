"""Legalization: replace ops whose torch_xla lowering the SPMD partitioner cannot split well.

``layer_norm``: torch_xla lowers ``aten.native_layer_norm`` through XLA's batch-norm form on a
reshaped ``[1, tokens, D]`` operand, with the tokens as batch-norm's *feature* dim. GSPMD does not
partition that on the token dim, so a token-sharded (SP) activation is all-gathered before every
LayerNorm and sliced after it: on the tiny DiT under the tt-xla plan on 2x4, 7 all-gathers of the full
hidden state for 2 blocks (norm1/2/3 per block + norm_out) — the gathers DESIGN.md §4 first
attributed to K/V recomputation. Written as mean / centred mean-square / rsqrt, the same math is
a pair of reductions over D that GSPMD keeps token-local; the gathers disappear
(tests/test_lowering.py asserts both ways).

``linear`` on a 3-D x of batch B != 1 (a CFG pair's (2, L, D) stream): torch_xla flattens x to (B·L, D)
rows before the dot, and a token split under a whole batch is not one contiguous run of rows there, so
GSPMD gathers it before every projection. Written as ``einsum("blk,nk->bln")`` (`linear_unflattened`),
torch_xla emits one dot with B and L as free dims, which GSPMD partitions on either with no collective;
the planner's linear rule prices that form (`planner.rules.matmul.keeps_leading_dims`). Likewise
``scaled_dot_product_attention`` on (B, H, L, d) with B != 1: torch_xla's lowering merges (B, H) into one
bmm batch dim, and heads split under a whole batch are gathered first; written as two einsums with B and
H as the dots' batch dims and a softmax between (`sdpa_unflattened`) they stay split, as the attention rule
prices them (`planner.rules.attention`: batch and head splits pass through).

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
    Shardy would otherwise choose their layouts, `wancompile.constraints.insert_constraints`)."""
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


def linear_unflattened(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """F.linear with x's batch and token dims kept as the dot's free dims where the planner prices it so
    (`planner.rules.matmul.keeps_leading_dims`); else F.linear itself."""
    from planner.rules.matmul import keeps_leading_dims

    if not keeps_leading_dims("linear", tuple(x.shape)) or weight.dim() != 2:
        return F.linear(x, weight, bias)
    y = torch.einsum("blk,nk->bln", x, weight)
    return y if bias is None else y + bias


def sdpa_unflattened(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: Optional[torch.Tensor] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """F.scaled_dot_product_attention with (B, H) kept as the two products' batch dims for a 4-D query of
    batch B != 1 and H != 1 (no dropout, causality or grouped heads: the Wan DiT's attention); else the op itself.
    The math is SDPA's reference (scores, optional mask, softmax, weighted values); equal to rounding."""
    # batch or heads of 1 merge into one contiguous bmm batch: nothing to keep (e.g. the VAE's one-head attention)
    plain = query.dim() != 4 or query.shape[0] == 1 or query.shape[1] == 1 or dropout_p or is_causal or enable_gqa
    if plain or key.shape[:2] != query.shape[:2] or value.shape[:2] != query.shape[:2]:
        return F.scaled_dot_product_attention(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
        )
    scores = torch.einsum("bhld,bhmd->bhlm", query, key) * (query.shape[-1] ** -0.5 if scale is None else scale)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(attn_mask.logical_not(), float("-inf"))
        else:
            scores = scores + attn_mask
    return torch.einsum("bhlm,bhmd->bhld", scores.softmax(-1), value)


_REPLACEMENTS = {
    F.layer_norm: layer_norm_decomposed,
    torch.layer_norm: layer_norm_decomposed,
}
# the same op where the planner prices it so, else the op itself (decided per call on x's shape): not counted
_ROUTED = {
    F.linear: linear_unflattened,
    torch._C._nn.linear: linear_unflattened,
    F.scaled_dot_product_attention: sdpa_unflattened,
    torch._C._nn.scaled_dot_product_attention: sdpa_unflattened,
}


def legalize(gm: fx.GraphModule) -> tuple[fx.GraphModule, int]:
    """Return a copy of `gm` with SPMD-unfriendly ops replaced, and how many were replaced; device-only
    ``.to`` moves are dropped too (`drop_device_moves`, not counted), and linears routed through
    `linear_unflattened` (not counted: it is the op itself where the planner prices the flattened form)."""
    gm, _ = drop_device_moves(gm)
    count = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _REPLACEMENTS:
            node.target = _REPLACEMENTS[node.target]
            count += 1
        elif node.op == "call_function" and node.target in _ROUTED:
            node.target = _ROUTED[node.target]
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
