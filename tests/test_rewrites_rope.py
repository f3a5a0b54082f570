"""rope: the rotary embedding's strided writes into empty_like become stack + flatten, bit for bit; for a target
that fuses RoPE (tt-mlir), Wan's rotation becomes the rotate-half form on [B, heads, tokens, D], bit for bit."""

from __future__ import annotations

import operator

import pytest
import torch
from expecttest import assert_expected_inline

from rewrites import RewriteContext, apply_rewrites

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


def rewritten(fn, *args, rotary_kernel=False):
    ((gm, inputs),) = capture(fn, *args)
    _, (report,) = apply_rewrites(gm, ["rope"], RewriteContext(rotary_kernel=rotary_kernel))
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


def test_golden_rotary_form_for_a_target_that_fuses_rope():
    gm, _, report = rewritten(apply_rotary_emb, *rope_inputs(), rotary_kernel=True)
    assert report.count == 1
    assert_expected_inline(
        normalized_code(gm),
        """\
def forward(self, L_hidden_states_ : torch.Tensor, L_freqs_cos_ : torch.Tensor, L_freqs_sin_ : torch.Tensor):
    cos = l_freqs_cos_[(Ellipsis, slice(0, None, 2))]
    sin = l_freqs_sin_[(Ellipsis, slice(1, None, 2))]
    unflatten_1 = l_hidden_states_.unflatten(-1, (4, 2))
    permute = unflatten_1.permute(0, 2, 1, 4, 3)
    flatten = permute.flatten(-2)
    to = flatten.to(torch.float64)
    transpose = cos.transpose(1, 2)
    transpose_1 = sin.transpose(1, 2)
    cat = torch.cat([transpose, transpose], -1)
    cat_1 = torch.cat([transpose_1, transpose_1], -1)
    getitem_4 = to[(Ellipsis, slice(4, None, None))]
    neg = -getitem_4
    getitem_5 = to[(Ellipsis, slice(None, 4, None))]
    cat_2 = torch.cat([neg, getitem_5], -1)
    mul_4 = to * cat
    mul_5 = cat_2 * cat_1
    rotary = mul_4 + mul_5
    unflatten_2 = rotary.unflatten(-1, (2, 4))
    permute_1 = unflatten_2.permute(0, 2, 1, 4, 3)
    flatten_1 = permute_1.flatten(-2)
    to_1 = flatten_1.to(torch.float32)
    type_as = to_1.type_as(l_hidden_states_)
    return (type_as,)""",
    )


def test_rotary_form_is_bit_exact_for_every_table_and_activation_dtype():
    """float64 tables (diffusers) or float32 ones, fp32 or bf16 activations (a bf16 pipeline): the same bits as
    diffusers' strided writes, and nothing of the strided form left."""
    for tables in (torch.float64, torch.float32):
        for dtype in (torch.float32, torch.bfloat16):
            x, cos, sin = rope_inputs(tables)
            gm, inputs, report = rewritten(apply_rotary_emb, x.to(dtype), cos, sin, rotary_kernel=True)
            assert report.count == 1
            assert torch.equal(gm(*inputs)[0], apply_rotary_emb(x.to(dtype), cos, sin)), (tables, dtype)
            assert not [n for n in gm.graph.nodes if n.op == "call_method" and n.target == "unbind"]


def test_writes_that_are_not_wans_rotation_keep_the_stack_form_for_a_fusing_target():
    """Two lane writes of other values (no rotation of x's pairs) are unscattered as before: the stack form."""

    def scaled(x, cos, sin):
        out = torch.empty_like(x)
        out[..., 0::2] = x[..., 0::2] * cos
        out[..., 1::2] = x[..., 1::2] * sin
        return out

    x, cos, sin = rope_inputs(torch.float32)
    gm, inputs, report = rewritten(scaled, x, cos[..., ::2], sin[..., ::2], rotary_kernel=True)
    assert report.count == 1
    assert [n.target for n in gm.graph.nodes if n.op == "call_function" and n.target is torch.stack] == [torch.stack]
    assert torch.equal(gm(*inputs)[0], scaled(x, cos[..., ::2], sin[..., ::2]))


