"""The XLA runtime this process uses: virtual CPU devices, SPMD mode, HLO dump directory.

The PJRT client reads ``PJRT_DEVICE``, ``CPU_NUM_DEVICES`` and ``XLA_FLAGS`` once, when it starts;
after that the device count and the dump directory are fixed for the life of the process. Everything
here checks that instead of silently running on the wrong number of devices: a test or script that
needs another count runs in a subprocess (`subprocess_env`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

_DUMP_FLAG = "--xla_dump_to="


class RuntimeConfigError(RuntimeError):
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



def current_dump_dir() -> Optional[Path]:
    for f in os.environ.get("XLA_FLAGS", "").split():
        if f.startswith(_DUMP_FLAG):
            return Path(f[len(_DUMP_FLAG):])
    return None


def use_spmd() -> None:
    import torch_xla.runtime as xr

    if not xr.is_spmd():
        xr.use_spmd()


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
