"""tt-mlir's fused kernels: a bf16 DiT hands tt-mlir its attention, norms and GELU as ``tenstorrent.*``
composites (`wancompile.composites`), and the program tt-mlir compiles runs each as one TTNN kernel — with
exactly the plan's collectives, and on CPU the numbers of eager bf16."""

from __future__ import annotations

import collections
import json
import re
from pathlib import Path

import pytest
import torch
from test_tt import _tt_check, needs_tt


def _kernels(ttnn_ir: str) -> collections.Counter:
    with open(ttnn_ir) as f:
        return collections.Counter(re.findall(r'"(ttnn\.\w+)"', f.read()))


@needs_tt
@pytest.mark.slow
def test_bf16_auto_plan_runs_fused_attention_norms_and_gelu_through_tt_mlir_as_predicted():
    """The tiny DiT (2 blocks: 4 attention calls, 7 LayerNorms, 8 RMSNorms of q/k, 3 GELUs, 4 RoPEs) as a pipeline loads
    it (bf16), the auto plan at its smallest budget on 2x4, compiled for bh-2x4: every attention call is one
    ``ttnn.scaled_dot_product_attention`` (no softmax left: no score matrix), every LayerNorm and GELU one
    kernel, each RoPE one ``ttnn.rotary_embedding`` (the ``rope`` rewrite's form for tt-mlir), the RMSNorms whose
    normalized dim the plan keeps whole one ``ttnn.rms_norm`` (the plan splits the
    other 4 over ``batch``: they stay decomposed, their statistic all-reduced, as predicted); TTNN's
    collectives are the predicted ones; the program was compiled at optimization_level 1 (the level at which
    tt-mlir keeps fused attention)."""
    report = _tt_check(
        "--mesh", "2x4", "--memory-gb", "0.00025", "--dtype", "bfloat16", "--rewrites", "all", "--system", "bh-2x4",
        "--unannotated",
    )  # fmt: skip
    main = next(p for p in report["programs"] if p["program"] == "wan-dit")
    assert main["compiled"] and main["as_predicted"], main
    assert main["options"] == {"optimization_level": "1"}
    # the pins leave tt-mlir's fusions alone: per block the fused kernels of the program without the plan, and
    # no reshape, permute or layout copy more than the reshards need (a linear reduced before its bias is one)
    assert main["pins_clean"] and report["ok"], main["pin_costs"]
    for cost in main["pin_costs"]:
        for kernel in (
            "ttnn.scaled_dot_product_attention",
            "ttnn.layer_norm",
            "ttnn.rms_norm",
            "ttnn.gelu",
            "ttnn.rotary_embedding",
        ):
            pinned, bare = cost["kernels"].get(kernel, [0, 0])
            assert pinned == bare, (cost["part"], kernel, pinned, bare)
    k = _kernels(main["ttnn_ir"])
    assert k["ttnn.scaled_dot_product_attention"] == 4 and k["ttnn.softmax"] == 0, k
    assert k["ttnn.layer_norm"] == 7 and k["ttnn.gelu"] == 3 and k["ttnn.rms_norm"] == 4, k
    assert k["ttnn.rotary_embedding"] == 4, k  # q's and k's RoPE in each block: the rope rewrite's rotary form
    # eager bf16 of this model is PCC 0.999985 / max-abs 0.0103 from eager fp32 (tests/test_bf16.py): within 2x
    eager_bf16_error = 1 - 0.999985
    assert 1 - report["pcc"] <= 2 * eager_bf16_error and report["max_abs"] <= 2 * 0.0103, report
    # read back per block: each block runs its two attention calls as two kernels, and no score matrix anywhere
    parts = {p["part"]: p["ops"] for p in main["ttnn_ops_by_part"]}
    assert list(parts) == ["prologue", "blocks.0", "blocks.1", "epilogue"], list(parts)
    for block in ("blocks.0", "blocks.1"):
        assert parts[block]["ttnn.scaled_dot_product_attention"] == 2 and "ttnn.softmax" not in parts[block]
    assert main["score_matrices"] == []
    # the planner counts each block's kernels per call as TTNN runs them: the fused ones and the collectives
    # exactly, all of them within 10% (planner.ttnn_kernels)
    kernels = main["kernels_by_block"]
    assert [k["part"] for k in kernels] == ["blocks.0", "blocks.1"], kernels
    for k in kernels:
        for kind in ("fused", "matmul", "collective"):
            assert k["predicted"][kind] == k["compiled"][kind], (kind, k)
    assert main["kernel_error"] <= 0.10, kernels
    # and the same histogram in the dump's plan.json, per system and part
    saved = json.loads((Path(report["out"]) / "plan.json").read_text())["compiled_kernels"]
    assert [(k["system"], k["part"], k["ops"]) for k in saved] == [("bh-2x4", p, ops) for p, ops in parts.items()]


