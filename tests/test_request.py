"""One plan request (`planner.request.PlanRequest`) and one dispatcher (`planner.families`).

A compile's hardware profile and target are resolved in one place (`PlanRequest.make`), the profile priced for
the target once; the planner's families say what a graph is by its structure, for the backend and the planner.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import torch

from planner.families import FAMILIES, family_of
from planner.mesh import parse_mesh
from planner.request import PlanRequest
from planner.targets import TARGETS

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("call", ["resolve_hardware(", "get_target("])
def test_hardware_and_target_are_resolved_in_one_place(call):
    own = {"resolve_hardware(": "planner/hardware.py", "get_target(": "planner/targets.py"}[call]
    out = subprocess.run(
        ["git", "grep", "-n", "-F", call, "--", "planner", "wancompile", "rewrites"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    sites = [line for line in out.splitlines() if not line.startswith(own + ":") and "def " not in line]
    assert [s.split(":")[0] for s in sites] == ["planner/request.py"], sites


def test_the_request_prices_the_profile_for_its_target_once():
    mesh = parse_mesh("2x4")
    tt = PlanRequest.make(mesh, "wh-loudbox", "tt-mlir", memory_gb=1.0, cfg_parallel=True)
    assert tt.target is TARGETS["tt-mlir"] and tt.hw.unlowerable == TARGETS["tt-mlir"].unlowerable
    assert tt.hardware.name == tt.hw.name == "wh-loudbox" and tt.hardware.unlowerable == ()
    assert tt.cfg_parallel == "on" and tt.budget_bytes == 1e9
    gspmd = PlanRequest.make(mesh, "wh-loudbox")
    assert (
        gspmd.target is TARGETS["gspmd"]
        and gspmd.hw.unlowerable == ()
        and gspmd.budget_bytes == float(gspmd.hw.dram_bytes)
    )
    # a variant derives, never resolves again: the same profile object
    split = tt.variant(batch_axes=("cfg",))
    assert split.hw is tt.hw and split.target is tt.target
    # as the backend compiles: on the mesh the target's partitioner accepts (tt-mlir: 2x4, not 4x2)
    placed = PlanRequest.make(parse_mesh("4x2"), "wh-loudbox", "tt-mlir", on_target_mesh=True)
    assert placed.mesh.shape == (2, 4)


def test_one_dispatcher_recognises_the_dit_and_the_vae_by_structure(tiny_capture):
    import wancompile.vae as wvae
    from wancompile.capture import annotate, capture_fx
    from wancompile.vae.configs import build_vae

    assert [f.name for f in FAMILIES] == ["wan-vae", "wan-dit"]
    assert family_of(tiny_capture[0]).name == "wan-dit"
    vae = wvae.enable_full_t(build_vae("tiny-wan2.1"))
    z = torch.randn(1, vae.config.z_dim, 3, 8, 8)
    assert family_of(annotate(capture_fx(vae.decode, z))).name == "wan-vae"
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8))
    assert family_of(annotate(capture_fx(mlp, torch.randn(2, 8)))) is None  # runs replicated


def test_cfg_sequential_is_a_decision_not_an_error():
    """No planner module raises to report a choice, and no contextvar carries one between modules."""
    for path in (ROOT / "planner").glob("*.py"):
        assert not re.search(r"raise CfgSequential", path.read_text()), path
    for path in (ROOT / "wancompile").rglob("*.py"):
        assert "ContextVar" not in path.read_text(), path
