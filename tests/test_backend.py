"""backend="wan_autoshard" end to end on 8 virtual CPU devices: the tt-xla hand plan on the tiny DiT.

What the partitioned program holds, per block, against the seed's bill (seed 000, "3 big + 4 small"
on a mesh without SP, plus 2 K/V all-gathers with SP):

    all-reduce on `model`  x3  attn1.to_out, attn2.to_out, ffn.net.2 (row-parallel partial sums), (L/sp, D)
    all-reduce on `model`  x4  norm_q/norm_k mean-square stats of attn1 and attn2, (1, L/sp) or (1, L_text)
    all-gather on `batch`  x2  self-attention K and V on tokens, (B, L, D/tp)

plus once per forward the time/text embedder row-parallel all-reduces and the exit all-gather of
proj_out's output. XLA on CPU combines none of them (no tuple-shaped collectives); it only hoists
the prompt-side attn2.norm_k stats, which do not depend on the hidden state, to the program start.
"""

import pytest
import torch

from planner.hand_plans import tt_xla_plan
from planner.mesh import parse_mesh
from planner.plan import PlanError, save_plan
from wancompile.options import OptionsError
from wancompile.verify import compare_collectives, numerics, placeholder_args, run_with_backend

from conftest import raises_from_backend

pytestmark = pytest.mark.usefixtures("spmd")


def compile_tiny(model, inputs, **options):
    out, _, program = run_with_backend(model, inputs, reference=False, **options)
    return out[0], program


@pytest.fixture(scope="module")
def hand_2x4(tiny_model, tiny_inputs):
    out, program = compile_tiny(tiny_model, tiny_inputs, mesh="2x4", plan="tt-xla")
    with torch.no_grad():
        ref = program.replicated()(*placeholder_args(program.graph, tiny_model, tiny_inputs))[0]
    return out, ref, program


def test_backend_is_registered_by_entry_point():
    import torch._dynamo

    assert "wan_autoshard" in torch._dynamo.list_backends()


def test_hand_plan_2x4_matches_one_device_and_eager(hand_2x4, tiny_model, tiny_inputs):
    out, ref, program = hand_2x4
    result = numerics(out, ref)
    assert result.pcc >= 0.99999 and result.max_abs <= 1e-4, result
    # Tight against eager too: the lowering keeps dynamo's program order (docs/numerics.md).
    with torch.no_grad():
        eager = tiny_model(**tiny_inputs, return_dict=False)[0]
    assert numerics(out, eager).max_abs <= 5e-6
    assert out.device.type == "cpu" and out.shape == (1, 4, 3, 8, 8)
    # the tt-xla preset through the engine: every other option excluded by the preset
    assert all(any(x.reason == "not the tt-xla preset" for x in d.excluded) for d in program.plan.decisions)


