"""Project habits that a newcomer relies on: lint clean, no pointers outside the project, no stray
backup files, one default-hardware rule for every entry point."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    return [ROOT / p for p in out.stdout.splitlines()]


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None, reason="ruff not installed (pip install -e '.[test]')")
def test_ruff_check_is_clean():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:]


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None, reason="ruff not installed (pip install -e '.[test]')")
def test_ruff_format_is_applied():
    """`python -m ruff format .` once, then kept: a diff is formatting-free to review."""
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "."], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout[-3000:]


def test_nothing_points_outside_the_project():
    """A clone has no ../shared: design facts the project cites live in docs/ (design.md, seeds.md,
    hardware-figures.md)."""
    bad = []
    for p in _tracked():
        if p.suffix not in (".py", ".md", ".toml", ".txt", ".json") or not p.is_file() or p.name == "test_habits.py":
            continue
        for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            if re.search(r"(\.\./|\b)shared/(seeds|reference)\b|\.\./shared\b", line) and not line.startswith("<!--"):
                bad.append(f"{p.relative_to(ROOT)}:{i}: {line.strip()[:100]}")
    assert not bad, "\n".join(bad)
    for doc in ("design.md", "seeds.md", "hardware-figures.md", "errors.md"):
        assert (ROOT / "docs" / doc).is_file(), doc


def test_no_backup_files_are_tracked():
    assert not [p for p in _tracked() if p.suffix in (".bak", ".orig", ".rej") or p.name.endswith("~")]


def test_one_default_hardware_rule_for_every_entry_point(tiny_capture):
    from planner import plan_graph
    from planner.hardware import PROFILES, default_hardware
    from planner.mesh import parse_mesh
    from wancompile import backend, cli

    assert backend.default_hardware is default_hardware
    for shape, name in {(1, 2): "wh-n300", (2, 4): "wh-loudbox", (8, 4): "wh-galaxy"}.items():
        assert default_hardware(parse_mesh(shape)) == name and PROFILES[name].mesh_shape == shape
    assert plan_graph(tiny_capture[0], parse_mesh("2x4")).hardware == "wh-loudbox"  # the library
    assert (
        cli._parser().parse_args(["plan", "--model", "tiny", "--mesh", "8x4", "--out", "x"]).hardware is None
    )  # the CLI: by mesh
