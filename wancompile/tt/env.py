"""Where Tenstorrent's compiler lives on this machine, and how the worker process is started.

The ``tt`` extra (``pip install -e ".[tt]"``) installs jax, jaxlib and jax-tt-plugin (a PJRT plugin
bundling tt-mlir and tt-metal) beside torch_xla: torch_xla 2.9 imports jax only for its pallas kernels,
which wancompile does not use, and the plugin runs in a separate process (`wancompile.tt.worker`), so
the two never share an address space. A user whose jax must stay at torch_xla's ``pallas`` pin (0.7.1)
installs the extra into another environment and points ``WANCOMPILE_TT_PYTHON`` at its interpreter.

The plugin unpacks ~400 MB of runtime assets (a RISC-V toolchain among them) into ``$TMPDIR`` and keeps
a kernel cache in ``$TT_METAL_CACHE``; the worker runs with both under one folder,
``WANCOMPILE_TT_CACHE`` (default ``~/.cache/wancompile/tt``), so nothing lands in /tmp or $HOME at large.
A Wormhole compile at optimization level 1 grafts Wormhole's kernel sources into those assets first, downloading
them once into the same folder (`wancompile.tt.wormhole`); the worker's progress lines pass through to stderr.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Optional, Sequence

from planner.errors import Error

PLUGIN_VERSION = "0.1.3"  # the system descriptors' schema hash is this build's
INSTALL = 'python -m pip install -e ".[tt]"  (jax==0.10.2, jaxlib==0.10.2, jax-tt-plugin==0.1.3)'
SYSTEMS_DIR = Path(__file__).with_name("systems")
WORKER = Path(__file__).with_name("worker.py")
# committed system -> the hardware profile of its chips and links (planner.hardware), where there is one
SYSTEM_PROFILES = {
    "bh-2x4": "bh-loudbox",
    "bh-galaxy": "bh-galaxy",
    "wh-galaxy": "wh-galaxy",
    "wh-loudbox": "wh-loudbox",
    "wh-n300": "wh-n300",
}


class TtUnavailable(Error, RuntimeError):
    """Tenstorrent's compiler is not installed where wancompile looks for it; the message says how to install it."""


def python() -> str:
    """The interpreter that runs the worker: ``WANCOMPILE_TT_PYTHON``, else this one."""
    return os.environ.get("WANCOMPILE_TT_PYTHON") or sys.executable


def cache_dir() -> Path:
    """``WANCOMPILE_TT_CACHE``, default ``~/.cache/wancompile/tt`` (defined in `wancompile.tt.wormhole`, which the
    worker loads without this module)."""
    from wancompile.tt.wormhole import cache_dir

    return cache_dir()


def systems() -> dict[str, Path]:
    """System name -> its compile-only descriptor (committed in the package, `systems/README.md`)."""
    return {p.stem: p for p in sorted(SYSTEMS_DIR.glob("*.ttsys"))}


def system_path(name: str) -> Path:
    known = systems()
    if name not in known:
        raise ValueError(f"unknown Tenstorrent system {name!r}; choose one of {', '.join(known)}")
    return known[name]


@functools.lru_cache(maxsize=None)
def _probe(interpreter: str, need_plugin: bool) -> Optional[str]:
    probe = "import jaxlib.mlir.dialects.sdy" + ("; import jax_plugins.libtt" if need_plugin else "")
    try:
        res = subprocess.run([interpreter, "-c", probe], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"cannot run {python()} ({e}); set WANCOMPILE_TT_PYTHON to an interpreter with the tt extra"
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["?"])[-1]
        return f"{python()} cannot load Tenstorrent's compiler ({last}). Install it: {INSTALL}"
    return None


def available(need_plugin: bool = True) -> Optional[str]:
    """None when the worker's interpreter has jaxlib (and the plugin), else why not (with the fix)."""
    return _probe(python(), need_plugin)


def require(need_plugin: bool = True) -> None:
    why = available(need_plugin)
    if why is not None:
        raise TtUnavailable(why)


