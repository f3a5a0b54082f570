"""Every order a user can write the code in either works or is refused with the fix — never a crash.

torch_xla 2.9 cannot switch a started runtime to SPMD (wancompile/runtime.py: tensors made afterwards
stay on the physical device and the first sharded program dies with SIGSEGV). Each case runs in a
fresh process, because the order is about what the process did first:

- ``import-first``: ``import wancompile`` at the top, then eager XLA work (``xm.mark_step()``, an XLA
  tensor), the model and inputs moved to the XLA device, then the compile: it works and matches eager.
- ``xla-first``: XLA used before wancompile was ever imported (what diffusers' ``WanPipeline`` does with
  its ``xm.mark_step()`` per step): the compile raises `RuntimeConfigError` naming the fix.
- ``late-use-spmd``: the user forces ``torch_xla.runtime.use_spmd()`` after the runtime started:
  refused the same way (torch_xla only warns "Replicating tensors already initialized").
- ``devices-mismatch``: ``CPU_NUM_DEVICES`` set by the user disagrees with the mesh: an error, never
  rewritten; ``no-devices``: nothing configured: the backend sets them and says so on stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SEGFAULT = -11


def _child(case: str, **env_set: str) -> subprocess.CompletedProcess:
    env = {
        k: v for k, v in os.environ.items() if k not in ("XLA_USE_SPMD", "CPU_NUM_DEVICES", "PJRT_DEVICE", "XLA_FLAGS")
    }
    env.update(env_set)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, __file__, case], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )


def _result(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-4000:]
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("ENTRY ")]
    return json.loads(line[len("ENTRY ") :])


def _refused(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode not in (0, SEGFAULT, 128 + 11), (proc.returncode, proc.stderr[-3000:])
    assert "RuntimeConfigError" in proc.stderr, proc.stderr[-3000:]
    message = proc.stderr[proc.stderr.rindex("RuntimeConfigError: ") :]
    assert "TORCHDYNAMO_VERBOSE" not in message, message  # the message is ours alone (wancompile.catchable)
    return proc.stderr


@pytest.mark.slow
def test_import_first_then_eager_xla_then_compile_works_with_model_and_inputs_on_xla():
    row = _result(_child("import-first", PJRT_DEVICE="CPU", CPU_NUM_DEVICES="8"))
    assert row["out_device"] == "xla" and row["max_abs_vs_eager"] <= 5e-6, row


def test_xla_before_wancompile_is_refused_with_the_fix_not_a_segfault():
    err = _refused(_child("xla-first", PJRT_DEVICE="CPU", CPU_NUM_DEVICES="8"))
    assert "started without SPMD" in err and "import wancompile" in err and "pytorch/xla#9735" in err


def test_use_spmd_forced_after_the_runtime_started_is_refused():
    err = _refused(_child("late-use-spmd", PJRT_DEVICE="CPU", CPU_NUM_DEVICES="8"))
    assert "forced into it late" in err


def test_cpu_num_devices_that_disagrees_with_the_mesh_is_an_error_not_rewritten():
    err = _refused(_child("compile", PJRT_DEVICE="CPU", CPU_NUM_DEVICES="4"))
    assert "CPU_NUM_DEVICES=4 gives 4 virtual CPU devices but the mesh needs 8" in err


@pytest.mark.slow
def test_nothing_configured_the_backend_sets_virtual_devices_and_says_so():
    proc = _child("compile")
    row = _result(proc)
    assert row["devices"] == 8 and row["max_abs_vs_eager"] <= 5e-6, row
    assert "CPU_NUM_DEVICES=8: virtual CPU devices for the mesh's 8 devices" in proc.stderr


# --- the child process ------------------------------------------------------------------------------


def _tiny():
    import torch
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    # wancompile.models' "tiny" config, written out: importing wancompile here would decide the very
    # order this test is about (the "xla-first" case must not have imported it)
    model = WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=4,
        attention_head_dim=16,
        in_channels=4,
        out_channels=4,
        text_dim=32,
        freq_dim=16,
        ffn_dim=96,
        num_layers=2,
        rope_max_seq_len=32,
    ).eval()
    g = torch.Generator().manual_seed(1)
    return model, (torch.randn(1, 4, 3, 8, 8, generator=g), torch.tensor([500]), torch.randn(1, 7, 32, generator=g))


def main(case: str) -> None:
    import torch

    if case == "import-first":
        import wancompile  # noqa: F401  (first, as the README says)
    import torch_xla
    import torch_xla.core.xla_model as xm

    model, inputs = _tiny()
    with torch.no_grad():
        eager = model(*inputs, return_dict=False)[0]
    if case in ("xla-first", "late-use-spmd", "import-first"):
        xm.mark_step()
        (torch.ones(3, device=torch_xla.device()) * 2).cpu()
    if case == "late-use-spmd":
        import torch_xla.runtime as xr

        xr.use_spmd()
    if case == "import-first":
        model = model.to(torch_xla.device())
        inputs = tuple(t.to(torch_xla.device()) for t in inputs)
    compiled = torch.compile(model, backend="wan_autoshard", options={"mesh": "2x4", "plan": "tt-xla"})
    with torch.no_grad():
        out = compiled(*inputs, return_dict=False)[0]
    from wancompile import runtime

    print(
        "ENTRY "
        + json.dumps(
            {
                "out_device": out.device.type,
                "devices": runtime.device_count(),
                "max_abs_vs_eager": float((out.cpu() - eager).abs().max()),
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
