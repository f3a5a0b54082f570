"""Padded heads: a DiT whose 12 heads the 8 devices of a 1x8 mesh do not divide gets head-TP and
Ulysses on 16 heads (4 of them zero) as options beside SP and replicated, priced on the padded graph;
the ILP takes one only where it is cheaper, and the compiled program is the unpadded model's.

The model: the tiny DiT with 12 heads x 32 (D = 384), latent (4, 9, 32, 32) -> 2304 tokens, priced for
``tpu-v6e-8``. There the self-attention's ``Ulysses(model)+pad(12->16)`` beats ``SP(model)+KV-gather``
(4 all-to-alls of a 16-head shard vs 2 all-gathers of full-width K/V, at 16/12 of the attention's
FLOPs); cross-attention (7 prompt tokens) stays SP.
"""

import json

import pytest
import torch

from planner.autoplan import plan_graph
from planner.mesh import MeshSpec
from planner.plan import HeadPadding, PlanError
from planner.request import PlanRequest
from wancompile.verify import compare_collectives, numerics, run_with_backend

from conftest import capture

pytestmark = pytest.mark.usefixtures("spmd")

HEADS = dict(num_attention_heads=12, attention_head_dim=32)
PAD = "Ulysses(model)+pad(12->16)"


def model12(device="cpu"):
    from wancompile.models import build_transformer

    return build_transformer("tiny", device=device, **HEADS)


def inputs(frames=9, side=32, device="cpu"):
    g = torch.Generator().manual_seed(1)
    x = {
        "hidden_states": torch.randn(1, 4, frames, side, side, generator=g),
        "encoder_hidden_states": torch.randn(1, 7, 32, generator=g),
        "timestep": torch.full((1,), 500, dtype=torch.long),
    }
    return {k: v.to(device) for k, v in x.items()}


@pytest.fixture(scope="module")
def graph12():
    """(rewritten GraphModule, planner graph, the backend's padder) of the 12-head DiT on the meta device."""
    from wancompile.backend import HeadPadder, rewrite_graph
    from wancompile.capture import annotate, capture_module

    _, gm = capture_module(model12("meta"), **inputs(device="meta"), return_dict=False, model="tiny12")
    gm, _ = rewrite_graph(gm, PlanRequest.make(MeshSpec((1, 8), ("batch", "model"))), ("qkv", "rmsnorm", "rope"))
    graph = annotate(gm, model="tiny12")
    return gm, graph, HeadPadder(gm, graph)


def decision(plan, macro):
    return next(d for d in plan.decisions if d.macro == macro)


@pytest.mark.parametrize("rewrites", [(), ("qkv", "rmsnorm", "rope")], ids=["unfused", "qkv-fused"])
def test_the_padded_graph_computes_the_model(rewrites):
    """16 heads in every SDPA, 4 of them zero; out = the unpadded graph's (rms_norm across heads
    corrected to the real width)."""
    from rewrites.pad_heads import pad_heads
    from wancompile.backend import rewrite_graph

    model, x = model12(), inputs(frames=5, side=16)
    ((gm, example),) = capture(lambda **k: model(**k, return_dict=False), **x)
    gm, _ = rewrite_graph(gm, PlanRequest.make(MeshSpec((1, 8), ("batch", "model"))), rewrites)
    padded = torch.fx.GraphModule(gm, gm.graph.__deepcopy__())
    report = pad_heads(padded, {"*.attn1": 16, "*.attn2": 16})
    padded.recompile()
    assert report.count == 4 and not report.skipped, report  # 2 blocks x (self, cross)
    sdpa = [n for n in padded.graph.nodes if "scaled_dot_product_attention" in str(n.target)]
    assert [n.meta["example_value"].shape[1] for n in sdpa] == [16] * 4
    with torch.no_grad():
        want, got = gm(*example)[0], padded(*example)[0]
    result = numerics(got, want)
    assert result.pcc >= 0.99999 and result.max_abs <= 1e-5, result


