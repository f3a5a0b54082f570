"""`wancompile tt-check --json` in a subprocess with the mesh's virtual-device count, for the benches that
tabulate it (bench_tt_check, bench_tt_full): the report it prints, or ``{"failed": <its last lines>}``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def tt_check(mesh: str, args: list[str]) -> dict:
    """Run ``wancompile tt-check --mesh MESH ARGS --json`` with its programs in a folder deleted afterwards."""
    from planner.mesh import parse_mesh
    from wancompile.runtime import subprocess_env

    env = subprocess_env(parse_mesh(mesh).size)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    with tempfile.TemporaryDirectory(prefix="wancompile-tt-check-") as out:
        proc = subprocess.run(
            [sys.executable, "-m", "wancompile.cli", "tt-check", "--mesh", mesh, *args, "--out", out, "--json"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("{")), None)
    if line is None:
        return {"failed": " ".join((proc.stderr or proc.stdout).strip().splitlines()[-2:])}
    return json.loads(line)
