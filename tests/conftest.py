"""Shared fixtures: one SPMD XLA runtime with 8 virtual CPU devices per test process, tiny models.

The PJRT client reads its device count and XLA_FLAGS once, so they are set here, before anything
imports torch_xla. Tests that need another device count run a subprocess
(`wancompile.runtime.subprocess_env`).
"""

import os
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HLO_DUMP = Path(tempfile.mkdtemp(prefix="wancompile-test-hlo-"))
os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ["CPU_NUM_DEVICES"] = "8"
os.environ["XLA_FLAGS"] = " ".join(
    [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith("--xla_dump_to=")] + [f"--xla_dump_to={HLO_DUMP}"]
)
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def spmd():
    """The process's SPMD runtime (8 virtual CPU devices)."""
    from wancompile import runtime

    runtime.use_spmd()
    assert runtime.device_count() == 8
    return runtime


@pytest.fixture(scope="session")
def tiny_model():
    from wancompile.models import build_transformer

    return build_transformer("tiny")


@pytest.fixture(scope="session")
def tiny_inputs():
    from wancompile.models import transformer_inputs

    return transformer_inputs("tiny", "tiny", 9)


@pytest.fixture(scope="session")
def tiny_capture(tiny_model, tiny_inputs):
    """(Graph, GraphModule) of the tiny DiT as dynamo hands it to a backend."""
    from wancompile.capture import capture_module

    return capture_module(tiny_model, **tiny_inputs, return_dict=False, model="tiny")


def run_script(args, num_devices, timeout=900):
    """Run a Python script in a subprocess with its own virtual device count; return stdout."""
    import subprocess

    from wancompile.runtime import subprocess_env

    env = subprocess_env(num_devices)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{args} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc.stdout
