"""A denoising step of diffusers' real two-expert `WanPipeline` (tiny random weights), eager vs compiled, side by side.

    python bench/bench_pipeline.py [--mesh 2x4] [--steps 4] [--repeats 5]

Three copies of the same pipeline (same seeds, same weights) in one process on virtual CPU devices:
eager fp32, `wancompile.compile_pipeline(pipe, mesh=...)`, and the same with ``cfg_parallel=True``.
Calls are interleaved (eager, compiled, compiled+CFG, eager, ...) after one warm-up call each (which
compiles). A step's time is taken between consecutive ``callback_on_step_end`` calls (so it holds the
cond + uncond forwards, the scheduler step and the pipeline's ``xm.mark_step()``); the first step of a
call is left out. The VAE decode of the final latents is timed the same way. The tiny model's compute
is ~0, so on CPU this measures host overhead per step, not what a device would spend on compute.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mesh", default="2x4")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads for eager (default 1: XLA's CPU client runs its own threads, and "
        "eager with 2 threads on a loaded 2-core machine was 5x slower than with 1)",
    )
    args = ap.parse_args()

    from planner.mesh import parse_mesh
    from wancompile import runtime

    mesh = parse_mesh(args.mesh)
    runtime.configure(num_devices=mesh.size)
    runtime.use_spmd()  # before the eager pipeline's xm.mark_step() starts the runtime

    import torch

    torch.set_num_threads(args.threads)
    import wancompile
    from wancompile.models import build_tiny_pipeline, tiny_pipeline_inputs

    variants = {}
    for name, cfg in (
        ("eager (CPU fp32)", None),
        (f"wan_autoshard {args.mesh}", False),
        (f"wan_autoshard {args.mesh}, CFG batched", True),
    ):
        pipe = build_tiny_pipeline(two_experts=True)
        pipe.set_progress_bar_config(disable=True)
        if cfg is not None:
            wancompile.compile_pipeline(pipe, mesh=args.mesh, cfg_parallel=cfg)
        variants[name] = pipe

    def call(pipe):
        marks = []

        def on_step(p, i, t, kwargs):
            marks.append(time.perf_counter())
            return {}

        with torch.no_grad():
            latents = pipe(
                **tiny_pipeline_inputs(pipe, steps=args.steps), output_type="latent", callback_on_step_end=on_step
            ).frames
            z = latents.to(pipe.vae.dtype)
            t0 = time.perf_counter()
            pipe.vae.decode(z, return_dict=False)
            decode = time.perf_counter() - t0
        return [b - a for a, b in zip(marks, marks[1:])], decode

    warm = {}
    for name, pipe in variants.items():
        t0 = time.perf_counter()
        call(pipe)
        warm[name] = time.perf_counter() - t0
    steps = {name: [] for name in variants}
    decodes = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, pipe in variants.items():
            s, d = call(pipe)
            steps[name] += s
            decodes[name].append(d)

    base = statistics.median(steps["eager (CPU fp32)"])
    base_decode = statistics.median(decodes["eager (CPU fp32)"])
    print(
        f"tiny two-expert WanPipeline, {args.steps} steps x {args.repeats} interleaved calls, mesh {args.mesh} "
        f"({mesh.size} virtual CPU devices), {args.threads} torch thread(s)"
    )
    print()
    print("| variant | step, median | step vs eager | VAE decode, median | decode vs eager | first call (compiles) |")
    print("|---|---|---|---|---|---|")
    for name in variants:
        step, decode = statistics.median(steps[name]), statistics.median(decodes[name])
        print(
            f"| {name} | {step * 1e3:.1f} ms | {step / base:.2f} | {decode * 1e3:.1f} ms | "
            f"{decode / base_decode:.2f} | "
            f"{warm[name]:.1f} s |"
        )


if __name__ == "__main__":
    from _docs import main_writing

    main_writing(main, "bench-pipeline.md", "WanPipeline end to end on virtual CPU devices")
