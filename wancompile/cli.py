"""The ``wancompile`` console script.

``wancompile plan --model wan2.2-t2v-a14b --component transformer --mesh 8x4 --hardware wh-galaxy
--resolution 720p --frames 81 --out DIR`` plans a full-size model on the meta device (no weights, no
accelerator): it captures a 2-block copy of the transformer (the planner shares decisions across
identical blocks and writes them for all of them by name), solves, writes ``DIR/plan.json`` and prints
a summary.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Optional, Sequence


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="wancompile", description="Wan 2.2 auto-sharding compiler tools")
    sub = p.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="plan a model's sharding on the meta device and write plan.json")
    plan.add_argument("--model", required=True, help="wan2.2-t2v-a14b | wan2.2-i2v-a14b | wan2.2-ti2v-5b | tiny")
    plan.add_argument("--component", default="transformer", choices=["transformer"])
    plan.add_argument("--mesh", required=True, help="mesh shape, e.g. 8x4 (axes batch, model)")
    plan.add_argument("--hardware", default="wh-galaxy", help="hardware profile (planner.hardware.PROFILES)")
    plan.add_argument("--resolution", default="720p")
    plan.add_argument("--frames", type=int, default=81)
    plan.add_argument("--out", required=True, help="directory for plan.json")
    plan.add_argument("--memory-gb", type=float, default=None, help="per-device budget (default: the profile's DRAM)")
    plan.add_argument("--experts", type=int, default=None, help="weight sets resident per device (default 2 for A14B, else 1)")
    plan.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    plan.add_argument("--capture-blocks", type=int, default=2)
    plan.add_argument("--time-limit", type=float, default=5.0, help="solver time limit, seconds")
    return p


def plan_command(args: argparse.Namespace) -> int:
    import torch

    from planner import plan_graph
    from planner.mesh import parse_mesh
    from planner.plan import PlanError, save_plan
    from wancompile.capture import capture_module
    from wancompile.models import build_transformer, get_model, transformer_inputs

    t0 = time.perf_counter()
    spec = get_model(args.model)
    dtype = getattr(torch, args.dtype)
    num_layers = spec.transformer["num_layers"]
    module = build_transformer(args.model, device="meta", num_layers=min(args.capture_blocks, num_layers)).to(dtype)
    inputs = transformer_inputs(args.model, args.resolution, args.frames, device="meta", dtype=dtype)
    graph, _ = capture_module(module, **inputs, return_dict=False, model=args.model)
    t1 = time.perf_counter()
    experts = args.experts if args.experts is not None else (2 if "a14b" in args.model else 1)
    try:
        plan = plan_graph(graph, parse_mesh(args.mesh), args.hardware, memory_gb=args.memory_gb, num_blocks=num_layers,
                          weight_copies=experts, time_limit_s=args.time_limit, model=args.model)
    except PlanError as e:
        print(f"wancompile plan: {e}", file=sys.stderr)
        return 2
    t2 = time.perf_counter()
    out = save_plan(plan, Path(args.out) / "plan.json")
    p = plan.predicted
    print(plan.summary())
    print(f"  tokens per forward: {spec.tokens(args.resolution, args.frames)}; blocks: {num_layers}; weight sets resident: {experts}")
    print(f"  predicted per forward: {p.step_seconds * 1e3:.1f} ms = compute {p.compute_seconds * 1e3:.1f} ms "
          f"({100 * p.compute_seconds / p.step_seconds:.0f}%) + comm {p.comm_seconds * 1e3:.1f} ms ({100 * p.comm_seconds / p.step_seconds:.0f}%)")
    print(f"  memory per device: {p.memory_bytes_per_device / 1e9:.2f} GB")
    print(f"  solver: {plan.solver.status}, {plan.solver.seconds:.3f} s solving, gap {plan.solver.gap:.2%}; "
          f"capture {t1 - t0:.2f} s, build + solve {t2 - t1:.2f} s")
    for d in plan.decisions:
        print(f"  {d.node}: {d.strategy}" + (f"  (next best: {d.rejected})" if d.rejected else ""))
    for n in plan.notes[2:]:
        print(f"  note: {n}")
    print(f"wrote {out}")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "plan":
        return plan_command(args)
    return 1


if __name__ == "__main__":
    sys.exit(main())
