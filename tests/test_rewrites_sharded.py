"""Rewrites under sharding, through the backend: the partitioned program is what the passes promise."""

import re
from collections import Counter

import pytest
import torch

from planner.plan import PlanError
from wancompile.verify import numerics, placeholder_args, run_with_backend

from conftest import raises_from_backend

pytestmark = pytest.mark.usefixtures("spmd")


def compile_and_check(model, inputs, **options):
    out, ref, program = run_with_backend(model, inputs, **options)
    return numerics(out, ref), program


def test_qkv_fusion_under_tp_adds_no_collective(tiny_model, tiny_inputs):
    unfused, plain = compile_and_check(tiny_model, tiny_inputs, mesh="2x4", plan="tt-xla", rewrites="none")
    fused, program = compile_and_check(tiny_model, tiny_inputs, mesh="2x4", plan="tt-xla", rewrites=["qkv"])
    assert fused.pcc >= 0.99999 and fused.max_abs <= 1e-4, fused
    assert {r.name: r.count for r in program.plan.rewrites} == {"qkv": 4}
    signature = lambda p: Counter((c.kind, c.axes, c.shape.split("{")[0]) for c in p.collectives())  # noqa: E731
    # The packed weight is head-interleaved, so its TP shard holds whole q, k, v heads: same program.
    assert signature(program) == signature(plain)


# tile 1 / 32-token tiles; gspmd masks the padded keys, tt-mlir cuts K and V back to the real tokens per self-attention
# (`Target.padded_keys`: TTNN would repeat a key mask to L_q x L_k)
@pytest.mark.parametrize("hardware, padded, cuts", [("h100x8", 46, False), ("wh-loudbox", 64, True)])
def test_sp_padding_runs_45_tokens_on_sp2_without_per_block_kv_slices(hardware, padded, cuts):
    from wancompile.models import build_transformer, transformer_inputs

    model = build_transformer("tiny", out_channels=2)  # proj_out emits 8 features, unlike K/V's 16 per head
    inputs = dict(transformer_inputs("tiny", "tiny", 9), hidden_states=torch.randn(1, 4, 5, 6, 6))  # 5x3x3 = 45
    # tokens pad to a multiple of SP degree (2) x the hardware's tile
    result, program = compile_and_check(
        model, inputs, mesh="2x4", plan="tt-xla", hardware=hardware, rewrites=["sp_pad"]
    )
    assert result.pcc >= 0.99999 and result.max_abs <= 1e-4, result
    with torch.no_grad():
        assert (
            numerics(
                program(*placeholder_args(program.graph, model, inputs))[0], model(**inputs, return_dict=False)[0]
            ).max_abs
            <= 5e-6
        )
    assert {r.name: r.count for r in program.plan.rewrites} == {"sp_pad": 2}
    hlo = program.hlo_path.read_text()
    to_45 = [line for line in hlo.splitlines() if " slice(" in line and ",45," in line.split("slice(")[0]]
    exits = [line for line in to_45 if "f32[1,45,8]" in line]
    assert len(exits) == 1, to_45  # the exit drops the padding once
    # and, for tt-mlir only, each self-attention reads K and V cut back to 45 tokens ([1, heads on a chip, 45, 16])
    kv_cuts = [line for line in to_45 if line not in exits]
    assert (bool(kv_cuts), all(",45,16]" in line.split("slice(")[0] for line in kv_cuts)) == (cuts, True), to_45
    compiled = program.collectives()
    # K and V gathered at the padded length, once per block (whole heads: laid out (B, L, H·d) or (B, H, L, d))
    kv = [c.shape for c in compiled if c.kind == "all-gather" and not c.shape.startswith(f"f32[1,{padded},8]")]
    assert kv and all(str(padded) in re.findall(r"\d+", s.split("{")[0]) for s in kv), kv
    assert not [c for c in compiled if c.kind == "collective-permute"]  # the split starts after the pad


def test_saved_plan_remembers_its_rewrites(tmp_path, tiny_model, tiny_inputs):
    from planner.plan import save_plan

    _, program = compile_and_check(tiny_model, tiny_inputs, mesh="2x4", plan="tt-xla", rewrites=["qkv", "rope"])
    path = save_plan(program.plan, tmp_path / "plan.json")
    again, _ = compile_and_check(tiny_model, tiny_inputs, mesh="2x4", plan=str(path), rewrites=["rope", "qkv"])
    assert again.pcc >= 0.99999
    # left out, the rewrites are the saved plan's; a different choice is refused, naming the plan's
    default, program = compile_and_check(tiny_model, tiny_inputs, mesh="2x4", plan=str(path))
    assert default.pcc >= 0.99999 and [r.name for r in program.plan.rewrites] == ["qkv", "rope"]
    with raises_from_backend(PlanError, r"made with rewrites \['qkv', 'rope'\] but this compile runs none"):
        compile_and_check(tiny_model, tiny_inputs, mesh="2x4", plan=str(path), rewrites="none")


def test_auto_plan_after_rope_patch_embed_and_sp_pad_compiles_to_its_prediction():
    from wancompile.models import build_transformer, transformer_inputs
    from wancompile.verify import compare_collectives

    model = build_transformer("tiny")
    inputs = dict(transformer_inputs("tiny", "tiny", 9), hidden_states=torch.randn(1, 4, 5, 6, 6))  # 45 tokens
    result, program = compile_and_check(
        model, inputs, mesh="2x4", memory_gb=0.00025, rewrites=["rope", "patch_embed", "sp_pad"]
    )
    assert result.pcc >= 0.99999, result
    assert any("SP(" in d.strategy for d in program.plan.decisions)  # a sharded plan, not replication
    matches = compare_collectives(program.plan.collectives, program.collectives())
    assert all(m.count_ok and m.bytes_ok() for m in matches), "\n".join(map(str, matches))