def test_hand_plan_2x4_collectives_are_the_seeds_per_block_bill(hand_2x4):
    _, _, program = hand_2x4
    compiled = program.collectives()
    assert not any(c.shape.startswith("(") for c in compiled), "XLA combined collectives into tuples"
    matches = compare_collectives(program.plan.collectives, compiled)
    assert all(m.count_ok and m.predicted_bytes == m.observed_bytes for m in matches), "\n".join(map(str, matches))

    per_block = {c.where: c for c in program.plan.collectives if c.where.startswith("blocks.*")}
    row_parallel = ("to_out.0:linear#0", "net.2:linear#0")
    assert sum(1 for c in per_block.values() if c.kind == "all-reduce" and c.where.endswith(row_parallel)) == 3
    assert sum(1 for c in per_block.values() if c.kind == "all-reduce" and ":rms_norm#" in c.where) == 4
    assert sum(1 for c in per_block.values() if c.kind == "all-gather" and c.axes == ("batch",)) == 2
    assert all(c.count == 2 for c in per_block.values())  # two blocks
    L, D, sp, tp = 48, 64, 2, 4
    big = [c for c in compiled if c.kind == "all-reduce" and c.bytes == (L // sp) * D * 4]
    kv = [c for c in compiled if c.kind == "all-gather" and c.axes == ("batch",) and c.bytes == L * (D // tp) * 4]
    assert len(big) == 2 * 3 and len(kv) == 2 * 2 + 1  # + the exit gather of proj_out's (1, L, 16) output


def test_saved_plan_runs_without_solving_and_compiles_the_same(tmp_path, tiny_model, tiny_inputs, hand_2x4):
    import torch_xla.debug.metrics as met

    _, ref, first = hand_2x4
    path = save_plan(first.plan, tmp_path / "plan.json")
    compiles = met.metric_data("CompileTime")[0]
    out, program = compile_tiny(tiny_model, tiny_inputs, mesh="2x4", plan=str(path))
    assert program.plan == first.plan
    assert numerics(out, ref).pcc >= 0.99999
    # XLA found the partitioned program in its cache: the saved plan compiles to the identical HLO.
    assert met.metric_data("CompileTime")[0] == compiles
    assert program.hlo_path == first.hlo_path


def test_verify_option_compares_with_the_unsharded_graph(tiny_model, tiny_inputs):
    _, program = compile_tiny(tiny_model, tiny_inputs, mesh="2x4", plan="tt-xla", verify=True)
    assert program.verification is not None and program.verification.pcc >= 0.99999


def test_verify_raises_when_the_sharded_program_disagrees():
    from wancompile.backend import _Verifying
    from wancompile.verify import VerificationError

    class Wrong:
        verification = None
        plan = type("P", (), {"summary": lambda self: "a plan"})()

        def __call__(self, x):
            return x + 1

        def replicated(self):
            return lambda x: x * -1.0

    with pytest.raises(VerificationError, match=r"disagrees with the unsharded one \(PCC -1\.0+"):
        _Verifying(Wrong())(torch.arange(4.0))


def test_without_a_plan_option_the_planner_plans(tiny_model, tiny_inputs):
    out, program = compile_tiny(tiny_model, tiny_inputs, mesh="2x4")
    assert program.plan.solver.status in ("OPTIMAL", "FEASIBLE") and program.plan.hardware == "wh-loudbox"
    assert program.plan.decisions


def test_a_second_compile_with_a_cache_dir_reads_the_plan_instead_of_solving(tmp_path, tiny_model, tiny_inputs):
    from wancompile.backend import Component

    first_out, first = compile_tiny(tiny_model, tiny_inputs, mesh="2x4", cache_dir=str(tmp_path))
    out, second = compile_tiny(tiny_model, tiny_inputs, mesh="2x4", cache_dir=str(tmp_path))
    assert not first.compile_times.plan_cached and second.compile_times.plan_cached
    assert list((tmp_path / "plans").glob("*.json")) and second.plan.params == first.plan.params
    assert second.plan.activations == first.plan.activations and second.kind is Component.DIT
    assert numerics(out, first_out).max_abs == 0.0
    _, other_mesh = compile_tiny(tiny_model, tiny_inputs, mesh="4x2", cache_dir=str(tmp_path))
    assert not other_mesh.compile_times.plan_cached  # another mesh is another key


def test_mesh_size_must_match_the_device_count(tiny_model, tiny_inputs):
    with raises_from_backend(PlanError, r"mesh 2x2 needs 4 devices but the XLA runtime has 8.*CPU_NUM_DEVICES=4"):
        compile_tiny(tiny_model, tiny_inputs, mesh="2x2")


def test_unknown_option_key_is_refused(tiny_model, tiny_inputs):
    with raises_from_backend(OptionsError, "unknown wan_autoshard option 'meshes'"):
        compile_tiny(tiny_model, tiny_inputs, meshes="2x4")


def test_plan_for_another_model_is_refused_at_compile(tmp_path, tiny_model, tiny_inputs, hand_2x4):
    _, _, first = hand_2x4
    params = {k.replace("blocks.1.", "blocks.5."): v for k, v in first.plan.params.items()}
    path = save_plan(first.plan.with_(params=params), tmp_path / "other.json")
    with raises_from_backend(PlanError, r"does not fit this model.*blocks\.5\..*Re-plan"):
        compile_tiny(tiny_model, tiny_inputs, mesh="2x4", plan=str(path))


def test_plan_with_a_spec_that_does_not_divide_is_refused(tmp_path, tiny_model, tiny_inputs, hand_2x4):
    _, _, first = hand_2x4
    params = dict(first.plan.params)
    params["proj_out.weight"] = (("batch", "model"), None)  # 16 rows over 8 devices: fine
    params["blocks.0.attn2.to_k.bias"] = ("batch",)
    params["condition_embedder.text_embedder.linear_1.weight"] = (None, ("batch", "model"))  # 32 / 8 fine
    params["condition_embedder.time_embedder.linear_1.weight"] = (None, "batch")
    params["scale_shift_table"] = (None, "batch", None)  # dim 1 has size 2: fine
    params["blocks.0.scale_shift_table"] = (None, "model", None)  # dim 1 has size 6, model has 4: bad
    path = save_plan(first.plan.with_(params=params), tmp_path / "bad.json")
    with raises_from_backend(PlanError, r"blocks\.0\.scale_shift_table: dim 1 of size 6 cannot be split 4 ways"):
        compile_tiny(tiny_model, tiny_inputs, mesh="2x4", plan=str(path))


def test_saved_plan_for_another_mesh_is_refused(tmp_path, tiny_model, tiny_inputs, tiny_capture):
    plan = tt_xla_plan(tiny_capture[0], parse_mesh("4x2"))
    path = save_plan(plan, tmp_path / "p.json")
    with raises_from_backend(PlanError, r"made for mesh 4x2 but this compile uses mesh 2x4"):
        compile_tiny(tiny_model, tiny_inputs, mesh="2x4", plan=str(path))


def test_heads_that_do_not_divide_the_tp_axis_are_refused(tiny_capture):
    with pytest.raises(PlanError, match=r"4 heads do not divide over the 'model' axis of size 3"):
        tt_xla_plan(tiny_capture[0], parse_mesh("1x3"))


def test_dynamic_shapes_record_guards_and_replan_when_a_resolution_breaks_them(tiny_model, tiny_inputs):
    """dynamic=True: one graph for every resolution. The plan for 48 tokens splits them 4 ways and
    records that as a guard on the symbolic token count; 45 tokens break it, so that size gets a
    plan of its own instead of uneven shards."""
    from wancompile.backend import last_program

    torch._dynamo.reset()
    compiled = torch.compile(
        tiny_model, backend="wan_autoshard", options={"mesh": "2x4", "memory_gb": 0.00032}, dynamic=True, fullgraph=True
    )
    with torch.no_grad():
        out48 = compiled(**tiny_inputs, return_dict=False)[0]
    first = last_program()
    split4 = [g for g in first.plan.guards if g.divisor == 4]
    assert split4 and all(not g.expr.isdigit() for g in split4)  # symbolic token count, divisible by 4
    small = dict(tiny_inputs, hidden_states=torch.randn(1, 4, 5, 6, 6))  # 5 x 3 x 3 = 45 tokens
    with torch.no_grad():
        out45 = compiled(**small, return_dict=False)[0]
        eager45 = tiny_model(**small, return_dict=False)[0]
        eager48 = tiny_model(**tiny_inputs, return_dict=False)[0]
    second = last_program()
    assert second is not first
    assert not any("SP(" in d.strategy for d in second.plan.decisions)  # 45 tokens split no way evenly here
    assert numerics(out48, eager48).max_abs <= 5e-6 and numerics(out45, eager45).max_abs <= 5e-6
