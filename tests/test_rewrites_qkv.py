"""qkv: the q/k/v projections of an attention become one head-interleaved linear + split."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from expecttest import assert_expected_inline
from torch.fx.interpreter import Interpreter

from rewrites import apply_rewrites

from conftest import capture, normalized_code

HEADS, HEAD_DIM = 4, 2


def wan_self_attention():
    """diffusers' WanAttention (dim 8, 2 heads of 4) as ``attn1`` of a block, without rope."""
    from diffusers.models.transformers.transformer_wan import WanAttention, WanAttnProcessor

    torch.manual_seed(0)
    block = nn.Module()
    block.attn1 = WanAttention(dim=8, heads=2, dim_head=4, processor=WanAttnProcessor()).eval()
    ((gm, inputs),) = capture(lambda x: block.attn1(x), torch.randn(1, 5, 8))
    return gm, inputs


class Projections(nn.Module):
    """The q/k/v projections of an attention, each reading its own input, heads split as diffusers does."""

    def __init__(self, bias_k: bool = True) -> None:
        super().__init__()
        self.to_q = nn.Linear(8, HEADS * HEAD_DIM)
        self.to_k = nn.Linear(8, HEADS * HEAD_DIM, bias=bias_k)
        self.to_v = nn.Linear(8, HEADS * HEAD_DIM)

    def forward(self, xq, xk, xv):
        q, k, v = (
            p(x).unflatten(2, (HEADS, -1)).transpose(1, 2)
            for p, x in ((self.to_q, xq), (self.to_k, xk), (self.to_v, xv))
        )
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


class Model(nn.Module):
    def __init__(self, **kwargs) -> None:
        super().__init__()
        self.attn = Projections(**kwargs)

    def forward(self, x, y, z):
        return self.attn(x, y, z)


def projections_graph(same_input: bool, **kwargs):
    torch.manual_seed(0)
    model = Model(**kwargs).eval()
    x = torch.randn(1, 3, 8)
    args = (x, x, x) if same_input else (x, torch.randn(1, 3, 8), torch.randn(1, 3, 8))
    ((gm, inputs),) = capture(model, *args)
    return gm, inputs


