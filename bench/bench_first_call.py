"""Time to first call of a compiled DiT, in a first process and in a second one sharing the cache.

    python bench/bench_first_call.py [--config tiny|small] [--layers 40] [--mesh 2x4]

Two processes in turn compile the same model with ``backend="wan_autoshard"`` and the same fresh
``cache_dir`` (`wancompile.cache`): the first plans and compiles from scratch and fills the cache, the
second reads the plan by graph hash and XLA's executables from torch_xla's persistent compilation cache.
Each reports its first call split into:

- capture: dynamo's trace of the module plus the backend's annotation (the rest of the first call);
- plan: solving, or reading the cached plan (`wancompile.backend.CompileTimes`);
- lower: legalize, constraints, fold split (`CompileTimes`);
- XLA compile: torch_xla's ``CompileTime`` metric (main and fold programs; a cache load is not a compile);
- trace + run: the program's first call less XLA's compile (lazy tracing, transfers, execution).

``--config tiny`` is the tiny DiT (4 heads x 16), ``small`` the ÷16 A14B of bench/bench_score.py; both
have ``--layers`` blocks (the A14B has 40). The graph size, and so capture and planning, depends on the
block count, not the dims. On ``PJRT_DEVICE=CPU`` the XLA cache stays off (`wancompile.cache`: XLA:CPU
cannot load a serialized executable), so there the second process still compiles.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(config: str, layers: int, mesh: str, cache_dir: str) -> dict:
    import torch
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met

    import wancompile  # noqa: F401  (SPMD on before the runtime starts)
    from wancompile.backend import last_program

    if config == "small":
        sys.path.insert(0, str(ROOT / "bench"))
        from bench_score import small_inputs, small_model

        model, inputs = small_model(layers), small_inputs()
    else:
        from wancompile.models import build_transformer, transformer_inputs

        model, inputs = build_transformer("tiny", num_layers=layers), transformer_inputs("tiny", "tiny", 9)
    fn = torch.compile(model, backend="wan_autoshard", options={"mesh": mesh, "cache_dir": cache_dir}, fullgraph=True)
    start = time.perf_counter()
    with torch.no_grad():
        fn(**inputs, return_dict=False)
    xm.wait_device_ops()
    total = time.perf_counter() - start
    program = last_program()
    times = program.compile_times
    compile_s = (met.metric_data("CompileTime") or (0, 0))[1] / 1e9
    first = program.first_call_s
    return {
        "total_s": total,
        "capture_s": total - times.plan_s - times.lower_s - first,
        "plan_s": times.plan_s,
        "plan_cached": times.plan_cached,
        "lower_s": times.lower_s,
        "xla_compile_s": compile_s,
        "xla_compiles": (met.metric_data("CompileTime") or (0,))[0],
        "trace_run_s": first - compile_s,
        "persistent_cache_hits": met.counter_value("PersistentCacheHit") or 0,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", choices=("tiny", "small"), default="tiny")
    p.add_argument("--layers", type=int, default=40)
    p.add_argument("--mesh", default="2x4")
    p.add_argument("--cache-dir", help="the cache directory (default: a fresh temporary one)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print("ROW " + json.dumps(child(args.config, args.layers, args.mesh, args.cache_dir)))
        return
    devices = 1
    for n in args.mesh.split("x"):
        devices *= int(n)
    cache_dir = args.cache_dir or tempfile.mkdtemp(prefix="wancompile-cache-")
    env = dict(os.environ, PJRT_DEVICE="CPU", CPU_NUM_DEVICES=str(devices), XLA_USE_SPMD="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    rows = []
    for process in ("first", "second"):
        cmd = [sys.executable, __file__, "--child", "--config", args.config, "--layers", str(args.layers)]
        proc = subprocess.run(
            cmd + ["--mesh", args.mesh, "--cache-dir", cache_dir], env=env, capture_output=True, text=True
        )
        if proc.returncode:
            sys.exit(proc.stderr[-4000:])
        rows.append((process, json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("ROW "))[4:])))
    print(f"{args.config} DiT, {args.layers} blocks, mesh {args.mesh}, cache {cache_dir}; seconds\n")
    print("| process | capture | plan | lower | XLA compile (count) | trace + run | first call | cache hits |")
    print("|---|---|---|---|---|---|---|---|")
    for process, r in rows:
        print(
            f"| {process} | {r['capture_s']:.1f} | {r['plan_s']:.2f}{' (cached)' if r['plan_cached'] else ''} | "
            f"{r['lower_s']:.2f} | {r['xla_compile_s']:.1f} ({r['xla_compiles']}) | {r['trace_run_s']:.1f} | "
            f"{r['total_s']:.1f} | {r['persistent_cache_hits']} |"
        )


if __name__ == "__main__":
    from _docs import main_writing

    main_writing(
        main,
        "bench-first-call.md",
        "Time to first call: capture, plan, lower, XLA compile; a second process with the caches",
    )
