"""The XLA runtime this process uses: SPMD mode, virtual CPU devices, HLO dump directory.

The PJRT client reads ``PJRT_DEVICE``, ``CPU_NUM_DEVICES`` and ``XLA_FLAGS`` once, when it starts;
after that the device count and the dump directory are fixed for the life of the process. Everything
here checks that instead of silently running on the wrong number of devices: a test or script that
needs another count runs in a subprocess (`subprocess_env`).

SPMD mode has the same latch, and torch_xla 2.9 breaks it without a word: once the runtime has started
without SPMD (any XLA tensor, ``torch_xla.device()``, or ``xm.mark_step()`` — which diffusers'
``WanPipeline`` calls after every denoising step whenever torch_xla is installed), ``use_spmd()`` only
moves the tensors alive at that moment onto the virtual ``SPMD:0`` device. Tensors made afterwards
still land on the physical ``CPU:0``, and the first SPMD program that reads one of them (every scalar
constant is one) dies with SIGSEGV in ``PjRtComputationClient::ExecuteReplicated`` (pytorch/xla#9735).
Hence two rules:

* `enable_spmd_early` switches SPMD on when ``wancompile`` is imported, as long as the runtime has not
  started. ``torch.compile(m, backend="wan_autoshard")`` imports it (dynamo resolves the backend's
  entry point at that call), so compiling before the first pipeline call is always safe, and so is
  ``import wancompile`` at the top of a script.
* `require_spmd` runs at every compile: a runtime that started without SPMD, or was forced into it
  late, is refused with `RuntimeConfigError` naming the fix, before anything can crash.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from planner.errors import Error

_DUMP_FLAG = "--xla_dump_to="


class RuntimeConfigError(Error, RuntimeError):
    """The XLA runtime is (or would be) configured differently from what was asked."""


def runtime_started() -> bool:
    import sys

    if "torch_xla" not in sys.modules:
        return False
    import torch_xla

    return bool(torch_xla._XLAC._xla_runtime_is_initialized())


def configure(num_devices: Optional[int] = None, dump_dir: Optional[str | Path] = None) -> None:
    """Set the environment for `num_devices` virtual CPU devices and an HLO dump directory.

    Must run before the XLA runtime starts (the first XLA tensor or device query). If the runtime
    already runs, the request is checked against it instead.
    """
    if runtime_started():
        if num_devices is not None and device_count() != num_devices:
            raise RuntimeConfigError(
                f"this process's XLA runtime already has {device_count()} devices; {num_devices} were asked for. "
                f"The count is fixed when the runtime starts: run in a fresh process with "
                f"PJRT_DEVICE=CPU CPU_NUM_DEVICES={num_devices} (wancompile.runtime.subprocess_env)."
            )
        if dump_dir is not None and current_dump_dir() != Path(dump_dir):
            raise RuntimeConfigError(
                f"XLA already dumps to {current_dump_dir()}; XLA_FLAGS is read once per process. "
                f"Set XLA_FLAGS={_DUMP_FLAG}{dump_dir} before the first XLA use."
            )
        return
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    if num_devices is not None:
        os.environ["CPU_NUM_DEVICES"] = str(num_devices)
    if dump_dir is not None:
        flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(_DUMP_FLAG)]
        flags.append(f"{_DUMP_FLAG}{dump_dir}")
        os.environ["XLA_FLAGS"] = " ".join(flags)


def ensure_cpu_devices(num_devices: Optional[int], log) -> None:
    """Before the runtime starts, make sure a CPU runtime will have `num_devices` virtual devices.

    Where nothing is configured (no ``PJRT_DEVICE``, or ``CPU`` without ``CPU_NUM_DEVICES``) this sets
    ``PJRT_DEVICE=CPU`` and ``CPU_NUM_DEVICES`` and logs a warning saying so; a ``CPU_NUM_DEVICES``
    the user set that disagrees with the mesh is an error (never rewritten). Another ``PJRT_DEVICE``
    (a real accelerator) is left alone: the mesh is checked against its device count later."""
    if runtime_started() or num_devices is None:
        return
    if os.environ.get("PJRT_DEVICE", "CPU") != "CPU":
        return
    given = os.environ.get("CPU_NUM_DEVICES")
    if given is None:
        set_now = {"CPU_NUM_DEVICES": str(num_devices)}
        if "PJRT_DEVICE" not in os.environ:
            set_now = {"PJRT_DEVICE": "CPU", **set_now}
        os.environ.update(set_now)
        log.warning(
            "wan_autoshard: no XLA device count was configured; set %s: virtual CPU devices for the "
            "mesh's %d devices (set it yourself to silence this)",
            " ".join(f"{k}={v}" for k, v in set_now.items()),
            num_devices,
        )
    elif given.strip() != str(num_devices):
        raise RuntimeConfigError(
            f"CPU_NUM_DEVICES={given} gives {given} virtual CPU devices but the mesh needs {num_devices}; "
            f"set CPU_NUM_DEVICES={num_devices} (or unset it), or pass a mesh of {given} devices"
        )


def current_dump_dir() -> Optional[Path]:
    for f in os.environ.get("XLA_FLAGS", "").split():
        if f.startswith(_DUMP_FLAG):
            return Path(f[len(_DUMP_FLAG) :])
    return None


def use_spmd() -> None:
    """SPMD mode for this process (a no-op when on); refused when the runtime started without it."""
    import torch_xla.runtime as xr

    if not xr.is_spmd():
        if runtime_started():
            raise RuntimeConfigError(_LATE_SPMD.format(state="started without SPMD"))
        xr.use_spmd()


_SPMD_ENV = "XLA_USE_SPMD"

_LATE_SPMD = (
    "torch_xla's runtime {state} before wan_autoshard could switch it to SPMD: some XLA use ran first "
    "(an XLA tensor, torch_xla.device(), or xm.mark_step(), which diffusers' WanPipeline calls after every "
    "step). torch_xla 2.9 cannot move a started runtime to SPMD — tensors made afterwards stay on the "
    "physical device and the first sharded program crashes the process (pytorch/xla#9735). Fix: "
    "`import wancompile` (or call `torch.compile(..., backend='wan_autoshard')`, or "
    "`torch_xla.runtime.use_spmd()`) before the first XLA use, e.g. at the top of the script, or run "
    "with XLA_USE_SPMD=1."
)


def enable_spmd_early() -> bool:
    """Put the process in SPMD mode if the XLA runtime has not started yet (see the module doc).

    Sets ``XLA_USE_SPMD=1`` (what ``torch_xla.runtime.use_spmd()`` sets before the runtime starts)
    without importing torch_xla, so importing wancompile stays cheap. Returns whether SPMD is on
    (False: the runtime already runs without it; `require_spmd` will say so at compile time)."""
    import sys

    if os.environ.get(_SPMD_ENV, "").lower() in ("1", "true", "yes", "on"):
        return True
    if "torch_xla" in sys.modules and runtime_started():
        return False
    os.environ[_SPMD_ENV] = "1"
    return True


def spmd_state() -> str:
    """``"off"`` (runtime not started, SPMD not requested), ``"pending"`` (not started, SPMD on),
    ``"spmd"`` (started in SPMD mode), ``"non-spmd"`` (started without it), or ``"forced-late"``
    (``use_spmd()`` called after a non-SPMD start: new tensors land on the physical device)."""
    import torch_xla.runtime as xr

    if not runtime_started():
        return "pending" if xr.is_spmd() else "off"
    if not xr.is_spmd():
        return "non-spmd"
    import torch
    import torch_xla

    probe = torch.empty((), device=torch_xla.device())  # lazy: nothing is transferred or run
    return "spmd" if torch_xla._XLAC._xla_get_device_hw_type(probe).startswith("SPMD") else "forced-late"


def require_spmd() -> None:
    """SPMD mode on, or `RuntimeConfigError` before anything could crash (see the module doc)."""
    state = spmd_state()
    if state == "non-spmd":
        raise RuntimeConfigError(_LATE_SPMD.format(state="started without SPMD"))
    if state == "forced-late":
        raise RuntimeConfigError(_LATE_SPMD.format(state="started without SPMD and was forced into it late"))
    if state == "off":
        use_spmd()


def device_count() -> int:
    import torch_xla.runtime as xr

    return xr.global_runtime_device_count()


def subprocess_env(num_devices: int, dump_dir: Optional[str | Path] = None, **extra: str) -> dict[str, str]:
    """Environment for a child process with its own device count (and dump dir)."""
    env = dict(os.environ)
    env.update(PJRT_DEVICE="CPU", CPU_NUM_DEVICES=str(num_devices))
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(_DUMP_FLAG)]
    if dump_dir is not None:
        flags.append(f"{_DUMP_FLAG}{dump_dir}")
    env["XLA_FLAGS"] = " ".join(flags)
    env.update(extra)
    return env


def executions() -> int:
    """XLA programs run so far in this process (torch_xla's ``ExecuteReplicatedTime`` metric, after the
    pending ones end)."""
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met

    xm.wait_device_ops()  # the metric is recorded when an (asynchronous) execution ends
    data = met.metric_data("ExecuteReplicatedTime")
    return data[0] if data else 0
