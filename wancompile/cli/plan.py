"""``wancompile plan``: check the arguments before anything slow runs, capture a few blocks on the meta
device, plan (the solver, or the tt-xla hand plan), write plan.json / plan.md / plan.html and a summary."""

from __future__ import annotations

import argparse
import logging
import math
import sys
from pathlib import Path

from planner.plan import Plan, PlanError
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
    args.resolution = args.resolution or spec.default_resolution
    args.frames = args.frames or spec.default_frames
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


# Records of other libraries on `plan`'s path that say nothing its user can act on (logger -> message
# starts): torch_xla picks the CPU runtime when diffusers imports it (the plan runs on the meta device,
# no runtime is used), and diffusers says a model built here in bf16 would better be loaded with
# ``torch_dtype`` (it is never loaded: the meta capture only needs shapes and dtypes).
_NOT_ACTIONABLE = {
    "": ("Defaulting to PJRT_DEVICE=",),
    "diffusers.models.modeling_utils": ("There are modules in ",),
}


def plan_command(args: argparse.Namespace) -> int:
    from wancompile.progress import Progress, diffusers_to_stderr, quiet

    explicit_hardware = args.hardware  # the target follows a named profile, not the mesh's default

    spec, mesh = _check_plan_args(args)
    hand = args.hand or (args.preset if args.preset != "auto" else None)  # --hand X: an alias of --preset X
    progress = Progress(3 if hand else 4)  # an auto plan is compared with the hand plan: one more step
    with (
        progress.step(f"capturing {args.capture_blocks}-block {args.model} {args.component} on meta"),
        quiet(_NOT_ACTIONABLE),
    ):
        import torch

        from wancompile.capture import capture_module
        from wancompile.models import build_transformer, transformer_inputs

        dtype = getattr(torch, args.dtype)
        num_layers = spec.transformer["num_layers"]
        module = build_transformer(args.model, device="meta", num_layers=min(args.capture_blocks, num_layers))
        diffusers_to_stderr()  # its handler, made at import, would write to the stderr of that moment
        module = module.to(dtype)
        inputs = transformer_inputs(
            args.model, args.resolution, args.frames, device="meta", dtype=dtype, batch=args.batch
        )
        graph, gm = capture_module(module, **inputs, return_dict=False, model=args.model)
        from planner.request import PlanRequest
        from planner.targets import default_target
        from wancompile.options import Options

        target = args.target or default_target(explicit_hardware)  # priced as the program it compiles to
        request = PlanRequest.make(mesh, args.hardware, target=target)
        rewrites, why = Options(rewrites=args.rewrites).rewrites_for(request.target)
        if rewrites:
            from wancompile.backend import rewrite_graph
            from wancompile.capture import annotate

            gm, records = rewrite_graph(gm, request, rewrites, why)
            graph = annotate(gm, model=args.model)
    log.info("captured %s", graph.summary())
    captured = graph

    from planner.cfg import plan_dit
    from wancompile.backend import HeadPadder

    padder = HeadPadder(gm, graph)  # padded-head options where a split does not divide the heads

    experts = args.experts if args.experts is not None else (2 if "a14b" in args.model else 1)
    budget = dict(
        target=target,
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
    if rewrites:
        plan = plan.with_(rewrites=records)
    for d in plan.decisions:
        log.info("decision %s: %s (next best %s)", d.node, d.strategy, d.rejected or "-")

    baseline: Plan | PlanError | None = None  # the hand plan on the same graph, whatever its memory
    if not hand:
        from planner.hand_plans import tt_xla_plan

        with progress.step("pricing the tt-xla hand plan, for comparison"):
            try:
                baseline = tt_xla_plan(captured, mesh, args.hardware, **{**budget, "memory_gb": None})
            except PlanError as e:  # its preconditions (whole heads, tokens over SP) do not hold here
                baseline = e

    from wancompile.report import write_dumps

    with progress.step("writing plan.json, plan.md, plan.html"):
        paths = write_dumps(plan, args.out, graph=graph, hardware=args.hardware, num_blocks=num_layers)

    print(f"plan for {plan.model} on mesh {plan.mesh} {plan.mesh.axis_names} ({plan.hardware}), target {plan.target}")
    print(
        f"  parameters: {len(plan.params)} ({len(plan.sharded_params())} sharded); activation constraints: "
        f"{len(plan.activations)}"
    )
    print(f"  solver: {plan.solver.status} in {plan.solver.seconds:.2f} s, gap {plan.solver.gap:.2%}")
    print(
        f"  tokens per forward: {spec.tokens(args.resolution, args.frames)}; blocks: {num_layers}; "
        f"weight sets resident: {experts}"
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
    if isinstance(baseline, PlanError):
        print(f"  note: the tt-xla hand plan does not apply: {baseline}")
    for kind in ("json", "md", "html"):
        print(f"wrote {paths[kind]}")
    print(summary_line(plan, budget_bytes(args), baseline))
    return 0


def budget_bytes(args: argparse.Namespace) -> float:
    """The per-device memory budget the plan was made for: ``--memory-gb``, else the profile's DRAM."""
    from planner.hardware import get_profile

    return args.memory_gb * 1e9 if args.memory_gb is not None else float(get_profile(args.hardware).dram_bytes)


def summary_line(plan: Plan, budget: float, baseline: Plan | PlanError | None) -> str:
    """`plan`'s result in one line, from its typed prediction: time per forward, memory against the
    budget, and against the hand plan (`baseline`: its plan, why it does not apply, or None when `plan`
    is the hand plan): how many times faster, and whether the hand plan fits the same budget."""
    p = plan.predicted
    line = (
        f"{plan.model} on {plan.mesh} {plan.hardware}: {p.step_seconds * 1e3:.3f} ms per forward, "
        f"{_size(p.memory_bytes_per_device)} of {_size(budget)} per device"
    )
    if baseline is None:
        return line + f" (the tt-xla hand plan; it {_fits(p.memory_bytes_per_device, budget)})"
    if isinstance(baseline, PlanError):
        return line + "; the tt-xla hand plan does not apply here (note above)"
    h = baseline.predicted
    faster = f"{h.step_seconds / p.step_seconds:.2f}x faster" if p.step_seconds else "no time predicted"
    return (
        line + f"; vs the tt-xla hand plan ({h.step_seconds * 1e3:.3f} ms, {_size(h.memory_bytes_per_device)}): "
        f"{faster}, the hand plan {_fits(h.memory_bytes_per_device, budget)}"
    )


def _fits(memory: float, budget: float) -> str:
    return "fits" if memory <= budget else "does not fit"


def _size(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.2f} MB"