@needs_tt
@pytest.mark.slow
def test_fused_attention_that_tt_mlir_decomposes_into_score_matrices_refuses_the_program():
    """The same bf16 DiT without the patch_embed rewrite keeps its conv3d, so tt-mlir compiles it at level 0
    and decomposes the fused attention it was handed into matmul + softmax + matmul: each block writes its
    score matrices, which the plan priced as never written. tt-check refuses the program, naming them."""
    report = _tt_check("--mesh", "2x4", "--memory-gb", "0.00025", "--dtype", "bfloat16", "--system", "bh-2x4")
    main = next(p for p in report["programs"] if p["program"] == "wan-dit")
    assert main["compiled"] and not main["as_predicted"] and not report["ok"]
    assert main["options"] == {"optimization_level": "0"} and "conv3d" in main["level_0_because"]
    assert all(m["predicted_count"] == m["ttnn_count"] for m in main["collectives"])  # only the scores differ
    scores = main["score_matrices"]
    assert scores and all(x["fused_predicted"] for x in scores)
    assert {(x["lq"], x["lk"]) for x in scores} == {(48, 48), (48, 7)}  # self- and cross-attention (7 text tokens)


@needs_tt
@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "plan"), [("wan-i2v", "--tightest"), ("wan-ti2v", "--tightest"), ("tiny", "--plan=tt-xla")]
)
def test_i2v_ti2v_and_the_hand_plan_run_their_attention_fused_in_every_block(model, plan):
    """Wan 2.1 I2V (image tokens joined to the prompt's) and Wan 2.2 TI2V (a timestep per token), tiny, bf16,
    auto at their smallest budget on 2x4, and the T2V DiT under tt-xla's hand plan (one head per chip): every
    block runs each attention call as one fused kernel, no score matrix, TTNN's collectives as predicted, the
    CPU output within 2x eager bf16's error of eager fp32."""
    report = _tt_check(
        "--model", model, "--mesh", "2x4", plan, "--dtype", "bfloat16", "--rewrites", "all", "--system", "bh-2x4",
    )  # fmt: skip
    main = next(p for p in report["programs"] if p["program"] == "wan-dit")
    assert main["compiled"] and main["as_predicted"] and main["score_matrices"] == [], main
    blocks = [p["ops"] for p in main["ttnn_ops_by_part"] if p["part"].startswith("blocks.")]
    assert len(blocks) == 2 and all(b["ttnn.scaled_dot_product_attention"] == 2 for b in blocks), blocks
    assert all("ttnn.softmax" not in b and b["ttnn.layer_norm"] == 3 for b in blocks), blocks
    assert [k["part"] for k in main["kernels_by_block"]] == ["blocks.0", "blocks.1"]
    assert main["kernel_error"] <= 0.10, main["kernels_by_block"]  # the planner's count of each block's kernels
    assert 1 - report["pcc"] <= 2 * (1 - report["eager_pcc"]) and report["max_abs"] <= 2 * report["eager_max_abs"], (
        report
    )


