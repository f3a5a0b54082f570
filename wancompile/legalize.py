"""Legalization: replace ops whose torch_xla lowering the SPMD partitioner cannot split well.

``layer_norm``: torch_xla lowers ``aten.native_layer_norm`` through XLA's batch-norm form on a
reshaped ``[1, tokens, D]`` operand, with the tokens as batch-norm's *feature* dim. GSPMD does not
partition that on the token dim, so a token-sharded (SP) activation is all-gathered before every
LayerNorm and sliced after it: on the tiny DiT under the tt-xla plan on 2x4, 7 all-gathers of the full
hidden state for 2 blocks (norm1/2/3 per block + norm_out) — the gathers DESIGN.md §4 first
attributed to K/V recomputation. Written as mean / centred mean-square / rsqrt, the same math is
a pair of reductions over D that GSPMD keeps token-local; the gathers disappear
(tests/test_lowering.py asserts both ways).

Both the sharded program and its one-device reference run the legalized graph, so verification
compares like with like; against the original op the decomposition differs by fp32 rounding only
(max-abs ~1e-7 on unit-scale activations, asserted in tests).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.fx as fx
import torch.nn.functional as F


def layer_norm_decomposed(x: torch.Tensor, normalized_shape: Sequence[int], weight: Optional[torch.Tensor] = None,
                          bias: Optional[torch.Tensor] = None, eps: float = 1e-5) -> torch.Tensor:
    """F.layer_norm as explicit reductions over the normalized dims (biased variance, as F.layer_norm)."""
    dims = tuple(range(-len(normalized_shape), 0))
    mean = x.mean(dims, keepdim=True)
    centred = x - mean
    y = centred * torch.rsqrt(centred.square().mean(dims, keepdim=True) + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


_REPLACEMENTS = {F.layer_norm: layer_norm_decomposed, torch.layer_norm: layer_norm_decomposed}


def legalize(gm: fx.GraphModule) -> tuple[fx.GraphModule, int]:
    """Return a copy of `gm` with SPMD-unfriendly ops replaced, and how many were replaced."""
    gm = fx.GraphModule(gm, gm.graph.__deepcopy__())
    count = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _REPLACEMENTS:
            node.target = _REPLACEMENTS[node.target]
            count += 1
    gm.recompile()
    return gm, count