def test_golden_wan_self_attention():
    gm, inputs = wan_self_attention()
    with torch.no_grad():
        expected = gm(*inputs)[0]
    _, (report,) = apply_rewrites(gm, ["qkv"])
    assert report.where == ("attn1",)
    with torch.no_grad():
        assert (gm(*inputs)[0] - expected).abs().max().item() <= 1e-6
    assert_expected_inline(
        normalized_code(gm),
        """\
def forward(self, L_block_modules_attn1_modules_to_q_parameters_weight_ : torch.nn.parameter.Parameter, L_block_modules_attn1_modules_to_q_parameters_bias_ : torch.nn.parameter.Parameter, L_x_ : torch.Tensor, L_block_modules_attn1_modules_to_k_parameters_weight_ : torch.nn.parameter.Parameter, L_block_modules_attn1_modules_to_k_parameters_bias_ : torch.nn.parameter.Parameter, L_block_modules_attn1_modules_to_v_parameters_weight_ : torch.nn.parameter.Parameter, L_block_modules_attn1_modules_to_v_parameters_bias_ : torch.nn.parameter.Parameter, L_block_modules_attn1_modules_norm_q_parameters_weight_ : torch.nn.parameter.Parameter, L_block_modules_attn1_modules_norm_k_parameters_weight_ : torch.nn.parameter.Parameter, L_block_modules_attn1_modules_to_out_modules_0_parameters_weight_ : torch.nn.parameter.Parameter, L_block_modules_attn1_modules_to_out_modules_0_parameters_bias_ : torch.nn.parameter.Parameter):
    unflatten_3 = l_block_modules_attn1_modules_to_q_parameters_weight_.unflatten(0, (2, 4))
    unflatten_4 = l_block_modules_attn1_modules_to_k_parameters_weight_.unflatten(0, (2, 4))
    unflatten_5 = l_block_modules_attn1_modules_to_v_parameters_weight_.unflatten(0, (2, 4))
    cat = torch.cat([unflatten_3, unflatten_4, unflatten_5], 1)
    packed_weight = cat.flatten(0, 1)
    unflatten_6 = l_block_modules_attn1_modules_to_q_parameters_bias_.unflatten(0, (2, 4))
    unflatten_7 = l_block_modules_attn1_modules_to_k_parameters_bias_.unflatten(0, (2, 4))
    unflatten_8 = l_block_modules_attn1_modules_to_v_parameters_bias_.unflatten(0, (2, 4))
    cat_1 = torch.cat([unflatten_6, unflatten_7, unflatten_8], 1)
    packed_bias = cat_1.flatten(0, 1)
    qkv = torch._C._nn.linear(l_x_, packed_weight, packed_bias)
    unflatten_9 = qkv.unflatten(-1, (2, 3, 4))
    unbind = unflatten_9.unbind(-2)
    getitem = unbind[0]
    flatten_1 = getitem.flatten(-2)
    getitem_1 = unbind[1]
    flatten_2 = getitem_1.flatten(-2)
    getitem_2 = unbind[2]
    flatten_3 = getitem_2.flatten(-2)
    query_1 = torch.rms_norm(flatten_1, (8,), l_block_modules_attn1_modules_norm_q_parameters_weight_, 1e-05)
    key_1 = torch.rms_norm(flatten_2, (8,), l_block_modules_attn1_modules_norm_k_parameters_weight_, 1e-05)
    query_2 = query_1.unflatten(2, (2, -1))
    key_2 = key_1.unflatten(2, (2, -1))
    value_1 = flatten_3.unflatten(2, (2, -1))
    query_3 = query_2.permute(0, 2, 1, 3)
    key_3 = key_2.permute(0, 2, 1, 3)
    value_2 = value_1.permute(0, 2, 1, 3)
    out = torch._C._nn.scaled_dot_product_attention(query = query_3, key = key_3, value = value_2, attn_mask = None, dropout_p = 0.0, is_causal = False, scale = None, enable_gqa = False)
    out_1 = out.permute(0, 2, 1, 3)
    hidden_states = out_1.flatten(2, 3)
    hidden_states_1 = hidden_states.type_as(query_2)
    hidden_states_2 = torch._C._nn.linear(hidden_states_1, l_block_modules_attn1_modules_to_out_modules_0_parameters_weight_, l_block_modules_attn1_modules_to_out_modules_0_parameters_bias_)
    hidden_states_3 = torch.nn.functional.dropout(hidden_states_2, 0.0, False, False)
    return (hidden_states_3,)""",
    )


