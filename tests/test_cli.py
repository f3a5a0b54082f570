"""The ``wancompile`` verbs: plan (three dumps, progress, -v), explain, diff, report, validate.

Full-size plans (A14B, TI2V-5B on Galaxy 8x4) capture 2 blocks on the meta device (~12 s each): slow.
"""

import json
import re

import pytest

from wancompile.cli import main

TINY = ["--model", "tiny", "--resolution", "tiny", "--frames", "9"]


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    out = {}
    for name, extra in {
        "hand-2x4": ["--mesh", "2x4", "--hand", "tt-xla"],
        "hand-8x4": ["--mesh", "8x4", "--hand", "tt-xla"],
        "auto-2x4": ["--mesh", "2x4", "--memory-gb", "0.00025"],
        "preset-2x4": ["--mesh", "2x4", "--preset", "tt-xla"],
    }.items():
        d = tmp_path_factory.mktemp(name)
        hardware = "wh-galaxy" if "8x4" in name else "wh-loudbox"  # a profile at least as large as the mesh
        # the unmodified model's plans (what `export` applies specs to, and ops named as diffusers' graph has them);
        # tt-mlir's default rewrites: test_plan_for_tenstorrent_runs_the_target_s_rewrites_and_says_why
        assert main(["plan", *TINY, "--hardware", hardware, *extra, "--rewrites", "none", "--out", str(d)]) == 0
        out[name] = d
    return out


def test_plan_writes_three_dumps_and_logs_steps_with_v(tmp_path, capsys):
    assert (
        main(
            [
                "plan",
                *TINY,
                "--mesh",
                "2x4",
                "--hardware",
                "wh-loudbox",
                "--hand",
                "tt-xla",
                "--out",
                str(tmp_path),
                "-v",
            ]
        )
        == 0
    )
    out, err = capsys.readouterr()
    for name in ("plan.json", "plan.md", "plan.html"):
        assert (tmp_path / name).stat().st_size > 1000 and f"wrote {tmp_path / name}" in out
    assert "INFO wancompile: [1/3] capturing 2-block tiny transformer on meta done in" in err
    assert "INFO wancompile: [3/3] writing plan.json, plan.md, plan.html done in" in err


def test_preset_tt_xla_is_the_hand_plan_through_the_engine(tiny_dirs):
    from planner.plan import load_plan

    preset, hand = (load_plan(tiny_dirs[k] / "plan.json") for k in ("preset-2x4", "hand-2x4"))
    assert {d.node: d.strategy for d in preset.decisions} == {
        "blocks.*.attn1 (x2)": "head-TP(model)+SP(batch)",
        "blocks.*.attn2 (x2)": "head-TP(model)+SP(batch)",
        "blocks.*.ffn (x2)": "Megatron(model)+SP(batch)",
        "condition_embedder.time_embedder": "Megatron(model)",
        "condition_embedder.text_embedder": "Megatron(model)",
    }
    assert all(d.state == "STATE A" for d in preset.decisions if d.node.startswith("blocks."))
    assert all(any(x.reason == "not the tt-xla preset" for x in d.excluded) for d in preset.decisions)
    assert preset.predicted.step_seconds == pytest.approx(hand.predicted.step_seconds, rel=1e-9)


def test_progress_is_live_on_a_terminal():
    import io

    from wancompile.progress import Progress

    stream = io.StringIO()
    p = Progress(2, stream=stream, live=True)
    with p.step("solving"):
        import time

        time.sleep(0.45)
    text = stream.getvalue()
    assert text.startswith("\r[1/2] solving … 0.") and text.endswith(" s\n") and "\r[1/2] solving done in 0.4" in text
    with pytest.raises(ZeroDivisionError), p.step("failing"):
        1 / 0  # noqa: B018 (the failure under test)
    assert "\r[2/2] failing failed in" in stream.getvalue()


