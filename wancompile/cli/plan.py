"""``wancompile plan``: check the arguments before anything slow runs, capture a few blocks on the meta
device, plan (the solver, or the tt-xla hand plan), write plan.json / plan.md / plan.html and a summary."""

from __future__ import annotations

import argparse
import logging
import math
import sys
from pathlib import Path

from wancompile.cli.args import UsageError, check_out_dir, check_video

log = logging.getLogger("wancompile")


def _check_plan_args(args: argparse.Namespace):
    """Every value `plan` needs, checked before anything slow runs: (model spec, mesh, hardware)."""
    from planner.hardware import UnknownHardware
    from planner.mesh import MeshError, parse_mesh
    from planner.request import PlanRequest
    from wancompile.models import get_model

    try:
        spec = get_model(args.model)
    except ValueError as e:
        raise UsageError(f"--model: {e}") from None
    check_video(spec, args.resolution, args.frames)
    try:
        mesh = parse_mesh(args.mesh)
    except MeshError as e:
        raise UsageError(f"--mesh: {e}") from None
    try:
        hw = PlanRequest.make(mesh, args.hardware).hw  # the one place a hardware name resolves (planner.request)
    except UnknownHardware as e:
        raise UsageError(f"--hardware: {e}") from None
    args.hardware = hw.name
    native = "x".join(map(str, hw.mesh_shape))
    if mesh.size > math.prod(hw.mesh_shape):
        raise UsageError(
            f"--mesh {mesh} has {mesh.size} devices but {hw.name} has {math.prod(hw.mesh_shape)} ({native}); "
            f"choose a profile for a system that large or a mesh of at most {math.prod(hw.mesh_shape)} devices"
        )
    if tuple(mesh.shape) != tuple(hw.mesh_shape):
        print(
            f"wancompile plan: warning: {hw.name}'s native mesh is {native}; mesh {mesh} is priced as part of it "
            f"(its links per axis). Pass --hardware for a {mesh} system if there is one",
            file=sys.stderr,
        )
    check_out_dir(Path(args.out), "--out")
    from wancompile.options import OptionsError, parse_rewrites

    try:
        args.rewrites = parse_rewrites(args.rewrites)
    except OptionsError as e:
        raise UsageError(f"--rewrites: {e}") from None
    return spec, mesh


def plan_command(args: argparse.Namespace) -> int:
    from wancompile.progress import Progress

    explicit_hardware = args.hardware  # the target follows a named profile, not the mesh's default

    spec, mesh = _check_plan_args(args)
    progress = Progress(3)
    with progress.step(f"capturing {args.capture_blocks}-block {args.model} {args.component} on meta"):
        import torch

        from wancompile.capture import capture_module
        from wancompile.models import build_transformer, transformer_inputs

        dtype = getattr(torch, args.dtype)
        num_layers = spec.transformer["num_layers"]
        module = build_transformer(args.model, device="meta", num_layers=min(args.capture_blocks, num_layers)).to(dtype)
        inputs = transformer_inputs(
            args.model, args.resolution, args.frames, device="meta", dtype=dtype, batch=args.batch
        )
        graph, gm = capture_module(module, **inputs, return_dict=False, model=args.model)
        if args.rewrites:
            from planner.request import PlanRequest
            from wancompile.backend import rewrite_graph
            from wancompile.capture import annotate

            gm, records = rewrite_graph(gm, PlanRequest.make(mesh, args.hardware), args.rewrites)
            graph = annotate(gm, model=args.model)
    log.info("captured %s", graph.summary())

    from planner.cfg import plan_dit
    from wancompile.backend import HeadPadder

    padder = HeadPadder(gm, graph)  # padded-head options where a split does not divide the heads

    experts = args.experts if args.experts is not None else (2 if "a14b" in args.model else 1)
    hand = args.hand or (args.preset if args.preset != "auto" else None)  # --hand X: an alias of --preset X
    budget = dict(
        model=args.model,
        memory_gb=args.memory_gb,
        num_blocks=num_layers,
        weight_sets=experts,
        time_limit_s=args.time_limit,
    )  # what the hand plan and the solver are both given
    with progress.step("planning" + (" (tt-xla hand plan)" if hand else f" on {mesh} for {args.hardware}")):
        if hand == "tt-xla":
            from planner.hand_plans import tt_xla_plan

            plan = tt_xla_plan(graph, mesh, args.hardware, **budget)
        else:
            plan = plan_dit(
                graph,
                mesh,
                args.hardware,
                cfg_parallel=args.cfg_parallel,
                preset=args.preset,
                pad_heads=padder,
                **budget,
            )
            graph = padder.graphs(plan.head_padding)[1]  # the graph the plan's locations name
    if args.rewrites:
        plan = plan.with_(rewrites=records)
    from planner.targets import default_target

    plan = plan.with_(target=args.target or default_target(explicit_hardware))
    for d in plan.decisions:
        log.info("decision %s: %s (next best %s)", d.node, d.strategy, d.rejected or "-")

    from wancompile.report import write_dumps

    with progress.step("writing plan.json, plan.md, plan.html"):
        paths = write_dumps(plan, args.out, graph=graph, hardware=args.hardware, num_blocks=num_layers)
    p = plan.predicted
    print(plan.summary())
    print(
        f"  tokens per forward: {spec.tokens(args.resolution, args.frames)}; blocks: {num_layers}; weight sets resident: {experts}"
    )
    if p.step_seconds:
        print(
            f"  predicted per forward: {p.step_seconds * 1e3:.1f} ms = compute {p.compute_seconds * 1e3:.1f} ms "
            f"({100 * p.compute_seconds / p.step_seconds:.0f}%) + comm {p.comm_seconds * 1e3:.1f} ms "
            f"({100 * p.comm_seconds / p.step_seconds:.0f}%)"
        )
    print(f"  memory per device: {p.memory_bytes_per_device / 1e9:.2f} GB")
    print(
        f"  solver: {plan.solver.status}, {plan.solver.seconds:.3f} s solving, gap {plan.solver.gap:.2%}; "
        f"capture {progress.times.get(next(iter(progress.times)), 0):.2f} s"
    )
    if plan.cfg_parallel is not None:
        c = plan.cfg_parallel
        print(
            f"  CFG parallel ({c.mode}): chosen {c.chosen}; "
            + "; ".join(
                f"{o.name} {o.step_seconds * 1e3:.1f} ms/step, {o.memory_bytes_per_device / 1e9:.2f} GB/device"
                + ("" if o.feasible else " (the caller's to run)")
                if o.step_seconds is not None
                else f"{o.name}: no plan"
                for o in c.options
            )
        )
    for d in plan.decisions:
        print(f"  {d.node}: {d.strategy}" + (f"  (next best: {d.rejected})" if d.rejected else ""))
    for n in plan.notes[2:]:
        print(f"  note: {n}")
    for kind in ("json", "md", "html"):
        print(f"wrote {paths[kind]}")
    return 0