def test_packed_weight_is_head_interleaved_so_any_tp_split_of_dim_0_gives_whole_qkv_heads():
    gm, inputs = projections_graph(same_input=True)
    apply_rewrites(gm, ["qkv"])
    interpreter = Interpreter(gm, garbage_collect_values=False)
    with torch.no_grad():
        interpreter.run(*inputs)
    packed = next(v for n, v in interpreter.env.items() if n.name == "packed_weight")
    placeholders = [n.target for n in gm.graph.nodes if n.op == "placeholder"]
    wq, wk, wv = (
        next(v for p, v in zip(placeholders, inputs) if f"{role}_parameters_weight" in p)
        for role in ("to_q", "to_k", "to_v")
    )
    for tp in (1, 2, 4):  # every TP degree that divides the 4 heads
        for device, shard in enumerate(packed.chunk(tp, dim=0)):
            heads = slice(device * HEADS // tp * HEAD_DIM, (device + 1) * HEADS // tp * HEAD_DIM)
            per_head = shard.unflatten(0, (HEADS // tp, 3, HEAD_DIM))
            for i, w in enumerate((wq, wk, wv)):
                assert torch.equal(per_head[:, i].flatten(0, 1), w[heads])


@pytest.mark.parametrize(
    "graph,why",
    [
        (dict(same_input=False), "attn: to_k and to_v read different inputs (l_y_, l_z_)"),
        (dict(same_input=True, bias_k=False), "attn: to_q, to_v has a bias but to_k has none"),
    ],
    ids=["reading-different-inputs", "disagreeing-on-bias"],
)
def test_projections_that_cannot_be_packed_are_left_alone_with_the_reason(graph, why):
    gm, _ = projections_graph(**graph)
    before = gm.code
    _, (report,) = apply_rewrites(gm, ["qkv"])
    assert report.count == 0
    assert report.skipped == (why,)
    assert gm.code == before


def test_head_count_must_be_provable():
    class NoHeadSplit(Model):
        def forward(self, x, y, z):
            a = self.attn
            return a.to_q(x) + a.to_k(x) + a.to_v(x)

    torch.manual_seed(0)
    ((gm, _),) = capture(NoHeadSplit().eval(), *[torch.randn(1, 3, 8)] * 3)
    before = gm.code
    _, (report,) = apply_rewrites(gm, ["qkv"])
    assert report.count == 0 and "head count not found" in report.skipped[0]
    assert gm.code == before


def test_cross_attention_fuses_k_and_v_on_the_prompt(dit):
    gm, _ = dit
    apply_rewrites(gm, ["qkv"])
    kv = [n for n in gm.graph.nodes if n.name.startswith("kv") and n.target is torch._C._nn.linear]
    assert len(kv) == 2
    assert all(n.args[0].name == "hidden_states_5" for n in kv)  # the text embedder's output
    assert all(tuple(n.meta["example_value"].shape) == (1, 7, 2 * 64) for n in kv)


def test_a_packed_weight_the_plan_gathers_is_read_through_a_pinned_copy_like_a_parameter():
    """The tt fuzz's t26 (10 heads on 1x8, SP + FSDP at its smallest budget, bf16, every rewrite): the qkv linear
    reads its packed weight gathered where it is stored split. A parameter read so goes through a constrained view
    (`planner.pins.READ_PIN_REASON`), else Shardy contracts over the split instead of gathering it (an all-to-all
    and a reduce-scatter per block, measured); the packed weight is read the same way."""
    import sys
    from pathlib import Path

    from planner.pins import READ_PIN_REASON, pin_layouts
    from planner.plan import MemoryBudgetError
    from wancompile.backend import rewrite_graph
    from wancompile.capture import annotate, capture_fx
    from wancompile.options import Options
    from wancompile.planning import request_for, solve

    sys.path.insert(0, str(Path(__file__).parent))
    from fuzz_cases import build
    from tt_fuzz_cases import ALL

    model, inputs = build(ALL["t26-1x8-10h16-L3-ffn40-lat3x5x3-p111-txt1-bf16-min"])
    gm = capture_fx(model, **inputs, return_dict=False)

    def plan_at(memory_gb):
        opts = Options.from_user({"mesh": "1x8", "target": "tt-mlir", "rewrites": "all", "memory_gb": memory_gb})
        request = request_for(opts, opts.mesh)
        graph = annotate(rewrite_graph(gm, request, opts.rewrites)[0], model="wan-dit")
        return graph, solve(graph, request)

    with pytest.raises(MemoryBudgetError) as e:
        plan_at(1e-9)
    graph, plan = plan_at(e.value.need_gb)
    qkv = next(n for n in graph if str(n.location) == "blocks.0.attn1:linear#0")
    assert graph[qkv.inputs[1]].op == "flatten" and not graph[qkv.inputs[1]].is_param  # the packed weight
    reads = [a for a in pin_layouts(graph, plan).activations if a.reason == READ_PIN_REASON]
    assert any(a.location == qkv.location and a.input == 1 and all(x is None for x in a.spec) for a in reads), reads
