"""Run diffusers' real Wan 2.2 two-expert `WanPipeline` (tiny random weights) eagerly and compiled on virtual devices.

    python -m pip install -e ".[pipeline]"   # diffusers' WanPipeline imports transformers (its T5 encoder)
    python examples/tiny_pipeline.py --mesh 2x4 [--steps 4] [--cfg-parallel] [--one-expert] [--memory-gb GB] [--json]

Builds the pipeline from tiny components the way diffusers' pipeline tests do (no text encoder: random
prompt embeddings), runs it eagerly in fp32, then `wancompile.compile_pipeline(pipe, mesh=...)` (both
experts and the full-T VAE decode with backend="wan_autoshard") and runs it again, reporting max-abs and
PCC of latents and frames against eager, the graphs dynamo compiled (and recompiled on a second call),
the fold-program runs, and wall times. The tiny model fits every device whole, so its plan shards no
weight (``0 sharded``): this checks the pipeline's wiring and numerics; ``examples/tiny_dit_sharded.py``
shows a sharded plan. ``--memory-gb`` passes a budget (0.001: the VAE decodes chunked-T, a third graph;
a budget small enough to shard the tiny DiT no longer holds the tiny VAE's decode of one latent frame).
"""

from __future__ import annotations

import argparse
import json
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mesh", default="2x4", help="device mesh, e.g. 2x4, 1x8")
    p.add_argument("--steps", type=int, default=4, help="denoising steps (boundary 0.875: the first step is expert 1)")
    p.add_argument("--cfg-parallel", action="store_true", help="run each step's cond + uncond as one batch-2 forward")
    p.add_argument("--one-expert", action="store_true", help="Wan 2.1 style: one transformer")
    p.add_argument("--hardware", default=None, help="cost-model profile (default: by mesh shape)")
    p.add_argument(
        "--memory-gb",
        type=float,
        default=None,
        help="per-device budget of every component (default: the profile's DRAM)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = p.parse_args(argv)
    import importlib.util

    if importlib.util.find_spec("transformers") is None:
        p.error('diffusers\' WanPipeline needs transformers: python -m pip install -e ".[pipeline]"')

    from planner.mesh import MeshError, parse_mesh

    try:
        mesh = parse_mesh(args.mesh)
    except MeshError as e:
        p.error(str(e))

    from wancompile import runtime

    # Before torch_xla starts (the pipeline's eager call starts it through xm.mark_step()): the device
    # count is fixed then, and SPMD must be on before any XLA tensor exists.
    runtime.configure(num_devices=mesh.size)
    runtime.use_spmd()

    import numpy as np
    import torch
    from torch._dynamo.utils import counters

    import wancompile
    from wancompile.models import build_tiny_pipeline, tiny_pipeline_inputs
    from wancompile.pipeline import compilation
    from wancompile.progress import GSPMD_DEPRECATION, without_stderr_lines
    from wancompile.verify import numerics

    pipe = build_tiny_pipeline(two_experts=not args.one_expert)
    pipe.set_progress_bar_config(disable=True)

    def run(output_type: str):
        t0 = time.perf_counter()
        with torch.no_grad():
            out = pipe(**tiny_pipeline_inputs(pipe, steps=args.steps), output_type=output_type).frames
        out = torch.from_numpy(np.asarray(out)) if output_type == "np" else out
        return out, time.perf_counter() - t0

    ref_frames, eager_first_s = run("np")
    ref_latents, eager_s = run("latent")
    wancompile.compile_pipeline(
        pipe, mesh=args.mesh, hardware=args.hardware, memory_gb=args.memory_gb, cfg_parallel=args.cfg_parallel
    )
    graphs0 = counters["stats"]["unique_graphs"]
    with without_stderr_lines(GSPMD_DEPRECATION):  # XLA's line per compiled program (docs/usage.md)
        frames, compiled_first_s = run("np")
        graphs1 = counters["stats"]["unique_graphs"]
        latents, compiled_s = run("latent")
    recompiles = counters["stats"]["unique_graphs"] - graphs1

    state = compilation(pipe)
    programs = state.programs()
    lat, fr = numerics(latents, ref_latents), numerics(frames, ref_frames)
    report = {
        "mesh": list(mesh.shape),
        "steps": args.steps,
        "experts": len(state.transformers),
        "cfg_parallel": args.cfg_parallel,
        "latents": {"pcc": lat.pcc, "max_abs": lat.max_abs},
        "frames": {"pcc": fr.pcc, "max_abs": fr.max_abs},
        "graphs_compiled": graphs1 - graphs0,
        "recompiles_second_call": recompiles,
        "fold_runs": programs[-1].fold.runs if programs and programs[-1].fold else 0,
        "fold_parameter_sets": programs[-1].fold.cached_sets() if programs and programs[-1].fold else 0,
        "weight_sets_budgeted": programs[-1].plan.weight_sets if programs else None,
        "plan": programs[-1].plan.summary().splitlines()[1].strip() if programs else None,
        "seconds": {
            "eager_first_call": eager_first_s,
            "eager_call": eager_s,
            "compiled_first_call": compiled_first_s,
            "compiled_call": compiled_s,
        },
    }
    if state.cfg is not None:
        report["cfg"] = {"batched": state.cfg.batched, "served": state.cfg.served, "fallthrough": state.cfg.fallthrough}
    if args.json:
        print(json.dumps(report))
        return 0
    print(
        f"WanPipeline, {report['experts']} expert(s), {args.steps} steps, mesh {args.mesh}"
        f"{', CFG batched' if args.cfg_parallel else ''}"
    )
    print(f"  plan: {report['plan']}; weight sets budgeted: {report['weight_sets_budgeted']}")
    print(
        f"compiled vs eager fp32: latents PCC {lat.pcc:.7f}, max-abs {lat.max_abs:.3g}; "
        f"frames PCC {fr.pcc:.7f}, max-abs {fr.max_abs:.3g}"
    )
    print(f"graphs compiled on the first call: {report['graphs_compiled']}; on the second call: {recompiles}")
    print(f"fold runs: {report['fold_runs']} over 2 calls ({report['fold_parameter_sets']} parameter sets cached)")
    print(
        f"wall: eager {eager_s:.3f} s/call; compiled {compiled_s:.3f} s/call (first call with compile "
        f"{compiled_first_s:.1f} s)"
    )
    if state.cfg is not None:
        print(
            f"CFG: {state.cfg.batched} batch-2 forwards, {state.cfg.served} uncond calls served from them, "
            f"{state.cfg.fallthrough} plain calls"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
