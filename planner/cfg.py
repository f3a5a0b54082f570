"""CFG parallel, costed: run a denoising step's classifier-free-guidance pair, given as one batch-2 DiT
forward (cond and uncond concatenated on the batch), either on the whole mesh or split over it.

Options for a graph of batch B = 2·k on a mesh (a, b) with axes ("batch", "model"):

- ``off``: the batch-2 graph planned on the whole mesh (`planner.autoplan.plan_graph`) — about two
  sequential forwards' work, each collective carrying both branches.
- ``split(AXIS)`` for a mesh axis of even size n (which axes: below): the axis is halved into a major ``cfg`` axis
  of 2 and a minor axis of n/2 under the old name — device ids stay row-major, so the split mesh is
  a refinement of the user's: (a, b) -> (2, a/2, b) with axes ("cfg", "batch", "model") for AXIS =
  "batch", (a, 2, b/2) with ("batch", "cfg", "model") for AXIS = "model". Every batch-carrying value
  (the model inputs whose dim 0 is the batch, and whatever the op rules carry that split to) gets
  ``cfg`` major on dim 0; no macro strategy may use ``cfg``; parameters are replicated over it. So
  each half of the mesh runs one branch's plan on its (a/2, b) submesh: the same ILP, priced by the
  same op rules on per-device shapes of batch k, weights held over half as many devices (memory).

- ``sequential``: the pair as two batch-1 forwards on the whole mesh, one after the other (what diffusers'
  WanPipeline runs without CFG batching, and tt-metal's scheme): the batch-1 plan's step twice, its memory.
  Priced on the batch-2 graph as the batch-1 plan (`sequential_mesh`): a leading ``cfg`` axis of 2 that is
  time, not devices — every batch-carrying value split on it, parameters replicated over it, no strategy
  or collective on it — so each device holds one branch's batch-1 shapes on the user's mesh; step time x2.
  The caller must run it: a batch-2 forward is one program, so this option is chosen only where the caller
  says it can split the pair (``cfg_pair_splittable=True``: compile_pipeline's CFG wrapper under ``auto``, which then
  runs cond and uncond as two forwards); `plan_dit` then returns a plan that decides it (`runs_as_two_forwards`).
  Elsewhere it is priced and recorded, with the reason it was not taken.

Which axis is halved by default: the major-most axis of size > 1 (2x4 and 8x4: ``batch``; 1x8:
``model``), so ``cfg`` is the major-most split of the device grid. Only that form is checked against
the compiled HLO on every mesh tried (tests/test_cfg_fidelity.py); with ``cfg`` between two split axes
(8x4 halved on ``model`` -> 8x2x2 ``(batch, cfg, model)``, a head-TP + SP + FSDP plan per branch) GSPMD
all-gathered 10 FSDP weights over (batch, model) instead of batch only — numerics exact, collectives
not the plan's — so other axes are tried only when asked (``cfg_axes``), their cost then optimistic.

The step cost of each option is its plan's predicted time (compute + comm, one batch-2 forward =
one step); the cheapest feasible option wins under ``auto`` (ties: ``off``, then the splits, then
``sequential``), so under the model ``auto`` is never slower than two batch-1 forwards where the caller can
run them. ``on`` takes the best split, ``off`` the unsplit plan; either way every option is priced and recorded (`CfgParallel` in
the plan: name, mesh, ms per step, memory per device, or why no plan exists) with a `Decision`
``cfg-parallel`` that the dumps and ``wancompile explain`` show.

Topology of a split axis (`split_profile`): the minor half of a ring or line axis is a contiguous
segment of it — a line (no wraparound) with the parent's links; a switch stays a switch; the
``cfg`` axis (devices n/2 apart) is priced as a line of the parent's links (a correct plan puts no
collective on it: the branches never exchange data inside a forward).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional, Union

from planner.graph import Graph
from planner.hardware import HardwareProfile
from planner.mesh import MeshSpec
from planner.plan import CfgOption, CfgParallel, Decision, Exclusion, MemoryBudgetError, OptionCost, Plan, PlanError
from planner.request import PlanRequest
from planner.request import normalize_mode as normalize_mode  # re-exported
from planner.structure import find_structure

CFG_AXIS = "cfg"
MODES = ("auto", "on", "off")
SEQUENTIAL = "sequential"
NOT_RUN_BY_CALLER = (
    "two batch-1 forwards are the caller's to run (a batch-2 forward is one program): offered where the caller "
    "can split the pair (compile_pipeline(cfg_parallel='auto'), plan_dit(..., cfg_pair_splittable=True))"
)


class CfgInfeasible(PlanError):
    """No allowed CFG option has a plan; ``options`` holds every option as priced (with its reason)."""

    def __init__(self, message: str, options: tuple[CfgOption, ...]) -> None:
        super().__init__(message)
        self.options = options


class CfgSequential(PlanError):
    """The backend's answer to a caller that can split the CFG pair (``cfg_pair_splittable``) when the plan for
    its batch-2 forward decides ``sequential`` (`runs_as_two_forwards`): a batch-2 program cannot run as two
    forwards, so the caller runs cond and uncond as two (compile_pipeline's CFG wrapper catches it by type).
    ``plan`` is the plan with that decision, ``record`` its `CfgParallel`; ``options`` as `CfgInfeasible`."""

    def __init__(self, message: str, plan: Plan) -> None:
        super().__init__(message)
        self.plan = plan
        self.record = plan.cfg_parallel
        self.options = self.record.options

    @classmethod
    def of(cls, plan: Plan) -> "CfgSequential":
        """The error for `plan`, which decides ``sequential``, saying why (its record's step times)."""
        c = plan.cfg_parallel
        best = c.option(c.chosen)
        rest = ", ".join(f"{o.name} {o.step_seconds * 1e3:.6g} ms" for o in c.options if o.feasible and o is not best)
        return cls(
            f"cfg_parallel=auto: two batch-1 forwards on mesh {c.base_mesh} are the cheapest way to run the CFG pair "
            f"({best.step_seconds * 1e3:.6g} ms per step; {rest or 'no batch-2 plan fits'}): run cond and uncond as "
            "two forwards, or pass cfg_parallel='off' / 'on' to batch the pair anyway",
            plan,
        )


def runs_as_two_forwards(plan: Plan) -> bool:
    """Whether `plan` decides ``sequential``: its caller runs the CFG pair as two batch-1 forwards (the plan is the
    batch-1 forward's, priced on `sequential_mesh`); no batch-2 program is compiled for it."""
    return plan.cfg_parallel is not None and plan.cfg_parallel.chosen == SEQUENTIAL


def batch_size(graph: Graph):
    """The batch of a DiT graph: dim 0 of the token stream entering the block stack."""
    return graph[find_structure(graph).entry].out.shape[0]


def split_mesh(mesh: MeshSpec, axis: str) -> MeshSpec:
    """`mesh` with `axis` (of even size n) halved: a major ``cfg`` axis of 2, then `axis` of n/2."""
    i = mesh.axis_index(axis)
    n = mesh.shape[i]
    if n % 2:
        raise PlanError(f"cannot split mesh axis {axis!r} of size {n} of mesh {mesh} in two for CFG parallel")
    if CFG_AXIS in mesh.axis_names:
        raise PlanError(f"mesh {mesh} {mesh.axis_names} already has an axis named {CFG_AXIS!r}")
    return MeshSpec(
        mesh.shape[:i] + (2, n // 2) + mesh.shape[i + 1 :],
        mesh.axis_names[:i] + (CFG_AXIS, axis) + mesh.axis_names[i + 1 :],
    )


def split_profile(hw: HardwareProfile, mesh: MeshSpec, axis: str) -> HardwareProfile:
    """The profile's links for `split_mesh(mesh, axis)` (module docstring: segments are lines)."""
    i = mesh.axis_index(axis)
    links = [hw.axis(j, n) for j, n in enumerate(mesh.shape)]
    parent = links[i]
    segment = (
        parent
        if parent.topology == "switch"
        else replace(parent, topology="line", note=f"contiguous half of {parent.topology} axis {axis!r}: a line")
    )
    cfg = replace(
        parent,
        topology="line" if parent.topology != "switch" else "switch",
        note=f"the two halves of axis {axis!r} (no collective expected on it)",
    )
    split = split_mesh(mesh, axis)
    return replace(hw, mesh_shape=split.shape, axes=tuple(links[:i] + [cfg, segment] + links[i + 1 :]))


def sequential_mesh(mesh: MeshSpec) -> MeshSpec:
    """`mesh` with a leading ``cfg`` axis of 2 standing for time: the two forwards of ``sequential``."""
    if CFG_AXIS in mesh.axis_names:
        raise PlanError(f"mesh {mesh} {mesh.axis_names} already has an axis named {CFG_AXIS!r}")
    return MeshSpec((2,) + mesh.shape, (CFG_AXIS,) + mesh.axis_names)


def sequential_profile(hw: HardwareProfile, mesh: MeshSpec) -> HardwareProfile:
    """The profile's links for `sequential_mesh(mesh)`: the user's axes as they are, a ``cfg`` axis first
    (no collective runs on it: the two forwards exchange nothing)."""
    links = [hw.axis(j, n) for j, n in enumerate(mesh.shape)]
    cfg = replace(links[0], note="the two forwards in sequence (no collective expected on it)")
    return replace(hw, mesh_shape=sequential_mesh(mesh).shape, axes=tuple([cfg] + links))


def plan_profile(plan: Plan, hw: HardwareProfile) -> HardwareProfile:
    """The profile a plan was priced with: `hw` itself, or its split form for a CFG-split plan."""
    c = plan.cfg_parallel
    if c is None or not c.split:
        return hw
    return split_profile(hw, c.base_mesh, c.option(c.chosen).split_axis)


def plan_dit(graph: Graph, mesh: MeshSpec, hardware: Union[str, HardwareProfile, None] = None, **fields: Any) -> Plan:
    """Plan a DiT graph with the CFG-parallel choice (module docstring): the request
    `PlanRequest.make(mesh, hardware, **fields)` (`planner.request`) planned by `plan_request`."""
    return plan_request(graph, PlanRequest.make(mesh, hardware, **fields))


def plan_request(graph: Graph, request: PlanRequest) -> Plan:
    """The DiT plan for `graph` under `request`, with the CFG-parallel choice (module docstring).
    ``request.cfg_axes``: the mesh axes that may be halved (default: the major-most axis of size > 1, see the
    module docstring); among several, the cost picks. A split mesh the target cannot compile
    (`planner.targets.Target.max_mesh_axes`) is an infeasible option, with its reason.
    ``request.cfg_pair_splittable``: the caller can run the pair as two batch-1 forwards, so ``auto`` may
    choose that: the plan returned then decides ``sequential`` (`runs_as_two_forwards`: its record's ``chosen``;
    the batch-1 plan on `sequential_mesh`); without it the option is priced and recorded, not chosen.

    A graph whose batch is not even has no CFG pair to split: ``auto``/``off`` plan it as usual (no
    record), ``on`` raises. ``on`` on a mesh with no even axis, or where no split plan fits memory,
    raises too, naming why.
    """
    from planner.autoplan import plan_request as plan_one

    mode, mesh, hw, cfg_axes = request.cfg_parallel, request.mesh, request.hw, request.cfg_axes
    target = request.target
    batch = batch_size(graph)
    if not isinstance(batch, int) or batch % 2:
        if mode == "on":
            raise PlanError(
                f"cfg_parallel=on needs the CFG pair as one forward of even batch (cond and uncond concatenated); "
                f"this graph's batch is {batch}. Call the transformer with batch 2, or use cfg_parallel=auto/off"
            )
        return plan_one(graph, request)
    for a in cfg_axes or ():
        mesh.axis_index(a)
    if cfg_axes is None:
        cfg_axes = tuple(a for a, n in zip(mesh.axis_names, mesh.shape) if n > 1)[:1]
    axes = [a for a, n in zip(mesh.axis_names, mesh.shape) if n % 2 == 0 and a in cfg_axes]
    if mode == "on" and not axes:
        raise PlanError(
            f"cfg_parallel=on: mesh {mesh} {mesh.axis_names} has no axis to split in two among "
            f"{list(cfg_axes) or 'its axes of size > 1'} (the major-most axis of size > 1 must be even; "
            "pass cfg_axes to try others); use another mesh, or cfg_parallel=auto/off"
        )
    plans: dict[str, Plan] = {}
    options = [_option("off", mesh, None, lambda: plan_one(graph, request), plans)]
    limit = target.max_mesh_axes
    for axis in axes:
        split = split_mesh(mesh, axis)
        if limit is not None and sum(n > 1 for n in split.shape) > limit:
            why = (
                f'target {target.name} compiles meshes of at most {limit} axes of size > 1 (tt-mlir: "Pass expects a '
                f'0D, 1D, or 2D mesh"; sub-axis shardings are refused too); the split mesh {split} has more'
            )
            options.append(CfgOption(f"split({axis})", split, axis, reason=why))
            continue
        on_split = request.variant(mesh=split, hw=split_profile(hw, mesh, axis), batch_axes=(CFG_AXIS,))
        options.append(_option(f"split({axis})", split, axis, lambda r=on_split: plan_one(graph, r), plans))
    options.append(_sequential(graph, request, plans))
    domain = [o for o in options if _in_mode(o, mode)]
    allowed = [o for o in domain if o.feasible]
    if not allowed:
        why = "; ".join(f"{o.name}: {o.reason}" for o in domain)
        raise CfgInfeasible(f"cfg_parallel={mode}: no plan on mesh {mesh}: " + (why or "no option"), tuple(options))
    best = min(allowed, key=lambda o: (o.step_seconds, o.name == SEQUENTIAL, o.split_axis is not None))
    record = CfgParallel(mode, best.name, mesh, batch, tuple(options), CFG_AXIS)
    plan = plans[best.name]
    return plan.with_(
        cfg_parallel=record,
        decisions=(_decision(record, best),) + plan.decisions,
        notes=plan.notes + (_note(record, best),),
        target=target.name,
    )


def _in_mode(o: CfgOption, mode: str) -> bool:
    """Whether option `o` is one `mode` may take: ``auto`` any, ``on`` the splits, ``off`` the unsplit plan."""
    if mode == "auto":
        return True
    return o.split_axis is not None if mode == "on" else o.name == "off"


def _sequential(graph: Graph, request: PlanRequest, plans: dict) -> CfgOption:
    """The ``sequential`` option: the batch-1 plan on the whole mesh (`sequential_mesh`), its step twice."""
    from planner.autoplan import plan_request as plan_one

    mesh, seq = request.mesh, sequential_mesh(request.mesh)
    priced = request.variant(mesh=seq, hw=sequential_profile(request.hw, mesh), batch_axes=(CFG_AXIS,))
    one = _option(SEQUENTIAL, seq, None, lambda: plan_one(graph, priced), plans)
    if not one.feasible:
        return replace(one, mesh=mesh)
    return replace(
        one,
        mesh=mesh,
        step_seconds=2 * one.step_seconds,
        compute_seconds=2 * one.compute_seconds,
        comm_seconds=2 * one.comm_seconds,
        reason="" if request.cfg_pair_splittable else NOT_RUN_BY_CALLER,
    )


def _option(name: str, mesh: MeshSpec, axis: Optional[str], make, plans: dict) -> CfgOption:
    try:
        plan = make()
    except PlanError as e:
        need = int(e.need_gb * 1e9) if isinstance(e, MemoryBudgetError) else None
        return CfgOption(name, mesh, axis, reason=str(e), memory_needed_bytes=need)
    plans[name] = plan
    p = plan.predicted
    return CfgOption(name, mesh, axis, p.step_seconds, p.compute_seconds, p.comm_seconds, p.memory_bytes_per_device)


def _decision(record: CfgParallel, best: CfgOption) -> Decision:
    """The CFG choice as a typed Decision (per step; every option's whole-plan step time on its own,
    the infeasible ones as exclusions with their reason). Mode and meshes are in ``record``."""
    rest = sorted((o for o in record.options if o.feasible and o.name != best.name), key=lambda o: o.step_seconds)
    runner = rest[0] if rest else None
    return Decision(
        macro="cfg-parallel",
        strategy=best.name,
        cost=best.step_seconds,
        rejected=runner.name if runner else "",
        rejected_cost=runner.step_seconds if runner else None,
        options=tuple(
            OptionCost(o.name, o.step_seconds)
            for o in sorted((o for o in record.options if o.feasible), key=lambda o: (o.step_seconds, o.name))
        ),
        excluded=tuple(Exclusion(o.name, o.reason) for o in record.options if not o.feasible),
        unit="step",
    )


def _note(record: CfgParallel, best: CfgOption) -> str:
    if best.name == SEQUENTIAL:
        return (
            f"CFG sequential: the batch-{record.batch} pair runs as two batch-{record.batch // 2} forwards on the "
            f"whole mesh {record.base_mesh}, one after the other (the caller runs them)"
        )
    if best.split_axis is None:
        return f"CFG parallel off: the batch-{record.batch} forward runs on the whole mesh {record.base_mesh}"
    return (
        f"CFG parallel: mesh {record.base_mesh} split on {best.split_axis!r} into {best.mesh} "
        f"{best.mesh.axis_names}; batch {record.batch} split over {record.axis!r} (one branch per half), "
        "parameters replicated over it"
    )