def _reorders(gm):
    """The rotary form's reorders of the head dim's pairs: [B, S, H, D/2, 2] <-> [B, H, S, 2, D/2]."""
    return [
        n for n in gm.graph.nodes if n.op == "call_method" and n.target == "permute" and n.args[1:] == (0, 2, 1, 4, 3)
    ]


@pytest.mark.parametrize("passes", [["rope"], ["qkv", "rope"]])
def test_rotary_q_and_k_that_meet_only_each_other_stay_in_halves_order(dit, passes):
    """In the DiT every self-attention reads a rotated q and k and nothing else does: both stay in halves order,
    and the reorder into it is made once on the projections' rows and the q/k norms' weights (separate or packed
    by `qkv`), so no per-call op reorders the head dim's pairs. The output is the original's up to the order of
    the head-dim sums (q . k, the norms' mean square; fp32)."""
    gm, inputs = dit
    expected = gm(*inputs)[0]
    reports = apply_rewrites(gm, passes, RewriteContext(rotary_kernel=True))[1]
    assert reports[-1].count == 4 and _reorders(gm) == []  # q and k of 2 blocks
    halves = [n for n in gm.graph.nodes if n.op == "call_method" and n.target == "unflatten" and n.args[1:2] == (0,)]
    halves = [n for n in halves if len(n.args[2]) == 3]
    # each block's q and k: the weight, the bias and the norm's weight, each a parameter
    assert len(halves) == 12 and all(n.args[0].op == "placeholder" for n in halves)
    got = gm(*inputs)[0]
    assert (got - expected).abs().max() <= 1e-5 * expected.abs().max()


def test_a_projection_read_elsewhere_keeps_the_reorder_per_call():
    """Where the projection's output is also read by something else, its rows stay as they are and the rotated
    input is reordered per call (the reorder back is still dropped: q and k meet only each other)."""

    def attention(x, w, g, cos, sin):
        y = torch.nn.functional.linear(x, w)
        q = torch.rms_norm(y, (16,), g, 1e-6).unflatten(2, (2, -1))
        q = apply_rotary_emb(q, cos, sin)
        k = apply_rotary_emb(x.unflatten(2, (2, -1)), cos, sin)
        v = x.flip(1).unflatten(2, (2, -1))
        out = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return out, y

    torch.manual_seed(0)
    x, w, g = torch.randn(1, 5, 16), torch.randn(16, 16), torch.randn(16)
    _, cos, sin = rope_inputs(torch.float32)
    args = (x, w, g, cos, sin)
    gm, inputs, report = rewritten(attention, *args, rotary_kernel=True)
    assert report.count == 2 and len(_reorders(gm)) == 2  # in, for q and for k
    for got, want in zip(gm(*inputs), attention(*args)):
        assert torch.allclose(got, want, atol=1e-6)


def test_a_rotated_q_read_elsewhere_keeps_the_reorder_back_and_every_bit():
    """A rotated q also returned (read by something that is not its attention with the rotated k) goes back to
    diffusers' lane order, and so does the k it meets: the attention and the extra output are bit for bit."""

    def attention_and_query(q, k, v, cos, sin):
        q, k = apply_rotary_emb(q, cos, sin), apply_rotary_emb(k, cos, sin)
        out = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return out, q

    x, cos, sin = rope_inputs(torch.float32)
    args = (x, x.flip(1), x.flip(2), cos, sin)
    gm, inputs, report = rewritten(attention_and_query, *args, rotary_kernel=True)
    reorders = _reorders(gm)
    assert report.count == 2 and len(reorders) == 4  # in and back, for q and for k
    for got, want in zip(gm(*inputs), attention_and_query(*args)):
        assert torch.equal(got, want)
