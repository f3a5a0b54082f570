"""sp_pad's padded keys as the target wants them ignored (`Target.padded_keys`), and tt-check's L_q x L_k tensors.

TTNN's fused attention takes a mask only as [B, 1|H, L_q, L_k] in DRAM, so for tt-mlir a key mask is repeated to
every chip's queries; the "slice" form cuts K and V back to the real tokens in each self-attention and hands the
kernel no mask. `parts.lq_lk_tensors` finds every op result of an attention's L_q x L_k (scores and masks) and
tt-check refuses one of an attention handed over fused."""

from __future__ import annotations

import operator
import re
from pathlib import Path

import pytest
from expecttest import assert_expected_inline
from test_rewrites_sp_pad import run, stack_graph
from test_tt import _tt_check, needs_tt

from rewrites import RewriteContext, apply_rewrites
from rewrites._core import SDPA, module_path

from conftest import normalized_code


def test_targets_choose_the_form_and_gspmd_keeps_the_mask():
    from planner.targets import TARGETS

    assert TARGETS["gspmd"].padded_keys == "mask"  # XLA broadcasts the [1, 1, 1, L + P] mask into the scores
    assert TARGETS["tt-mlir"].padded_keys == "slice"  # TTNN would repeat it to L_q x L_k per chip


def test_the_backend_builds_the_context_from_the_target():
    from planner.mesh import parse_mesh
    from planner.request import PlanRequest
    from wancompile.backend import rewrite_graph

    for target, slices in (("gspmd", 0), ("tt-mlir", 1)):
        gm, _ = stack_graph()
        request = PlanRequest.make(parse_mesh("2x4"), hardware="wh-loudbox", target=target)
        gm, (record,) = rewrite_graph(gm, request, ("sp_pad",))
        assert record.count == 1
        cuts = [n for n in gm.graph.nodes if n.name.endswith("_real")]
        assert len(cuts) == slices, (target, gm.code)  # x's heads are K and V at once: one cut
        masks = [n for n in gm.graph.nodes if n.name == "key_mask"]
        assert len(masks) == (1 if target == "gspmd" else 0), (target, gm.code)


def test_golden_slice_form():
    gm, inputs = stack_graph()
    expected = run(gm, inputs)
    _, (report,) = apply_rewrites(gm, ["sp_pad"], RewriteContext(sp_multiple=4, padded_keys="slice"))
    assert report.where == ("blocks.0.attn1",)
    assert (run(gm, inputs) - expected).abs().max().item() <= 1e-6
    assert_expected_inline(
        normalized_code(gm),
        """\
def forward(self, L_x_ : torch.Tensor, L_context_ : torch.Tensor, L_self_modules_proj_out_parameters_weight_ : torch.nn.parameter.Parameter):
    l_x__padded = torch.nn.functional.pad(l_x_, [0, 0, 0, 3])
    unflatten = l_x__padded.unflatten(2, (2, -1))
    kv = unflatten.transpose(1, 2)
    unflatten_1 = l_x__padded.unflatten(2, (2, -1))
    transpose_1 = unflatten_1.transpose(1, 2)
    kv_real = kv[(slice(None, None, None), slice(None, None, None), slice(None, 5, None))]
    scaled_dot_product_attention = torch._C._nn.scaled_dot_product_attention(transpose_1, kv_real, kv_real)
    transpose_2 = scaled_dot_product_attention.transpose(1, 2)
    flatten = transpose_2.flatten(2)
    x = l_x__padded + flatten
    unflatten_2 = l_context_.unflatten(2, (2, -1))
    kv_1 = unflatten_2.transpose(1, 2)
    unflatten_3 = x.unflatten(2, (2, -1))
    transpose_4 = unflatten_3.transpose(1, 2)
    scaled_dot_product_attention_1 = torch._C._nn.scaled_dot_product_attention(transpose_4, kv_1, kv_1)
    transpose_5 = scaled_dot_product_attention_1.transpose(1, 2)
    flatten_1 = transpose_5.flatten(2)
    x_1 = x + flatten_1
    linear = torch._C._nn.linear(x_1, l_self_modules_proj_out_parameters_weight_, None)
    linear_unpadded = linear[(slice(None, None, None), slice(None, 5, None))]
    reshape = linear_unpadded.reshape(1, 1, 5, 4)
    return (reshape,)""",
    )


