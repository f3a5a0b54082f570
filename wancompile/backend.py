"""The ``wan_autoshard`` dynamo backend: capture -> plan -> lower -> (verify) -> run.

    torch.compile(pipe.transformer, backend="wan_autoshard", options={"mesh": "8x4"})

Registered under the ``torch_dynamo_backends`` entry-point group (pyproject.toml), so the name works
after ``pip install`` without importing wancompile. Each graph dynamo hands over is annotated
(`wancompile.capture`), given a plan (a saved ``plan.json`` when the ``plan`` option is set, else
the planner's), checked against the graph, and lowered to torch_xla SPMD (`wancompile.lowering`).

If dynamo breaks the model into several graphs, each is planned on its own; a graph that is not a
Wan DiT (no attention blocks) runs replicated and the log says so — nothing is silently sharded
without a plan that fits it.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import torch
import torch.fx as fx

from planner.cfg import CfgSequential, runs_as_two_forwards
from planner.graph import Graph
from planner.hardware import default_hardware as default_hardware  # re-exported: the one default rule
from planner.mesh import MeshSpec
from planner.plan import InfeasiblePlanError, Plan, PlanError, RewriteRecord, load_plan
from planner.request import PlanRequest
from wancompile import runtime
from wancompile.capture import annotate
from wancompile.options import Options
from wancompile.planning import HeadPadder, plan_for, request_for, solved_plan, symbol_values
from wancompile.planning import replicated_plan as replicated_plan
from wancompile.planning import solve as solve
from wancompile.programs import Component as Component  # re-exported
from wancompile.programs import last_program as last_program
from wancompile.programs import recent_programs as recent_programs
from wancompile.programs import remember
from wancompile.wrappers import _GuardedProgram, _Verifying

log = logging.getLogger("wancompile")


@dataclass(frozen=True)
class CompileTimes:
    """Where a graph's compile went, in seconds (`ShardedProgram.compile_times`): planning (solving, or
    reading a saved or cached plan) and lowering (legalize, constraints, fold split). Dynamo's capture
    comes before and XLA's compile after (the program's first call)."""

    plan_s: float
    lower_s: float
    plan_cached: bool  # the plan came from the plan cache (`wancompile.cache`)


def wan_autoshard(
    gm: fx.GraphModule, example_inputs: list, *, options: Optional[Mapping[str, Any]] = None, **_: Any
) -> Callable:
    """The backend. The project's errors (docs/errors.md) reach the caller as themselves, past dynamo's
    ``BackendCompilerFailed`` and without its advice appended (`wancompile.catchable`): ``except
    wancompile.Error`` works."""
    from wancompile.catchable import catchable

    try:
        return _compile(gm, options)
    except Exception as e:
        raise catchable(e) from e.__cause__


def _compile(gm: fx.GraphModule, options: Optional[Mapping[str, Any]]) -> Callable:
    opts = Options.from_user(options)
    _start_runtime(opts)
    from planner.families import family_of
    from wancompile.lowering import ShardedProgram, mesh_for_plan, xla_mesh

    saved = load_plan(opts.plan) if isinstance(opts.plan, Path) else None
    asked = opts.mesh or MeshSpec((1, runtime.device_count()), ("batch", "model"))
    # the one request this compile plans, lowers and checks under: hardware and target resolved here, once
    request = request_for(
        opts, asked, target=opts.target or (saved.target if saved else None), on_target_mesh=opts.xla_mesh is None
    )
    mesh_obj = opts.xla_mesh if opts.xla_mesh is not None else xla_mesh(request.mesh)
    rewrites, why = opts.rewrites_for(request.target, tuple(r.name for r in saved.rewrites) if saved else None)
    gm, records = rewrite_graph(gm, request, rewrites, why)
    graph = annotate(gm)
    family = family_of(graph)  # what the graph is: the planner's one dispatcher (planner.families)
    model = Component.of(family.name if family is not None else None)
    # a VAE decode: its causal convs' H/W zero padding inside the conv, for clean halos (wancompile/vae/legalize.py)
    if model is Component.VAE:
        from wancompile.vae.legalize import fold_conv_padding

        gm, _ = fold_conv_padding(gm)
        graph = annotate(gm)
    graph.model = str(getattr(model, "value", model))
    padder = HeadPadder(gm, graph)
    request = request.variant(values=symbol_values(gm), pad_heads=padder)
    started = time.perf_counter()
    try:
        plan, cached = plan_for(graph, request, opts, saved)
    except InfeasiblePlanError as e:
        raise _with_rewrites(e, records) from None
    plan_s = time.perf_counter() - started
    if runs_as_two_forwards(plan):  # the planner's decision: the caller runs the CFG pair as two forwards
        raise CfgSequential.of(plan)
    unpadded = graph
    gm, graph = padder.graphs(plan.head_padding)  # the graph the plan names: heads padded where it chose
    if saved is not None:
        _check_rewrites(plan, opts, rewrites)
    elif records:
        plan = plan.with_(rewrites=records)
    plan = plan.with_(target=request.target.name)
    if saved is not None and plan.target != saved.target:
        _check_retarget(graph, plan, saved.target, request, opts.plan)
    _refuse_ring_attention(plan, request)
    plan.check(graph, unpadded=unpadded)
    if not request.target.modelled_by_rules:  # its own prediction of the collectives (planner.pins)
        from planner.pins import target_collectives

        plan = plan.with_(target_collectives=target_collectives(graph, plan, request))
    if opts.dump_dir is not None:
        _dump(opts.dump_dir, graph, plan)

    def lower(plan: Plan):
        from planner.pins import pin_layouts

        target = request.target
        if target.pinned:  # the partitioner may choose nothing the plan decided (planner.pins)
            plan = pin_layouts(graph, plan, request)
        started = time.perf_counter()
        xmesh = mesh_for_plan(mesh_obj, plan.mesh)  # CFG split: 3-D view
        program = ShardedProgram(
            gm, graph, plan, xmesh, fold=opts.fold_parameters, kind=model, target=target, fused=opts.fused_ops
        )
        program.compile_times = CompileTimes(plan_s, time.perf_counter() - started, cached)
        if opts.dump_dir is not None and target.exports_shardy:
            from wancompile.tt.export import ShardyExport

            program.stablehlo_sink = ShardyExport(opts.dump_dir, program_name(plan), plan, xmesh, specs=program.specs)
        remember(program)
        log.info("wan_autoshard: %s", plan.summary().replace("\n", "; "))
        return _Verifying(program) if opts.verify else program

    program = lower(plan)
    symbols = _symbol_positions(gm)
    if not symbols:
        return program

    def replan(values: dict[str, int]):
        if opts.plan is not None:
            raise PlanError(
                f"the saved plan {opts.plan} assumes {', '.join(map(str, plan.guards))}, which sizes {values} "
                "break; plan without the `plan` option (or save one per resolution)"
            )
        new, _ = solved_plan(unpadded, request.variant(values=values), opts.cache_dir)
        if new.head_padding != plan.head_padding:
            raise PlanError(
                f"re-planning for sizes {values} changed the padded attention heads ({plan.head_padding or 'none'} -> "
                f"{new.head_padding or 'none'}), which this compiled graph cannot follow; compile once per resolution "
                "(without dynamic=True)"
            )
        _refuse_ring_attention(new, request)
        return lower(new)

    return _GuardedProgram(program, plan, symbols, replan, symbol_values(gm))


def _refuse_ring_attention(plan: Plan, request: PlanRequest) -> None:
    """Raise PlanError for a plan that runs ring attention (`Plan.ring_attention`): no lowering here writes
    one, and its constraints alone would make the partitioner gather K/V, a program without the ring."""
    rings = plan.ring_attention
    if not rings:
        return
    target = request.target
    why = target.no_ring_attention or "wancompile's lowering does not write ring attention yet"
    raise PlanError(
        "the plan runs ring attention at "
        + ", ".join(f"{d.scope} ({d.strategy})" for d in rings)
        + f", which cannot be lowered for target {plan.target!r}: {why}. Re-plan for this target (its plans "
        f"choose ring attention only where it lowers one: `wancompile plan --target {plan.target}`), or drop the "
        "`plan` option"
    )


def program_name(plan: Plan) -> str:
    """The file stem of a program's dumps for tt-mlir (``wan-dit``, ``wan-dit.cfg2``, ``wan-vae``; a model
    name's path separators become ``-``)."""
    return re.sub(r"[^\w.+-]", "-", plan.model) + (".cfg2" if plan.cfg_parallel is not None else "")


