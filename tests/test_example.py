"""examples/tiny_dit_sharded.py, as a user runs it: its own virtual devices, JSON out."""

import json

import pytest

from conftest import run_script

pytestmark = pytest.mark.slow


def run_example(*args, devices):
    out = run_script(["examples/tiny_dit_sharded.py", *args, "--json"], num_devices=devices)
    return json.loads(out.strip().splitlines()[-1])


def test_hand_plan_on_1x4_matches_one_device():
    report = run_example("--mesh", "1x4", "--plan", "tt-xla", devices=4)
    assert report["devices"] == 4 and report["mesh"] == [1, 4]
    assert report["pcc"] >= 0.99999 and report["max_abs"] <= 1e-4
    assert report["eager_max_abs"] <= 5e-6
    kinds = {(c["kind"], tuple(c["axes"])) for c in report["collectives"]}
    assert kinds == {("all-reduce", ("model",))}  # no SP axis: no gathers
    # 2 blocks x (3 row-parallel + 4 norm stats) + time/text embedder = 16 (seed: "3 big + 4 small" per block)
    assert len(report["collectives"]) == 16
    assert all(
        r["predicted"] == r["compiled"] and r["predicted_bytes"] == r["compiled_bytes"]
        for r in report["predicted_vs_compiled"]
    )


def test_saved_plan_file_runs_through_the_example(tmp_path):
    first = run_example("--mesh", "2x4", "--plan", "tt-xla", "--dump-dir", str(tmp_path / "a"), devices=8)
    again = run_example("--mesh", "2x4", "--plan", first["plan"], "--dump-dir", str(tmp_path / "b"), devices=8)
    assert again["pcc"] >= 0.99999 and again["max_abs"] <= 1e-4
    assert sorted(map(json.dumps, again["collectives"])) == sorted(map(json.dumps, first["collectives"]))


def test_bad_mesh_string_is_a_usage_error():
    import subprocess
    import sys

    from conftest import ROOT

    proc = subprocess.run(
        [sys.executable, "examples/tiny_dit_sharded.py", "--mesh", "2by4"], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 2 and "cannot parse mesh '2by4'" in proc.stderr


def test_tiny_pipeline_example_two_experts_cfg_batched():
    out = run_script(["examples/tiny_pipeline.py", "--mesh", "2x4", "--cfg-parallel", "--json"], num_devices=8)
    report = json.loads(out.strip().splitlines()[-1])
    assert report["experts"] == 2 and report["weight_sets_budgeted"] == 2
    assert report["latents"]["pcc"] >= 0.99999 and report["latents"]["max_abs"] <= 2e-5
    assert report["frames"]["pcc"] >= 0.99999 and report["frames"]["max_abs"] <= 1e-5
    # one batch-2 DiT graph for both experts + the full-T decode; none more on the second call
    assert report["graphs_compiled"] == 2 and report["recompiles_second_call"] == 0
    assert report["fold_runs"] == 2 and report["fold_parameter_sets"] == 2
    assert report["cfg"] == {"batched": 8, "served": 8, "fallthrough": 0}  # 2 calls x 4 steps