@pytest.mark.parametrize("multiple", [2, 4, 64])
def test_dit_with_45_tokens_gives_the_same_output_with_k_and_v_cut(dit45, multiple):
    """The tiny DiT (45 tokens) padded to a multiple of 2, 4 and 64 (SP 2 x a 32-token tile): exact against the
    unrewritten graph on CPU; every self-attention reads K and V of the 45 real tokens, cut in its own module, and
    no mask; queries stay padded; cross-attention is untouched."""
    gm, inputs = dit45
    expected = run(gm, inputs)
    _, (report,) = apply_rewrites(gm, ["sp_pad"], RewriteContext(sp_multiple=multiple, padded_keys="slice"))
    assert (report.where, report.skipped) == (("blocks.0.attn1", "blocks.1.attn1"), ())
    assert (run(gm, inputs) - expected).abs().max().item() <= 1e-6
    padded = 45 + (-45 % multiple)
    for node in (n for n in gm.graph.nodes if n.target in SDPA):
        q, k, v = (node.kwargs[x].meta["example_value"] for x in ("query", "key", "value"))
        assert node.kwargs["attn_mask"] is None
        if module_path(node).endswith("attn1"):
            assert (q.shape[2], k.shape[2], v.shape[2]) == (padded, 45, 45)
            for x in ("key", "value"):
                cut = node.kwargs[x]
                assert cut.target is operator.getitem and module_path(cut) == module_path(node)
                assert cut.args[0].meta["example_value"].shape[2] == padded
        else:
            assert k.shape[2] == 7  # the prompt's keys
    assert not [n for n in gm.graph.nodes if n.name in ("token_positions", "valid_tokens", "key_mask")]


def test_an_unknown_form_is_refused(dit45):
    gm, _ = dit45
    with pytest.raises(ValueError, match="padded_keys='none': choose one of mask, slice"):
        apply_rewrites(gm, ["sp_pad"], RewriteContext(sp_multiple=4, padded_keys="none"))


def test_the_slice_form_is_checked_on_fake_tensors_before_the_graph_changes():
    """A block that hard-codes its token count is left alone in the slice form too, with the reason."""
    gm, _ = stack_graph(hard_coded_tokens=5)
    before = gm.code
    _, (report,) = apply_rewrites(gm, ["sp_pad"], RewriteContext(sp_multiple=4, padded_keys="slice"))
    assert report.count == 0 and report.skipped[0].startswith("blocks.0: x does not accept 8 tokens (")
    assert gm.code == before


def _tiny_bf16_graph(form: str):
    """The tiny bf16 DiT (48 tokens) with every rewrite as the backend runs them for tt-mlir on 2x4 (sp_pad to 64:
    SP 2 x a 32-token tile), its padded keys ignored in `form`, annotated for the planner."""
    from test_ttnn_kernels import _tiny_bf16

    from wancompile.capture import annotate, capture_fx

    model, inputs = _tiny_bf16()
    gm = capture_fx(model, **inputs, return_dict=False)
    apply_rewrites(gm, "all", RewriteContext(sp_multiple=64, rotary_kernel=True, padded_keys=form))
    gm.recompile()
    return annotate(gm, model="tiny")


def test_the_planner_gathers_k_and_v_before_the_cut_and_counts_it_as_ttnn_runs_it():
    """Under the tt-xla hand plan (SP over ``batch``, heads over ``model``) each cut reads K and V whole on the
    tokens: the SP all-gather is made at the cut (a partial slice of a split dim gathers first), no collective
    more. The planner counts each cut as one TTNN ``slice_static`` and keeps the permutes into the attention
    absorbed: 2 kernels a block more than the mask form (tt-mlir compiled 116 -> 118, tiny bf16, bh-2x4)."""
    from planner.hand_plans import tt_xla_plan
    from planner.mesh import parse_mesh
    from planner.ttnn_kernels import plan_kernels

    mesh = parse_mesh("2x4")
    kernels, gathers = {}, {}
    for form in ("mask", "slice"):
        graph = _tiny_bf16_graph(form)
        plan = tt_xla_plan(graph, mesh, target="tt-mlir")
        kernels[form] = plan_kernels(graph, plan)[0]
        gathers[form] = [c for c in plan.collectives if c.kind == "all-gather"]
        cuts = {graph.generic(str(n.location)) for n in graph if n.name.endswith("_real")}
        assert len(cuts) == (2 if form == "slice" else 0)  # K and V of the (representative) self-attention
    # the same K/V gathers over batch, once per block each, made at the cuts instead of the permutes into attention
    assert [(c.axes, c.count) for c in gathers["slice"]] == [(c.axes, c.count) for c in gathers["mask"]]
    assert {c.where for c in gathers["slice"] if c.where.startswith("blocks.")} == cuts
    diff = {c: getattr(kernels["slice"], c) - getattr(kernels["mask"], c) for c in ("fused", "matmul", "move")}
    assert diff == {"fused": 0, "matmul": 0, "move": 2}, kernels


# --- tt-check: every L_q x L_k tensor of the TTNN program ------------------------------------------------------

