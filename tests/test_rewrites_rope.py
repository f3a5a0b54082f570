"""rope: the rotary embedding's strided writes into empty_like become stack + flatten, bit for bit."""

from __future__ import annotations

import operator

import torch
from expecttest import assert_expected_inline

from rewrites import apply_rewrites

from conftest import capture, normalized_code


def apply_rotary_emb(hidden_states, freqs_cos, freqs_sin):
    """diffusers' WanAttnProcessor.apply_rotary_emb, verbatim."""
    x1, x2 = hidden_states.unflatten(-1, (-1, 2)).unbind(-1)
    cos = freqs_cos[..., 0::2]
    sin = freqs_sin[..., 1::2]
    out = torch.empty_like(hidden_states)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(hidden_states)


def rope_inputs(tables=torch.float64):
    torch.manual_seed(0)
    angles = torch.randn(1, 5, 1, 8, dtype=tables)
    return torch.randn(1, 5, 2, 8), angles.cos(), angles.sin()


def rewritten(fn, *args):
    ((gm, inputs),) = capture(fn, *args)
    _, (report,) = apply_rewrites(gm, ["rope"])
    return gm, inputs, report


def test_golden_wan_rotary_embedding():
    gm, _, report = rewritten(apply_rotary_emb, *rope_inputs())
    assert report.count == 1
    assert_expected_inline(
        normalized_code(gm),
        """\
def forward(self, L_hidden_states_ : torch.Tensor, L_freqs_cos_ : torch.Tensor, L_freqs_sin_ : torch.Tensor):
    unflatten = l_hidden_states_.unflatten(-1, (-1, 2))
    unbind = unflatten.unbind(-1)
    x1 = unbind[0]
    x2 = unbind[1]
    cos = l_freqs_cos_[(Ellipsis, slice(0, None, 2))]
    sin = l_freqs_sin_[(Ellipsis, slice(1, None, 2))]
    mul = x1 * cos
    mul_1 = x2 * sin
    sub = mul - mul_1
    mul_2 = x1 * sin
    mul_3 = x2 * cos
    add = mul_2 + mul_3
    stack = torch.stack([sub, add], -1)
    rotated = stack.flatten(-2)
    to = rotated.to(torch.float32)
    type_as = to.type_as(l_hidden_states_)
    return (type_as,)""",
    )


def test_rewrite_is_bit_exact_with_float64_and_float32_tables():
    for tables in (torch.float64, torch.float32):
        args = rope_inputs(tables)
        gm, inputs, report = rewritten(apply_rotary_emb, *args)
        assert report.count == 1
        assert torch.equal(gm(*inputs)[0], apply_rotary_emb(*args))


def test_no_scatter_or_empty_like_is_left_in_the_dit(dit):
    gm, _ = dit
    apply_rewrites(gm, ["rope"])
    leftovers = [n for n in gm.graph.nodes if n.target in (torch.empty_like, operator.setitem)]
    assert leftovers == []


def test_an_output_read_between_its_two_writes_is_left_alone():
    def half_written(x, cos, sin):
        out = torch.empty_like(x)
        out[..., 0::2] = x[..., 0::2] * cos
        peek = out.sum()
        out[..., 1::2] = x[..., 1::2] * sin
        return out, peek

    x, cos, sin = rope_inputs(torch.float32)
    gm, _, report = rewritten(half_written, x, cos[..., ::2], sin[..., ::2])
    assert report.count == 0
    assert report.skipped == ("<root>: out is not written by exactly two setitems before it is read",)
