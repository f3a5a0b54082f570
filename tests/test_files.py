"""planner.files: a file is never half-written, and whenever plan.json exists the files beside it are
from the same write (injected failures at every step; SIGKILL at random moments, seeded)."""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from planner import files

from conftest import ROOT, TINY_PLAN

NAMES = ("plan.md", "plan.html", "graph.json", "plan.json")


def _set(gen: int, size: int = 1000) -> dict[str, str]:
    return {name: f"gen {gen} {name}\n" + "x" * size + f"\nend {gen}\n" for name in NAMES}


def _state(d: Path) -> dict[str, int]:
    """name -> generation of every set file present; asserts each is whole."""
    out = {}
    for name in NAMES:
        p = d / name
        if p.exists():
            text = p.read_text()
            gen = int(text.split()[1])
            assert text.startswith(f"gen {gen} {name}\n") and text.endswith(f"\nend {gen}\n"), f"{name} is not whole"
            out[name] = gen
    return out


def _assert_committed_set_is_consistent(d: Path) -> None:
    state = _state(d)
    if "plan.json" in state:  # the commit file: everything beside it is from its write
        assert set(state) == set(NAMES) and len(set(state.values())) == 1, state


def test_write_text_replaces_atomically_and_leaves_no_temporary(tmp_path):
    p = files.write_text(tmp_path / "a" / "x.txt", "one")
    assert p.read_text() == "one"
    files.write_text(p, "two")
    assert p.read_text() == "two" and not list(p.parent.glob(f".*{files.TMP_SUFFIX}"))


@pytest.mark.parametrize("step", range(2 * len(NAMES) + 1))
def test_a_failure_at_any_step_leaves_the_previous_set_or_none(tmp_path, monkeypatch, step):
    """Fail the k-th write or rename of the second set: before the commit begins the first set is
    intact; after it, plan.json is absent; never a plan.json beside another write's files."""
    files.write_set(tmp_path, _set(1), commit="plan.json")
    calls = {"n": 0}
    real_replace, real_write = os.replace, files._write_tmp

    def counted(fn):
        def wrapper(*a, **k):
            calls["n"] += 1
            if calls["n"] == step + 1:
                raise OSError(28, "No space left on device (injected)")
            return fn(*a, **k)

        return wrapper

    monkeypatch.setattr(files.os, "replace", counted(real_replace))
    monkeypatch.setattr(files, "_write_tmp", counted(real_write))
    failed = False
    try:
        files.write_set(tmp_path, _set(2), commit="plan.json")
    except OSError:
        failed = True
    monkeypatch.undo()
    assert failed == (step < 2 * len(NAMES))
    _assert_committed_set_is_consistent(tmp_path)
    state = _state(tmp_path)
    if step < len(NAMES):  # a temporary failed: nothing of the old set was touched
        assert state == {n: 1 for n in NAMES}
    assert not list(tmp_path.glob(f".*{files.TMP_SUFFIX}"))
    files.write_set(tmp_path, _set(3), commit="plan.json")  # the next write completes
    assert _state(tmp_path) == {n: 3 for n in NAMES}


_WRITER = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("files", sys.argv[1])
files = importlib.util.module_from_spec(spec); spec.loader.exec_module(files)
names = ("plan.md", "plan.html", "graph.json", "plan.json")
gen = 1
print("ready", flush=True)
while True:
    gen += 1
    files.write_set(sys.argv[2], {n: f"gen {gen} {n}\\n" + "x" * 400000 + f"\\nend {gen}\\n" for n in names}, commit="plan.json")
"""


def test_sigkill_at_random_moments_never_leaves_a_mixed_or_truncated_set(tmp_path):
    files.write_set(tmp_path, _set(1), commit="plan.json")
    rng = random.Random(10)
    seen = set()
    for _ in range(15):
        proc = subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(ROOT / "planner" / "files.py"), str(tmp_path)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.05))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        _assert_committed_set_is_consistent(tmp_path)
        seen.add("plan.json" in _state(tmp_path))
    files.write_set(tmp_path, _set(99), commit="plan.json")  # a later write cleans up the killed writers' temporaries
    assert _state(tmp_path) == {n: 99 for n in NAMES} and not list(tmp_path.glob(f".*{files.TMP_SUFFIX}"))
    assert True in seen  # some kills landed outside the commit window


@pytest.mark.slow
def test_killed_wancompile_plan_leaves_a_consistent_plan_or_none(tmp_path):
    """The real CLI, killed at random moments while it writes: whenever plan.json exists, plan.md and
    plan.html are exactly what it renders to."""
    from wancompile.report import Report
    from wancompile.report.markdown import render_markdown

    cmd = [sys.executable, "-m", "wancompile.cli", *TINY_PLAN, "--out", str(tmp_path)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    full = None
    rng = random.Random(3)
    for _ in range(4):
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        t0 = time.time()
        out = proc.communicate(timeout=300)[0] if full is None else None
        if full is None:  # first run: measure how long a plan takes, then kill later runs inside that span
            full = time.time() - t0
            continue
        time.sleep(rng.uniform(0.6, 1.0) * full)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        if (tmp_path / "plan.json").exists():
            rep = Report.load(tmp_path)
            assert (tmp_path / "plan.md").read_text() == render_markdown(rep)
            assert (tmp_path / "plan.html").exists()
    del out