def test_without_the_norm_correction_zero_heads_change_the_result():
    """The control: rms_norm over 16 x d features of which 12 x d are real, uncorrected (the
    model's eps and gamma), is not the model — the correction is what makes padding exact."""
    from rewrites.pad_heads import pad_heads

    model, x = model12(), inputs(frames=5, side=16)
    ((gm, example),) = capture(lambda **k: model(**k, return_dict=False), **x)
    padded = torch.fx.GraphModule(gm, gm.graph.__deepcopy__())
    pad_heads(padded, {"*.attn1": 16})
    norms = [n for n in padded.graph.nodes if n.target is torch.rms_norm and n.args[1] == (16 * 32,)]
    assert len(norms) == 4  # norm_q, norm_k of 2 blocks
    for n in norms:
        gamma_pad = n.args[2]
        scaled = gamma_pad.args[0]
        gamma_pad.args = (scaled.args[0],) + gamma_pad.args[1:]  # the model's gamma, unscaled
        n.args = n.args[:3] + (n.args[3] * 16 / 12,)  # the model's eps
    padded.recompile()
    with torch.no_grad():
        result = numerics(padded(*example)[0], gm(*example)[0])
    assert result.max_abs > 1e-3, result


def test_padding_is_priced_and_chosen_where_it_is_cheaper(graph12):
    _, graph, padder = graph12
    plan = plan_graph(graph, MeshSpec((1, 8), ("batch", "model")), "tpu-v6e-8", pad_heads=padder)

    attn1 = decision(plan, "attn1")
    assert attn1.strategy == PAD
    assert attn1.pad_heads == HeadPadding("blocks.*.attn1", 12, 16)
    # the best rejected alternative, with its whole-plan price: SP with K/V all-gathered
    assert attn1.rejected == "SP(model)+KV-gather" and attn1.rejected_cost > attn1.cost
    names = {o.name: o for o in attn1.options}
    assert {"replicated", "SP(model)+KV-gather", PAD, "head-TP(model)+pad(12->16)"} <= set(names)
    # the padded weights are a copy beside the model's: Ulysses keeps weights whole, so per block the
    # 16-head q, k, v (weights and biases) and to_out's 16-head-wide weight, fp32, on every device
    copies = 2 * 4 * (3 * (512 * 384 + 512) + 384 * 512)
    extra = names[PAD].param_bytes_per_device - names["SP(model)+KV-gather"].param_bytes_per_device
    assert extra == pytest.approx(copies, abs=2048)  # the ILP counts KiB
    # the unpadded splits stay excluded, with the reason
    assert any("12 heads do not divide" in x.reason for x in attn1.excluded)

    attn2 = decision(plan, "attn2")  # cross-attention: padded head-TP priced, SP cheaper
    assert attn2.pad_heads is None and not attn2.strategy.endswith("pad(12->16)")
    assert any(o.name.startswith("head-TP(model)") and o.name.endswith("+pad(12->16)") for o in attn2.options)

    assert plan.head_padding == {"blocks.*.attn1": 16}
    assert plan.geometry["heads"] == 12  # the model's, not the padded graph's
    data = json.loads(json.dumps(plan.to_json()))
    rows = {d["macro"]: d for d in data["decisions"]}
    assert rows["attn1"]["pad_heads"] == {"module": "blocks.*.attn1", "heads": 12, "padded": 16}
    assert "pad_heads" not in rows["attn2"]


def test_the_padded_option_is_priced_on_the_padded_shapes(graph12):
    """The rules price the padded graph: the attention's projections and SDPA do 16/12 of the work,
    its glue (norm1 on the stream) the same."""
    from planner.autoplan import DitFamily
    from planner.hardware import get_profile
    from planner.propagate import evaluate

    _, graph, padder = graph12
    mesh, hw = MeshSpec((1, 8), ("batch", "model")), get_profile("tpu-v6e-8")
    family = DitFamily(graph, PlanRequest.make(mesh, hw, pad_heads=padder))
    attn1 = next(m for m in family.st.block_macros if m.name == "attn1")
    padded, attn1_16 = family.variant("attn1")
    assert (attn1.width, attn1_16.width) == (12, 16)

    def flops(g, macro, ops):
        return evaluate(g, [g[n] for n in macro.nodes if g[n].op in ops], mesh, hw, boundary={}).flops

    heavy = ("linear", "scaled_dot_product_attention")
    assert flops(padded.g, attn1_16, heavy) == pytest.approx(flops(graph, attn1, heavy) * 16 / 12)
    glue = flops(graph, attn1, ("layer_norm",))  # norm1 on the stream: not the heads' work
    assert glue > 0 and flops(padded.g, attn1_16, ("layer_norm",)) == glue