def run_worker(args: Sequence[str], timeout: float = 900, extra_env: Optional[Mapping[str, str]] = None):
    """Run the worker with the cache folder in place; returns the CompletedProcess (stdout, stderr text).
    Compiles run one at a time per cache folder (a file lock): the plugin writes the system descriptor it
    loads to ``$TMPDIR/tt_pjrt_system_descriptor`` and deletes it at exit, so two at once clobber each other
    ("system desc does not exist", seen with a benchmark and the fuzz side by side)."""
    import fcntl

    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    if args and args[0] == "compile":
        with open(cache / "compile.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            return _run(cache, args, timeout, extra_env)
    return _run(cache, args, timeout, extra_env)


def _run(cache: Path, args: Sequence[str], timeout: float, extra_env: Optional[Mapping[str, str]]):
    (cache / "tmp").mkdir(parents=True, exist_ok=True)
    (cache / "tt-metal-cache").mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "PJRT_", "CPU_NUM_DEVICES", "TPU_"))}
    env.update(
        TMPDIR=str(cache / "tmp"),
        TT_METAL_CACHE=str(cache / "tt-metal-cache"),
        WANCOMPILE_TT_CACHE=str(cache),  # where the worker keeps what it downloads (`wancompile.tt.wormhole`)
        JAX_PLATFORMS="tt",
        **dict(extra_env or {}),
    )
    return _run_passing_progress([python(), str(WORKER), *args], timeout, env, cache)


def _run_passing_progress(cmd: Sequence[str], timeout: float, env: Mapping[str, str], cwd: Path):
    """`subprocess.run(cmd, capture_output=True, text=True)`, except that the worker's progress lines on stderr
    (those starting with `wormhole.PROGRESS`: a first-run download) are also written to this process's stderr as
    they come."""
    import threading

    from wancompile.tt.wormhole import PROGRESS

    proc = subprocess.Popen(
        list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(env), cwd=str(cwd)
    )
    out: list[str] = []
    err: list[str] = []

    def stdout():
        out.extend(proc.stdout)

    def stderr():
        for line in proc.stderr:
            err.append(line)
            if line.startswith(PROGRESS):
                sys.stderr.write(line)
                sys.stderr.flush()

    readers = [threading.Thread(target=stdout, daemon=True), threading.Thread(target=stderr, daemon=True)]
    for r in readers:
        r.start()
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        for r in readers:
            r.join()
        raise subprocess.TimeoutExpired(list(cmd), timeout, "".join(out), "".join(err)) from None
    for r in readers:
        r.join()
    return subprocess.CompletedProcess(list(cmd), rc, "".join(out), "".join(err))


# the lines of a compiler's log that say what went wrong (its log is mostly "info" lines)
_FAILURE = re.compile(r"error|fatal|critical|TT_THROW|Segmentation|Aborted", re.IGNORECASE)


def worker_failure(res) -> str:
    """What a compiler process that printed no result died of: its exit (a signal by name) and the last
    line of its log that names a failure (else its last line)."""
    import signal

    rc = res.returncode
    how = f"exit {rc}"
    if rc < 0:
        try:
            how = f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            pass
    lines = (res.stderr or res.stdout or "").strip().splitlines()
    said = next((x for x in reversed(lines) if _FAILURE.search(x)), lines[-1] if lines else "no output")
    return f"the compiler process failed ({how}): {said.strip()}"


def compile_program(module: Path, desc: Path, export: Path, options: Mapping[str, str]) -> tuple[Optional[dict], str]:
    """One compile in the worker (its ``compile`` verb): (its result, "" ) or (None or its result, why it failed).
    A compile at level >= 1 whose op model aborts the process (LLVM ERROR; wh-galaxy's assembled descriptor has
    an 8x8 worker grid, the op model's device 8x9) is made again at level 0, its result saying why."""
    res = run_worker(["compile", str(module), str(desc), str(export), json.dumps(dict(options))])
    line = next((x for x in res.stdout.splitlines() if x.startswith("TT-CHECK ")), None)
    aborted = next((x.strip() for x in res.stderr.splitlines() if "LLVM ERROR: OpModel" in x), "")
    if line is None and aborted and int(options.get("optimization_level", "0")) >= 1:  # level 1's op model died
        r, failure = compile_program(module, desc, export, {**options, "optimization_level": "0"})
        why = f"level 1's op model aborted the compiler ({aborted}), so fused attention is decomposed at level 0"
        return (None if r is None else {**r, "level_0_because": why}), failure
    if line is None:
        return None, worker_failure(res)
    r = json.loads(line[len("TT-CHECK ") :])
    return r, r["error"] if not r["ok"] else ""