def rewrite_graph(
    gm: fx.GraphModule, request: PlanRequest, rewrites: tuple[str, ...], why: Optional[Mapping[str, str]] = None
) -> tuple[fx.GraphModule, tuple[RewriteRecord, ...]]:
    """Run the `rewrites` (pass names) on a copy of dynamo's graph, as the backend does before
    planning; sp_pad pads tokens to a multiple of the SP degree (the first axis of the request's mesh)
    times the hardware's tile and keeps attention off the padded keys as the target wants (`Target.padded_keys`);
    rope writes the form the target fuses (`Target.rotary_kernel`). Returns the graph
    and the records a plan made for it carries, each with its reason from `why` (`Options.rewrites_for`)."""
    if not rewrites:
        return gm, ()
    from rewrites import RewriteContext, apply_rewrites

    mesh = request.mesh
    sp = mesh.shape[0] if len(mesh.shape) >= 2 else 1
    gm = fx.GraphModule(gm, gm.graph.__deepcopy__())
    context = RewriteContext(
        sp_multiple=sp * request.hw.tile,
        rotary_kernel=request.target.rotary_kernel,
        padded_keys=request.target.padded_keys,
    )
    gm, reports = apply_rewrites(gm, rewrites, context)
    gm.recompile()
    why = why or {}
    for r in reports:  # a pass that left a candidate unchanged says so (and the plan records it): a warning where the
        # user asked for the pass, else (a target's default: nothing for them to act on) at info
        level = logging.WARNING if why.get(r.name, "").startswith("asked") or not why else logging.INFO
        for reason in r.skipped:
            log.log(level, "wan_autoshard rewrite %s left a candidate unchanged: %s", r.name, reason)
    return gm, tuple(
        RewriteRecord(r.name, r.count, tuple(r.where), tuple(r.skipped), why.get(r.name, "")) for r in reports
    )