def test_padded_options_lose_where_padding_does_not_pay(graph12):
    """The default 1x8 profile (wh-loudbox): padded options priced, none chosen."""
    _, graph, padder = graph12
    plan = plan_graph(graph, MeshSpec((1, 8), ("batch", "model")), pad_heads=padder)
    attn1 = decision(plan, "attn1")
    padded = [o for o in attn1.options if o.name.endswith("+pad(12->16)")]
    assert padded and attn1.pad_heads is None and plan.head_padding == {}
    assert all(o.seconds_own > attn1.option(attn1.strategy).seconds_own for o in padded)


def test_a_mesh_that_divides_the_heads_pads_nothing(graph12):
    _, graph, padder = graph12
    asked = []

    def recording(pads):
        asked.append(pads)
        return padder(pads)

    plan = plan_graph(graph, MeshSpec((2, 2), ("batch", "model")), "tpu-v6e-8", pad_heads=recording)
    assert asked == []  # 12 heads divide every split of 2x2 (2, 2, 4): no padded graph made
    assert plan.head_padding == {}
    assert not any("pad(" in o.name for d in plan.decisions for o in d.options)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    dump = tmp_path_factory.mktemp("padded-dump")
    model, x = model12(), inputs()
    out, _, program = run_with_backend(model, x, reference=False, mesh="1x8", hardware="tpu-v6e-8", dump_dir=dump)
    with torch.no_grad():
        eager = model(**x, return_dict=False)[0]
    return model, x, out[0], eager, program, dump


@pytest.mark.slow
def test_compiled_padded_plan_is_the_model_and_its_prediction(compiled):
    _, _, out, eager, program, dump = compiled
    assert program.plan.head_padding == {"blocks.*.attn1": 16}
    result = numerics(out, eager)
    assert result.pcc >= 0.99999 and result.max_abs <= 1e-4, result
    matches = compare_collectives(program.plan.collectives, program.collectives())
    assert all(m.count_ok and m.bytes_ok() for m in matches), "\n".join(map(str, matches))
    assert any(m.kind == "all-to-all" and m.observed_count == 8 for m in matches)  # 4 per block: Ulysses
    # the weights are padded once per weight version (folded), on each device, moving nothing:
    # 2 blocks x (q, k, v weights and biases, to_out's weight; norm_q/k gammas)
    padded = [name for name in program.fold.split.folded if name.endswith("_padded")]
    assert len(padded) == 2 * (7 + 2), program.fold.split.folded
    main = program.fold.split.main.graph.nodes
    assert not [n for n in main if n.target is torch.nn.functional.pad], "a weight is padded per call"
    assert program.fold_collectives() == []
    md = (dump / "plan.md").read_text()
    assert f"**{PAD}**" in md and "**padded heads** 12 -> 16 at `blocks.*.attn1`" in md


@pytest.mark.slow
def test_saved_padded_plan_compiles_the_same(compiled, tmp_path):
    model, x, out, _, program, dump = compiled
    again, _, program2 = run_with_backend(
        model, x, reference=False, mesh="1x8", hardware="tpu-v6e-8", plan=str(dump / "plan.json")
    )
    assert program2.plan.head_padding == {"blocks.*.attn1": 16}
    assert numerics(again[0], out).max_abs == 0.0
    assert sorted(map(str, program2.collectives())) == sorted(map(str, program.collectives()))


def test_a_padded_plan_refuses_a_model_it_cannot_pad():
    """The plan pads attn1 12 -> 16; a 16-head model has nothing to pad: refused, naming why."""
    from planner.plan import Decision, Plan
    from wancompile.backend import HeadPadder
    from wancompile.capture import capture_module
    from wancompile.models import build_transformer

    graph, gm = capture_module(
        build_transformer("tiny", device="meta", num_attention_heads=16, attention_head_dim=8),
        **inputs(frames=5, side=16, device="meta"),
        return_dict=False,
        model="tiny16",
    )
    plan = Plan(
        "tiny16",
        MeshSpec((1, 8), ("batch", "model")),
        {},
        decisions=(Decision("attn1", PAD, 0.0, in_block=True, pad_heads=HeadPadding("blocks.*.attn1", 12, 16)),),
    )
    with pytest.raises(PlanError, match=r"runs blocks\.\*\.attn1 on padded heads.*16 heads already"):
        HeadPadder(gm, graph).graphs(plan.head_padding)
