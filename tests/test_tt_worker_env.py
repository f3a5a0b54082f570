"""The tt worker runs in any interpreter with jax and Tenstorrent's plugin: ``WANCOMPILE_TT_PYTHON`` may name one
where wancompile (and torch) are not installed, as docs/tenstorrent.md offers for a user whose jax must stay at
torch_xla's pin. The interpreter here is a venv that sees this environment's packages as a plain path entry (their
``.pth`` files unread, so the editable wancompile is not found) with torch, torch_xla and the project's packages
made unimportable outright."""

import json
import os
import subprocess
import sys
import sysconfig
import venv

import pytest

from conftest import ROOT

HIDDEN = ("wancompile", "planner", "rewrites", "torch", "torch_xla")


def _tt_missing():
    from wancompile.tt.env import available

    return available()


@pytest.fixture(scope="module")
def jax_only_python(tmp_path_factory) -> str:
    where = tmp_path_factory.mktemp("jax-only")
    venv.create(where, with_pip=False)
    python = str(where / "bin" / "python")
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    with open(os.path.join(site, "jax_only.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
        f.write(f"import sys; sys.modules.update(dict.fromkeys({list(HIDDEN)!r}))\n")
    return python


def _imports(python: str, module: str) -> bool:
    return subprocess.run([python, "-c", f"import {module}"], capture_output=True, cwd=ROOT).returncode == 0


def test_the_interpreter_under_test_has_jax_but_no_wancompile_nor_torch(jax_only_python):
    assert _imports(jax_only_python, "jaxlib.mlir.dialects.sdy")
    assert not any(_imports(jax_only_python, m) for m in HIDDEN)


def test_the_worker_starts_without_wancompile(jax_only_python):
    """Run by path as `wancompile.tt.env` runs it: a wrong verb gets the worker's own answer, not an ImportError."""
    from wancompile.tt.env import WORKER

    res = subprocess.run([jax_only_python, str(WORKER), "no-such-verb"], capture_output=True, text=True, cwd="/")
    assert res.returncode != 0
    assert "unknown verb 'no-such-verb'" in res.stderr, res.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.skipif(bool(_tt_missing()), reason=f"tt extra missing: {_tt_missing()}")
def test_tt_check_of_the_tiny_dit_passes_with_the_worker_in_a_jax_only_interpreter(jax_only_python, tmp_path):
    """The whole check (Shardy conversion, parameter marks, constant pins, the compile) in that interpreter, with
    the defaults a user gets: bf16 and tt-mlir's rewrites, so the DiT is compiled at optimization level 1 with one
    fused SDPA per attention call, and plan.json says why each rewrite ran."""
    env = {**os.environ, "WANCOMPILE_TT_PYTHON": jax_only_python}
    args = ["tt-check", "--model", "tiny", "--plan", "tt-xla", "--mesh", "1x2", "--system", "bh-p300"]
    args += ["--dtype", "bfloat16"]
    proc = subprocess.run(
        [sys.executable, "-m", "wancompile.cli", *args, "--out", str(tmp_path), "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=1200,
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("{")), None)
    assert line is not None, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = json.loads(line)
    assert report["ok"], report["programs"]
    assert all(p["compiled"] and p["as_predicted"] for p in report["programs"]), report["programs"]
    main = next(p for p in report["programs"] if p["program"] == "wan-dit")
    assert main["options"]["optimization_level"] == "1", main["level_0_because"]
    sdpa = sum(part["ops"].get("ttnn.scaled_dot_product_attention", 0) for part in main["ttnn_ops_by_part"])
    assert sdpa == 4 and not main["score_matrices"]  # 2 blocks x (self, cross)
    with open(tmp_path / "plan.json") as f:
        rewrites = {r["name"]: r for r in json.load(f)["rewrites"]}
    assert rewrites["patch_embed"]["count"] == 1 and "optimization_level 1" in rewrites["patch_embed"]["why"]