# One chip of a 2-way SP split of 64 padded tokens (1 head of 32): the key mask made as a [1,1,1,64] where, repeated
# to the chip's 32 queries ([1,1,32,64]) and read by the fused attention; a block's stream reshaped to 4-D around an
# all-reduce, [1,1,32,64] too but no mask; a decomposed attention whose scores get the repeated mask added.
# %arg0 is a weight (blocks.0), the rest inputs.
TTNN_MASKED = """module {
  func.func @main(%arg0: tensor<64x64xbf16, #l>, %arg1: tensor<1x1x32x32xbf16, #l>, %arg2: tensor<1x1x64x32xbf16, #l>, %arg3: tensor<1x32x64xbf16, #l>, %arg4: tensor<1x1x1x64xbf16, #l>) -> tensor<1x32x64xbf16, #l> {
    %0 = "ttnn.where"(%arg4, %arg4, %arg4) : (tensor<1x1x1x64xbf16, #l>, tensor<1x1x1x64xbf16, #l>, tensor<1x1x1x64xbf16, #l>) -> tensor<1x1x1x64xbf16, #l> loc(#loc1)
    %1 = "ttnn.repeat"(%0) <{repeat_dims = #ttnn.shape<1x1x32x1>}> : (tensor<1x1x1x64xbf16, #l>) -> tensor<1x1x32x64xbf16, #l> loc(#loc1)
    %2 = "ttnn.scaled_dot_product_attention"(%arg1, %arg2, %arg2, %1) <{is_causal = false, operandSegmentSizes = array<i32: 1, 1, 1, 1, 0>}> : (tensor<1x1x32x32xbf16, #l>, tensor<1x1x64x32xbf16, #l>, tensor<1x1x64x32xbf16, #l>, tensor<1x1x32x64xbf16, #l>) -> tensor<1x1x32x32xbf16, #l> loc(#loc1)
    %3 = "ttnn.linear"(%arg3, %arg0) <{transpose_a = false, transpose_b = true}> : (tensor<1x32x64xbf16, #l>, tensor<64x64xbf16, #l>) -> tensor<1x32x64xbf16, #l> loc(#loc1)
    %4 = "ttnn.reshape"(%3) <{shape = [1 : i32, 1 : i32, 32 : i32, 64 : i32]}> : (tensor<1x32x64xbf16, #l>) -> tensor<1x1x32x64xbf16, #l> loc(#loc1)
    %5 = "ttnn.all_reduce"(%4) <{cluster_axis = 1 : ui32}> : (tensor<1x1x32x64xbf16, #l>) -> tensor<1x1x32x64xbf16, #l> loc(#loc1)
    %6 = "ttnn.reshape"(%5) <{shape = [1 : i32, 32 : i32, 64 : i32]}> : (tensor<1x1x32x64xbf16, #l>) -> tensor<1x32x64xbf16, #l> loc(#loc1)
    %7 = "ttnn.matmul"(%arg1, %arg2) <{transpose_a = false, transpose_b = true}> : (tensor<1x1x32x32xbf16, #l>, tensor<1x1x64x32xbf16, #l>) -> tensor<1x1x32x64xbf16, #l> loc(#loc1)
    %8 = "ttnn.multiply"(%7, %7) : (tensor<1x1x32x64xbf16, #l>, tensor<1x1x32x64xbf16, #l>) -> tensor<1x1x32x64xbf16, #l> loc(#loc1)
    %9 = "ttnn.repeat"(%arg4) <{repeat_dims = #ttnn.shape<1x1x32x1>}> : (tensor<1x1x1x64xbf16, #l>) -> tensor<1x1x32x64xbf16, #l> loc(#loc1)
    %10 = "ttnn.add"(%8, %9) : (tensor<1x1x32x64xbf16, #l>, tensor<1x1x32x64xbf16, #l>) -> tensor<1x1x32x64xbf16, #l> loc(#loc1)
    %11 = "ttnn.softmax"(%10) <{dimension = 3 : si32}> : (tensor<1x1x32x64xbf16, #l>) -> tensor<1x1x32x64xbf16, #l> loc(#loc1)
    %12 = "ttnn.matmul"(%11, %arg2) <{transpose_a = false, transpose_b = false}> : (tensor<1x1x32x64xbf16, #l>, tensor<1x1x64x32xbf16, #l>) -> tensor<1x1x32x32xbf16, #l> loc(#loc1)
    return %6 : tensor<1x32x64xbf16, #l> loc(#loc1)
  } loc(#loc1)
} loc(#loc1)
"""
NAMES = [["blocks.0.attn1.to_out.0.weight"], [], [], [], []]