def _with_rewrites(e: InfeasiblePlanError, records: tuple[RewriteRecord, ...]) -> InfeasiblePlanError:
    """`e` naming the rewrites that ran before planning, first those that rewrote ops of its macro."""
    if not records:
        return e
    touched = [r.name for r in records if any(f".{e.group}." in f".{w}." for w in r.where)]
    ran = [r.name for r in records]
    return InfeasiblePlanError(
        f"{e} (rewrites run before planning: {ran}"
        + (
            f"; {touched} rewrote ops of {e.group}: try without them, e.g. rewrites={[n for n in ran if n not in touched]!r}"
            if touched
            else ""
        )
        + ")",
        group=e.group,
        excluded=e.excluded,
        rewrites=tuple(touched or ran),
    )


def _check_rewrites(plan: Plan, opts: Options, rewrites: tuple[str, ...]) -> None:
    made_with = tuple(r.name for r in plan.rewrites)
    if set(made_with) != set(rewrites):
        raise PlanError(
            f"plan {opts.plan} was made with rewrites {list(made_with) or 'none'} but this compile runs "
            f"{list(rewrites) or 'none'}; the plan's locations name ops of the rewritten graph, so pass "
            f"rewrites={list(made_with) or 'none'!r} (or leave the option out: a saved plan's rewrites are the default)"
        )


def _start_runtime(opts: Options) -> None:
    """SPMD on (or a clear refusal: `runtime.require_spmd`); before the runtime starts, virtual CPU
    devices for the mesh where none are configured, and HLO dumps under dump_dir."""
    if not runtime.runtime_started():
        runtime.ensure_cpu_devices(opts.mesh.size if opts.mesh is not None else None, log)
        if opts.dump_dir and not runtime.current_dump_dir():
            runtime.configure(dump_dir=opts.dump_dir / "hlo")
        if opts.cache_dir is not None:
            from wancompile.cache import start_xla_cache

            start_xla_cache(opts.cache_dir)
    runtime.require_spmd()


def _check_retarget(graph: Graph, plan: Plan, saved: str, request: PlanRequest, path: Path) -> None:
    """A saved plan compiled for another target than it was made for: fine unless it splits convs
    spatially and the two targets get their halos differently (its collectives would not be the program's)."""
    from planner.vae_plan import halo_convs

    if request.target.halos_as(saved):
        return
    convs = halo_convs(graph, plan)
    if convs:
        raise PlanError(
            f"plan {path} was made for target {saved!r} and splits {len(convs)} convolution(s) spatially (first: "
            f"{convs[0]}); target {plan.target!r} gets their halos another way, so its collectives would not be the "
            f"program's. Re-plan for it (wancompile plan --target {plan.target} ...), or compile with target={saved!r}"
        )


def _dump(dump_dir, graph: Graph, plan: Plan) -> None:
    from wancompile.report import write_dumps

    # plan.json (+ per-op trace), plan.md, plan.html, graph.json, summary.txt: one set, written atomically
    write_dumps(
        plan,
        dump_dir,
        graph=graph,
        extra={"graph.json": graph.to_json(), "summary.txt": graph.summary() + "\n" + plan.summary() + "\n"},
    )


def _symbol_positions(gm: fx.GraphModule) -> dict[str, int]:
    """Argument position of each symbolic size of a ``dynamic=True`` graph."""
    out = {}
    for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder"):
        v = n.meta.get("example_value")
        if isinstance(v, torch.SymInt):
            out[str(v.node.expr)] = i
    return out