def test_fp32_attention_stays_decomposed_and_the_option_turns_composites_off(spmd):
    """tt-mlir's fused attention takes bf16 only: an fp32 DiT's attention stays matmul + softmax + matmul (its
    norms and GELU are still fused); ``fused_ops=False`` exports every op decomposed; on gspmd nothing is marked."""
    from wancompile.models import build_transformer, transformer_inputs
    from wancompile.programs import recent_programs

    model, inputs = build_transformer("tiny"), transformer_inputs("tiny", "tiny", 9)

    def sites(**options):
        compiled = torch.compile(model, backend="wan_autoshard", options={"mesh": "2x4", **options}, fullgraph=True)
        with torch.no_grad():
            compiled(**inputs, return_dict=False)
        return recent_programs()[-1].fused_sites

    fp32 = sites(target="tt-mlir")
    attention = [s for s in fp32 if s.family == "attention"]
    assert len(attention) == 4 and all("fp32" in s.why_not for s in attention)
    assert all(not s.why_not for s in fp32 if s.family in ("layer_norm", "gelu"))
    assert sites(target="tt-mlir", fused_ops=False) == () and sites(target="gspmd") == ()


def test_fused_attention_is_compiled_at_level_1_unless_a_conv3d_would_be_refused_there(tmp_path):
    """The compile options follow the program: level 1 (where tt-mlir keeps ``ttnn.scaled_dot_product_attention``)
    for a module that hands over fused attention; level 0, with the reason, where it also holds a 3-D
    convolution (level 1 refuses ttnn.conv3d); level 0 for a module without fused attention."""
    from wancompile.tt.check import compile_options

    sdpa = '%1 = stablehlo.composite "tenstorrent.scaled_dot_product_attention" %0 {decomposition = @sdpa}\n'
    conv = "%2 = stablehlo.convolution(%a, %w) dim_numbers = [b, f, 0, 1, 2]x[o, i, 0, 1, 2]->[b, f, 0, 1, 2]\n"
    conv2d = "%2 = stablehlo.convolution(%a, %w) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1]\n"

    def options(text):
        (tmp_path / "m.mlir").write_text(text)
        return compile_options(tmp_path / "m.mlir")

    assert options(sdpa) == ({"optimization_level": "1"}, "")
    assert options(sdpa + conv2d) == ({"optimization_level": "1"}, "")
    level, why = options(conv + sdpa)
    assert level == {"optimization_level": "0"} and "conv3d" in why and "patch_embed" in why
    assert options(conv) == ({"optimization_level": "0"}, "")


def test_level_1_on_chips_whose_kernel_sources_the_plugin_lacks_falls_back_to_level_0_and_says_why(
    tmp_path, monkeypatch
):
    """Level 1's op model JIT-builds each chip's kernels from the plugin's runtime assets; jax-tt-plugin 0.1.3
    ships Blackhole's device headers only. A Wormhole compile is made at level 0 with the reason; a Blackhole
    one, or one whose assets are not unpacked yet, is left at the level asked for."""
    from wancompile.tt.worker import missing_kernel_sources

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert missing_kernel_sources("Wormhole_b0") == ""  # nothing unpacked: nothing to tell
    (tmp_path / "libtt-tt-metal-runtime-assets-0" / "tt_metal/hw/inc/internal/tt-1xx/blackhole").mkdir(parents=True)
    assert missing_kernel_sources("Blackhole") == ""
    why = missing_kernel_sources("Wormhole_b0")
    assert "tt-1xx/wormhole" in why and "level 0" in why


@needs_tt
@pytest.mark.slow
def test_a_wormhole_system_compiles_the_hand_plan_fused_at_level_1_from_grafted_sources():
    """jax-tt-plugin 0.1.3 lacks Wormhole's kernel sources; tt-check grafts them from the ttnn wheel
    (`wancompile.tt.wormhole`, a compile-only stand-in: the multilib is Blackhole's) and compiles the bf16 DiT for
    wh-loudbox at level 1: attention fused, no score matrix, collectives as predicted, the stand-in on the record."""
    report = _tt_check(
        "--mesh", "2x4", "--plan", "tt-xla", "--dtype", "bfloat16", "--rewrites", "all", "--system", "wh-loudbox",
    )  # fmt: skip
    main = next(p for p in report["programs"] if p["program"] == "wan-dit")
    assert report["ok"] and main["as_predicted"], main["collectives"]
    assert main["options"] == {"optimization_level": "1"} and not main["level_0_because"]
    assert main["stand_in"]["multilib_from"] == "bh-ilp32"
    assert not main["score_matrices"]
    sdpa = sum(p["ops"].get("ttnn.scaled_dot_product_attention", 0) for p in main["ttnn_ops_by_part"])
    assert sdpa == 4  # 2 blocks x (self, cross)