def test_every_lq_lk_tensor_is_found_by_dataflow_not_by_shape_alone():
    """The fused attention's repeated mask is a mask; the decomposed attention's QK^T, scale, mask add and softmax
    are scores and the mask repeated into the add a mask; the stream's [1,1,32,64] around its all-reduce, of the
    same shape, is none of them (nothing connects it to an attention's scores or mask)."""
    from wancompile.tt.parts import from_parameters, lq_lk_tensors

    found = lq_lk_tensors(TTNN_MASKED, [(64, 64, 32)], [1, 2], frozenset(from_parameters(TTNN_MASKED, NAMES)))
    assert [(x.value, x.op, x.kind) for x in found] == [
        ("%1", "ttnn.repeat", "mask"),
        ("%7", "ttnn.matmul", "scores"),
        ("%8", "ttnn.multiply", "scores"),
        ("%9", "ttnn.repeat", "mask"),
        ("%10", "ttnn.add", "scores"),
        ("%11", "ttnn.softmax", "scores"),
    ]
    assert {(x.type, x.bytes, x.lq, x.lk) for x in found} == {("1x1x32x64xbf16", 32 * 64 * 2, 64, 64)}


def test_a_mask_of_a_fused_attention_refuses_the_program():
    """A fused attention is priced as one kernel reading q, k and v: an L_q x L_k mask of it in the program
    (tt-mlir's repeat of a key mask) refuses the program, as its score matrices would; the same attention reading
    no mask (the slice form: K and V of the real tokens) leaves nothing to refuse."""
    from planner.mesh import MeshSpec
    from wancompile.composites import Site
    from wancompile.tt.check import ProgramCheck, _scores

    head, tail = TTNN_MASKED.split('    %7 = "ttnn.matmul"')
    fused_only = head + "    return" + tail.split("    return", 1)[1]  # the decomposed attention taken out
    mesh = MeshSpec((2, 4), ("batch", "model"))
    site = Site("sdpa", "attention", "", 64, 64, 32)
    found, unfused = _scores(fused_only, [site], mesh, NAMES)
    assert [(x.value, x.op, x.kind) for x in found] == [("%1", "ttnn.repeat", "mask")] and unfused == found
    check = ProgramCheck("p", "bh-2x4", True, score_matrices=found, unfused_scores=unfused)
    assert not check.as_predicted
    assert check.to_json()["score_matrices"][0]["kind"] == "mask"
    sliced = fused_only.replace(", %1) <{is_causal", ") <{is_causal").replace("1, 1, 1, 1, 0>", "1, 1, 1, 0, 0>")
    sliced = sliced.replace(
        "tensor<1x1x64x32xbf16, #l>, tensor<1x1x32x64xbf16, #l>) -> tensor<1x1x32x32",
        "tensor<1x1x64x32xbf16, #l>) -> tensor<1x1x32x32",
    )
    assert _scores(sliced, [site], mesh, NAMES) == ((), ())
    assert ProgramCheck("p", "bh-2x4", True).as_predicted


@needs_tt
@pytest.mark.slow
@pytest.mark.parametrize("plan", ["--plan=tt-xla", "--tightest"])
def test_tt_mlir_runs_sp_padded_attention_fused_with_no_lq_lk_tensor(plan):
    """The tiny bf16 DiT (48 tokens) with every rewrite on 2x4: sp_pad pads to 64 (SP 2 x a 32-token tile) and, for
    tt-mlir, cuts K and V back to 48. Compiled for bh-2x4 (the tt-xla hand plan, and the auto plan at its smallest
    budget), every self-attention is one ``ttnn.scaled_dot_product_attention`` on 48 keys with no mask operand, no
    op result anywhere holds a chip's queries x the keys (with a key mask tt-mlir repeated it to [1,1,32,64] once and
    handed it to every self-attention), the collectives are the predicted ones, each block's kernels within 5% of
    the planner's count (tt-xla plan: 118 compiled, 122 predicted; 116 / 120 with the mask), and the CPU output
    within 2x eager bf16's error of eager fp32."""
    report = _tt_check("--mesh", "2x4", plan, "--dtype", "bfloat16", "--rewrites", "all", "--system", "bh-2x4")
    main = next(p for p in report["programs"] if p["program"] == "wan-dit")
    assert main["compiled"] and main["as_predicted"] and main["score_matrices"] == [], main["score_matrices"]
    ir = Path(main["ttnn_ir"]).read_text()
    attention = [line for line in ir.splitlines() if '"ttnn.scaled_dot_product_attention"' in line]
    self_attention = [line for line in attention if "x48x32xbf16" in line]  # K and V: 48 real tokens, 16 -> 32 wide
    assert len(attention) == 4 and len(self_attention) == 2, attention
    assert all("array<i32: 1, 1, 1, 0, 0>" in line for line in attention)  # q, k, v: no mask operand
    assert not re.search(r"tensor<(\d+x)*(32|64)x64xbf16", "\n".join(self_attention))
    assert main["kernel_error"] <= 0.05, main["kernels_by_block"]
    assert 1 - report["pcc"] <= 2 * (1 - report["eager_pcc"]) and report["max_abs"] <= 2 * report["eager_max_abs"]