def test_explain_a_decision_names_choice_cost_collectives_and_alternatives(tiny_dirs, capsys):
    from planner.plan import load_plan

    plan = load_plan(tiny_dirs["auto-2x4"] / "plan.json")
    ffn = next(d for d in plan.decisions if d.node.startswith("blocks.*.ffn"))
    assert main(["explain", str(tiny_dirs["auto-2x4"]), "blocks.1.ffn"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == f"blocks.*.ffn (x2): {ffn.strategy}"
    assert lines[1].startswith(f"  cost: the best plan with it, {ffn.cost * 1e3:.3f} ms per forward")
    tp = re.match(r"Megatron\(([^)]*)\)", ffn.strategy)
    if tp:  # the row-parallel sum over the TP axes, with its bytes and op
        assert any(
            re.match(rf"    (all-reduce|reduce-scatter) +{re.escape(tp[1].replace('x', '+'))} ", line)
            and line.endswith("at blocks.*.ffn.net.2:linear#0")
            for line in lines
        ), out
    delta = (ffn.rejected_cost - ffn.cost) * 1e3
    assert (
        f"  best rejected: {ffn.rejected}, the best plan with it instead {ffn.rejected_cost * 1e3:.3f} ms per forward "
        f"({delta:+.3f} ms)"
    ) in lines
    assert "options priced (ms per forward): " in out and "=0.0" in out  # each option priced on its own


def test_plan_for_tenstorrent_runs_the_target_s_rewrites_and_says_why(tmp_path, capsys):
    """A Tenstorrent profile plans for tt-mlir, whose default is every rewrite (the program that compiles fused);
    plan.json says why each ran, and `export`, which applies specs to the unmodified model, says how to re-plan."""
    from rewrites import PASS_NAMES

    assert main(["plan", *TINY, "--mesh", "2x4", "--hardware", "wh-loudbox", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "plan.json").read_text())
    assert data["target"] == "tt-mlir"
    assert [r["name"] for r in data["rewrites"]] == list(PASS_NAMES)
    assert all(r["why"].startswith("tt-mlir's default: ") for r in data["rewrites"])
    assert {r["name"]: r["count"] for r in data["rewrites"]}["patch_embed"] == 1
    capsys.readouterr()
    assert main(["export", str(tmp_path), "-o", str(tmp_path / "sharding.py")]) == 2
    assert "--rewrites none" in capsys.readouterr().err


def test_explain_a_parameter_and_an_op(tiny_dirs, capsys):
    d = str(tiny_dirs["hand-2x4"])
    assert main(["explain", d, "blocks.1.attn1.to_out.0.weight"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[:3] == [
        "parameter blocks.*.attn1.to_out.0.weight (same spec in all 2 blocks)",
        "  spec: (R, S(1))",
        "  shape: (64, 64) bfloat16; per device (64, 16)",
    ]
    assert "all-reduce on model 3.0 KiB" in out
    for kv in ("permute#1", "permute#2"):  # K and V, gathered on the tokens where the plan pins them
        assert main(["explain", d, f"blocks.0.attn1:{kv}"]) == 0
        out = capsys.readouterr().out
        assert "-> 1 × 4 × 48 × 16 (R, S(1))" in out and out.count("all-gather on batch 1.5 KiB") == 1
    assert main(["explain", d, ":contiguous#0"]) == 0
    assert "constraint at :contiguous#0: (S(1), R) — block-stack entry: tokens split over the SP axes" in (
        capsys.readouterr().out
    )


def test_explain_unknown_names_near_misses(tiny_dirs, capsys):
    assert main(["explain", str(tiny_dirs["auto-2x4"]), "blocks.0.attn3"]) == 2
    err = capsys.readouterr().err
    assert (
        "no such decision, parameter, module or op: plan" in err
        and "has none named 'blocks.0.attn3'; try one of:" in err
    )
    assert main(["explain", str(tiny_dirs["auto-2x4"]), "blocks.99.attn1"]) == 2
    assert "no such block: plan" in capsys.readouterr().err


def test_diff_2x4_vs_8x4_shows_the_sp_change_and_its_cost(tiny_dirs, capsys):
    assert main(["diff", str(tiny_dirs["hand-2x4"]), str(tiny_dirs["hand-8x4"])]) == 0
    out = capsys.readouterr().out
    assert "mesh       2x4 ('batch', 'model')  ->  8x4 ('batch', 'model')" in out
    assert "  SP changed: batch (2-way) -> batch (8-way)" in out
    a = json.loads((tiny_dirs["hand-2x4"] / "plan.json").read_text())["predicted"]
    b = json.loads((tiny_dirs["hand-8x4"] / "plan.json").read_text())["predicted"]
    d = (b["step_seconds"] - a["step_seconds"]) * 1e3
    assert f"  step     {a['step_seconds'] * 1e3:.3f} -> {b['step_seconds'] * 1e3:.3f} ms ({d:+.3f} ms" in out
    assert "all-gather         batch        calls     5 -> 5" in out  # same K/V + exit gathers, over 8 devices now
    assert "collective bill per block: 5 big + 4 small -> 5 big + 4 small" in out


def test_report_rerenders_and_validate_checks(tiny_dirs, tmp_path, capsys):
    src = tiny_dirs["auto-2x4"]
    assert main(["report", str(src / "plan.json"), "--out", str(tmp_path)]) == 0
    assert (tmp_path / "plan.md").read_text() == (src / "plan.md").read_text()
    assert (tmp_path / "plan.html").read_text() == (src / "plan.html").read_text()
    assert main(["validate", str(src), str(tmp_path / "plan.json")]) == 0
    data = json.loads((tmp_path / "plan.json").read_text())
    del data["solver"]["gap"]
    (tmp_path / "plan.json").write_text(json.dumps(data))
    assert main(["validate", str(tmp_path)]) == 1
    assert "$.solver: missing required field 'gap'" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("model", ["wan2.2-t2v-a14b", "wan2.2-i2v-a14b", "wan2.2-ti2v-5b"])
def test_full_size_plan_on_galaxy_writes_valid_dumps(model, tmp_path):
    from html.parser import HTMLParser

    from wancompile.report import Report
    from wancompile.report.schema import errors

    assert (
        main(
            [
                "plan",
                "--model",
                model,
                "--component",
                "transformer",
                "--mesh",
                "8x4",
                "--hardware",
                "wh-galaxy",
                "--resolution",
                "720p",
                "--frames",
                "81",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    assert errors(json.loads((tmp_path / "plan.json").read_text())) == []
    rep = Report.load(tmp_path)
    assert rep.num_blocks == (30 if "5b" in model else 40) and rep.table_rows("block")
    assert rep.sp_axes() and rep.tp_axes(), rep.parallelism()
    md = (tmp_path / "plan.md").read_text()
    assert "| collectives per block | " in md and "## Why" in md and f"× {rep.num_blocks} blocks = " in md
    HTMLParser().feed((tmp_path / "plan.html").read_text())


def _user_env() -> dict:
    """The environment of a user's shell: none of the XLA settings conftest makes for this process."""
    import os

    from conftest import ROOT

    env = {k: v for k, v in os.environ.items() if k not in ("PJRT_DEVICE", "CPU_NUM_DEVICES", "XLA_FLAGS")}
    return {**env, "PYTHONPATH": str(ROOT)}


@pytest.mark.parametrize("verb", ["explain", "diff", "validate", "export"])
def test_the_verbs_that_read_a_plan_import_no_torch_diffusers_or_torch_xla(verb, tiny_dirs, tmp_path):
    import subprocess
    import sys

    plan = str(tiny_dirs["auto-2x4"])
    argv = {
        "explain": ["explain", plan, "blocks.0.ffn"],
        "diff": ["diff", plan, str(tiny_dirs["hand-2x4"])],
        "validate": ["validate", plan],
        "export": ["export", plan, "-o", str(tmp_path / "sharding.py")],
    }[verb]
    script = (
        "import sys\nfrom wancompile.cli import main\ncode = main(sys.argv[1:])\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'torch_xla', 'diffusers'}), code)"
    )
    proc = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, env=_user_env())
    assert proc.stdout.splitlines()[-1] == "[] 0", proc.stdout + proc.stderr


def test_the_package_imports_no_torch_and_loads_its_public_names_on_use():
    import subprocess
    import sys

    script = (
        "import sys, wancompile\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'torch_xla', 'diffusers'}))\n"
        "print(all(getattr(wancompile, n) is not None for n in wancompile.__all__))\n"
        "print(issubclass(wancompile.NonFiniteInputError, wancompile.VerificationError))"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=_user_env())
    assert proc.stdout.splitlines() == ["[]", "True", "True"], proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "where, level",
    [(["-v", "validate"], "INFO"), (["validate", "-v"], "INFO"), (["-v", "validate", "-v"], "DEBUG")],
)
def test_v_counts_before_and_after_the_verb(where, level, tiny_dirs):
    import logging

    assert main([*where, str(tiny_dirs["auto-2x4"])]) == 0
    assert logging.getLevelName(logging.getLogger("wancompile").level) == level


def test_plan_v_on_an_error_prints_that_error_s_traceback_then_the_one_line(tmp_path, capsys):
    assert main(["plan", *TINY, "--mesh", "2x", "--out", str(tmp_path), "-v"]) == 2
    err = capsys.readouterr().err
    assert "NoneType: None" not in err
    assert err.startswith("Traceback (most recent call last):") and "UsageError: --mesh: " in err
    assert err.splitlines()[-1].startswith("wancompile plan: error: --mesh: ")


def test_validate_names_each_missing_field_once(tiny_dirs, tmp_path, capsys):
    data = json.loads((tiny_dirs["auto-2x4"] / "plan.json").read_text())
    del data["solver"]["gap"], data["solver"]["seconds"], data["predicted"]["comm_seconds"]
    (tmp_path / "plan.json").write_text(json.dumps(data))
    assert main(["validate", str(tmp_path)]) == 1
    assert capsys.readouterr().out.splitlines()[1:] == [
        "  $.solver: missing required fields 'seconds', 'gap'",
        "  $.predicted: missing required field 'comm_seconds'",
    ]


def test_a_cli_run_leaves_no_console_handler_on_the_stderr_it_ran_under(tmp_path, monkeypatch):
    """In-process runs under a capture that closes afterwards (pytest's) must leave the loggers they
    configured writing to the stderr of the moment: diffusers' handler kept the closed one."""
    import io
    import logging
    import sys

    captured = io.StringIO()
    monkeypatch.setattr(sys, "stderr", captured)
    assert main(["plan", *TINY, "--mesh", "2x4", "--hand", "tt-xla", "--out", str(tmp_path), "-v"]) == 0
    monkeypatch.undo()
    captured.close()
    now = io.StringIO()
    monkeypatch.setattr(sys, "stderr", now)
    logging.getLogger("diffusers.models.modeling_utils").warning("after the run")
    logging.getLogger("wancompile").warning("after the run")
    assert now.getvalue().count("after the run") == 2


def test_plan_shows_its_stages_without_warnings_and_ends_with_the_summary(tiny_dirs, tmp_path):
    """As a user runs it: no XLA settings, the tiny model's own resolution and frames (no --resolution,
    --frames, --hardware), stderr only the stages, stdout ending in one line that sets the plan
    against the tt-xla hand plan of the same graph, mesh and budget."""
    import subprocess
    import sys

    from planner.hardware import get_profile
    from planner.plan import load_plan

    argv = [sys.executable, "-m", "wancompile.cli", "plan", "--model", "tiny", "--mesh", "2x4", "--out", str(tmp_path)]
    proc = subprocess.run(argv, capture_output=True, text=True, env=_user_env())
    assert proc.returncode == 0, proc.stderr
    stages = proc.stderr.splitlines()
    assert len(stages) == 4 and all(
        re.fullmatch(rf"\[{i}/4\] .+ … done in \d+\.\d\d s", s) for i, s in enumerate(stages, 1)
    )
    plan, hand = load_plan(tmp_path / "plan.json"), load_plan(tiny_dirs["hand-2x4"] / "plan.json")
    budget_gb = float(get_profile(plan.hardware).dram_bytes) / 1e9
    p, h = plan.predicted.step_seconds, hand.predicted.step_seconds
    last = proc.stdout.splitlines()[-1]
    assert (
        last.startswith(f"tiny on 2x4 wh-loudbox: {p * 1e3:.3f} ms per forward, ") and f" of {budget_gb:.2f} GB" in last
    )
    assert f"vs the tt-xla hand plan ({h * 1e3:.3f} ms, " in last and f"{h / p:.2f}x faster" in last
    assert last.endswith("the hand plan fits")


def test_without_stderr_lines_drops_only_the_named_lines_of_file_descriptor_2():
    import subprocess
    import sys

    script = (
        "import os\nfrom wancompile.progress import without_stderr_lines\n"
        "with without_stderr_lines('GSPMD sharding propagation is going to be deprecated'):\n"
        "    os.write(2, b'kept 1\\nW sharding_propagation.cc] GSPMD sharding propagation is going to be deprecated\\n')\n"
        "    os.write(2, b'kept 2\\n')\n"
        "os.write(2, b'after\\n')\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=_user_env())
    assert proc.returncode == 0 and proc.stderr == "kept 1\nkept 2\nafter\n", proc.stderr


def test_tt_check_without_out_writes_under_the_tt_cache_not_tmp(tmp_path, monkeypatch):
    import argparse

    from wancompile.cli.tt import _out_dir

    monkeypatch.setenv("WANCOMPILE_TT_CACHE", str(tmp_path))
    first, second = (_out_dir(argparse.Namespace(out=None)) for _ in range(2))
    assert first.parent == second.parent == tmp_path / "tt-check" and first != second and first.is_dir()
    assert _out_dir(argparse.Namespace(out=str(tmp_path / "mine"))) == tmp_path / "mine"


def test_summary_line_says_whether_the_hand_plan_fits_the_same_budget(tiny_dirs):
    from planner.plan import PlanError, load_plan
    from wancompile.cli.plan import summary_line

    auto, hand = load_plan(tiny_dirs["auto-2x4"] / "plan.json"), load_plan(tiny_dirs["hand-2x4"] / "plan.json")
    need = hand.predicted.memory_bytes_per_device
    assert summary_line(auto, need - 1, hand).endswith("the hand plan does not fit")
    assert summary_line(auto, need, hand).endswith("the hand plan fits")
    assert summary_line(hand, need - 1, None).endswith("(the tt-xla hand plan; it does not fit)")
    assert summary_line(auto, need, PlanError("heads do not divide")).endswith(
        "; the tt-xla hand plan does not apply here (note above)"
    )


@pytest.mark.parametrize("model", ["tiny", "wan2.2-t2v-a14b"])
def test_plan_defaults_to_the_model_s_own_resolution_and_frames(model, tmp_path):
    from wancompile.cli import _parser
    from wancompile.cli.plan import _check_plan_args
    from wancompile.models import get_model

    args = _parser().parse_args(["plan", "--model", model, "--mesh", "2x4", "--out", str(tmp_path)])
    _check_plan_args(args)  # before the capture: no "unknown resolution '720p' for tiny"
    spec = get_model(model)
    assert (args.resolution, args.frames) == (spec.default_resolution, spec.default_frames)
    assert spec.default_resolution in spec.resolutions
