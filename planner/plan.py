"""`Plan`: what to shard and how, saved as a versioned ``plan.json``.

A plan is data the lowering applies and a person can read:

- ``params``: fully qualified parameter name -> partition spec (one entry per tensor dim: a mesh
  axis, a tuple of axes, or null). Every parameter of the model appears, replicated ones too, so a
  plan for a different model is caught by name.
- ``activations``: sharding constraints at `Location`s (module path + op + occurrence), which survive
  recompiles, unlike dynamo's node names.
- ``collectives``: what the plan predicts the partitioned program will hold.
- ``predicted``, ``solver``, ``rewrites``: the planner's account of itself;
- ``decisions``: one typed `Decision` per choice the solver made (a block macro shared by all
  blocks, a root macro, a group of identical VAE macros, the CFG split): the options it priced with
  their costs, the ones it excluded with the reason, the best rejected option with its whole-plan
  cost and where the difference comes from. Readers use the fields; no field is prose to re-parse.

JSON only (no pickles), with ``schema_version``; `load_plan` rejects anything it does not
understand with a message that says what is wrong (an older schema: re-plan with `wancompile plan`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping, Optional

from planner.collective import Collective
from planner.graph import TUPLE_OPS, Graph, Location, Node
from planner.mesh import MeshError, MeshSpec, PartitionSpec, normalize_spec
from planner.placements import Guard, Layout, check_spec

# 2: typed decisions (options, exclusions, cost split, block-generic scope as data) replaced the
# prose ``note``; collectives may carry ``reason``/``seconds``.
SCHEMA_VERSION = 2

__all__ = ["Collective"]  # re-exported: the plan's collectives are `planner.collective.Collective`


class PlanError(ValueError):
    """A plan that cannot be applied to this model or mesh; the message names the fix."""


class MemoryBudgetError(PlanError):
    """No plan fits the per-device memory budget. ``need_gb`` is a budget the planner then accepts
    on this mesh (found by solving, not estimated); ``meshes`` names larger system meshes that
    plan within the given budget (may be empty)."""

    def __init__(self, message: str, *, budget_gb: float, need_gb: float, meshes: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.budget_gb, self.need_gb, self.meshes = budget_gb, need_gb, meshes


class InfeasiblePlanError(PlanError):
    """The solver proved that no plan exists for a reason other than the memory budget (that one is
    `MemoryBudgetError`): ``group`` is the macro left without any option, ``excluded`` every option
    it was offered with what ruled it out (a shape that does not divide, an ``only=`` restriction, a
    preset, an op a rewrite produced that no strategy places); ``rewrites``: the graph rewrites the
    backend ran first (the message names the one that touched the macro)."""

    def __init__(
        self, message: str, *, group: str, excluded: tuple[tuple[str, str], ...] = (), rewrites: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message)
        self.group, self.excluded, self.rewrites = group, excluded, rewrites


class SolverTimeout(PlanError):
    """The solver stopped at its time limit before finding any plan; nothing says none exists.
    Raise ``time_limit_s`` (``wancompile plan --time-limit``)."""

    def __init__(self, message: str, *, time_limit_s: float) -> None:
        super().__init__(message)
        self.time_limit_s = time_limit_s


@dataclass(frozen=True)
class ActivationConstraint:
    """Constrain output ``output`` of the op at ``location`` to ``spec`` (in place: every reader of
    the value sees the constrained layout; several on one op apply in order). With ``input`` set,
    the op at ``location`` reads its ``input``-th input (graph order) through a copy constrained to
    ``spec`` instead: the value's other readers keep their layout (a stream value read by two
    macros with different layouts); readers of one value with the same spec share one copy."""

    location: Location
    spec: PartitionSpec
    shape: tuple[Any, ...] = ()
    output: int = 0
    reason: str = ""
    input: Optional[int] = None

    @classmethod
    def whole(cls, node: Node, reason: str) -> "ActivationConstraint":
        """`node`'s output kept whole (replicated on every dim)."""
        return cls(node.location, (None,) * len(node.out.shape), node.out.shape, reason=reason)

    def to_json(self) -> dict:
        out = {
            "node": str(self.location),
            "module": self.location.module,
            "output": self.output,
            "shape": [d if isinstance(d, int) else str(d) for d in self.shape],
            "spec": spec_to_json(self.spec),
            "reason": self.reason,
        }
        if self.input is not None:
            out["input"] = self.input
        return out

    @classmethod
    def from_json(cls, d: Mapping) -> "ActivationConstraint":
        return cls(
            Location.parse(d["node"]),
            _spec_from_json(d["spec"]),
            tuple(d.get("shape", ())),
            int(d.get("output", 0)),
            d.get("reason", ""),
            int(d["input"]) if d.get("input") is not None else None,
        )


class _Fields:
    """A record written to plan.json field for field."""

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Predicted(_Fields):
    step_seconds: float = 0.0
    compute_seconds: float = 0.0
    comm_seconds: float = 0.0
    memory_bytes_per_device: int = 0


@dataclass(frozen=True)
class SolverInfo(_Fields):
    status: str = "none"  # OPTIMAL | FEASIBLE | hand-written | ...
    objective: float = 0.0
    seconds: float = 0.0
    variables: int = 0
    constraints: int = 0
    gap: float = 0.0


@dataclass(frozen=True)
class OptionCost:
    """One option the solver could choose for a decision, priced on its own: ``seconds_own`` is what
    the option itself costs per forward (per decode for the VAE, per step for CFG): the group's count
    times its per-call cost plus any once-per-forward cost, without the stream edges or the other
    groups. Memory as the ILP's constraint counts it: the group's weights per device (all its
    repetitions and weight sets) and its activation estimate (3 × the largest live set)."""

    name: str
    seconds_own: float
    param_bytes_per_device: int = 0
    activation_bytes: int = 0
    stream: str = ""  # layout of the stream the option reads/writes (planner.placements notation); "" if none

    def to_json(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, d: Mapping) -> "OptionCost":
        return cls(
            str(d["name"]),
            float(d["seconds_own"]),
            int(d.get("param_bytes_per_device", 0)),
            int(d.get("activation_bytes", 0)),
            str(d.get("stream", "")),
        )


def _maybe(read, value):
    """``read(value)``, or None for a JSON null."""
    return None if value is None else read(value)


class _Strings:
    """JSON for a frozen record whose fields are all strings."""

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, d: Mapping):
        return cls(**{f.name: str(d[f.name]) for f in fields(cls)})


@dataclass(frozen=True)
class Exclusion(_Strings):
    """An option (or a family of options, e.g. ``SP over batchxmodel (8)``) the planner did not offer
    the solver, and why (a split that does not divide, a restriction the caller gave)."""

    option: str
    reason: str


@dataclass(frozen=True)
class Move(_Strings):
    """Another decision whose choice differs in an alternative plan."""

    macro: str
    option: str


@dataclass(frozen=True)
class CostSplit:
    """Where an alternative plan's whole cost differs from the chosen plan's (seconds, alternative
    minus chosen): this decision's own option, the stream-layout edges, the other groups (whose
    changed choices are ``moved``). ``for_memory``: the others moved to fit the memory budget
    (the alternative option with the others as chosen breaks it)."""

    this_macro: float
    edges: float
    other_macros: float
    moved: tuple[Move, ...] = ()
    for_memory: bool = False

    @property
    def total(self) -> float:
        return self.this_macro + self.edges + self.other_macros

    def to_json(self) -> dict:
        return {
            "this_macro": self.this_macro,
            "edges": self.edges,
            "other_macros": self.other_macros,
            "moved": [m.to_json() for m in self.moved],
            "for_memory": self.for_memory,
        }

    @classmethod
    def from_json(cls, d: Mapping) -> "CostSplit":
        return cls(
            float(d["this_macro"]),
            float(d["edges"]),
            float(d["other_macros"]),
            tuple(Move.from_json(m) for m in d.get("moved", [])),
            bool(d.get("for_memory", False)),
        )


@dataclass(frozen=True)
class Alternative:
    """An option that is cheaper on its own than the chosen one but lost: the best whole plan that
    uses it (``plan_seconds``; None when no plan with it fits the memory budget) and why."""

    option: str
    seconds_own: float
    plan_seconds: Optional[float] = None
    split: Optional[CostSplit] = None

    def to_json(self) -> dict:
        return {
            "option": self.option,
            "seconds_own": self.seconds_own,
            "plan_seconds": self.plan_seconds,
            "split": self.split.to_json() if self.split is not None else None,
        }

    @classmethod
    def from_json(cls, d: Mapping) -> "Alternative":
        ps, split = _maybe(float, d.get("plan_seconds")), _maybe(CostSplit.from_json, d.get("split"))
        return cls(str(d["option"]), float(d["seconds_own"]), ps, split)


@dataclass(frozen=True)
class HeadPadding:
    """An attention computed with ``padded`` heads of which ``heads`` are real (the rest zero:
    rewrites/pad_heads.py), for every attention at ``module`` (block-generic: ``blocks.*.attn1``)."""

    module: str
    heads: int
    padded: int

    def to_json(self) -> dict:
        return {"module": self.module, "heads": self.heads, "padded": self.padded}

    @classmethod
    def from_json(cls, d: Mapping) -> "HeadPadding":
        return cls(str(d["module"]), int(d["heads"]), int(d["padded"]))


@dataclass(frozen=True)
class RingAttention:
    """Ring attention for a self-attention with SP (`planner.ring`), priced beside the chosen option:
    ``option`` is the ring option with the chosen option's axes (σ, t, FSDP, stream) where the chosen
    option splits the tokens, else the cheapest ring option on its own; ``seconds_own`` its price and
    ``chosen_seconds_own`` the chosen option's (both as `OptionCost.seconds_own`: per unit, all
    repetitions). ``offered``: the target lowers ring attention, so the solver could choose it;
    otherwise ``why_not`` says why not (``no ring SDPA lowering in tt-mlir (tt-mlir #7598)``).
    ``chosen``: the plan runs it. Per call: ``steps`` ring steps (devices on σ), ``step_compute_s``
    one step's attention compute, ``step_transfer_s`` one step's K and V chunks to the neighbour,
    ``gather_s`` the K/V all-gathers the ring replaces."""

    option: str
    seconds_own: float
    chosen_seconds_own: float
    offered: bool
    why_not: str = ""
    chosen: bool = False
    steps: int = 0
    step_compute_s: float = 0.0
    step_transfer_s: float = 0.0
    gather_s: float = 0.0

    @property
    def saves(self) -> float:
        """Seconds per unit the ring option would save over the chosen one on its own (negative: it costs more)."""
        return self.chosen_seconds_own - self.seconds_own

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, d: Mapping) -> "RingAttention":
        return cls(
            str(d["option"]),
            float(d["seconds_own"]),
            float(d["chosen_seconds_own"]),
            bool(d["offered"]),
            str(d.get("why_not", "")),
            bool(d.get("chosen", False)),
            int(d.get("steps", 0)),
            float(d.get("step_compute_s", 0.0)),
            float(d.get("step_transfer_s", 0.0)),
            float(d.get("gather_s", 0.0)),
        )


@dataclass(frozen=True)
class Decision:
    """What was chosen for one ILP group and what lost, as data.

    The group: ``macro`` (block-relative for a block macro, ``attn1``; a module path for a root or
    VAE macro; ``cfg-parallel``), ``count`` (how many repetitions share the choice: blocks, or VAE
    macros of one shape, listed in ``members``), ``in_block`` (a DiT block macro: it applies to
    ``blocks.*.<macro>``). ``cost`` and ``rejected_cost`` are whole-plan objectives in seconds per
    ``unit`` (``forward``, ``decode``, ``step``): the best plan with the chosen option vs the best
    plan without it (re-solved with the choice forbidden), so ``rejected_cost >= cost`` whenever the
    solve is optimal; ``rejected_split`` says where that difference comes from. ``rejected`` is ""
    when there was no alternative (one legal option, or every other one breaks the memory budget:
    tell the two apart by ``options``). ``cheaper_alone``: an option cheaper on its own than the
    chosen one, and why it lost anyway."""

    macro: str
    strategy: str
    cost: float
    count: int = 1
    in_block: bool = False
    members: tuple[str, ...] = ()
    rejected: str = ""
    rejected_cost: Optional[float] = None
    rejected_split: Optional[CostSplit] = None
    cheaper_alone: Optional[Alternative] = None
    options: tuple[OptionCost, ...] = ()
    excluded: tuple[Exclusion, ...] = ()
    weight_bytes_per_device: int = 0
    fsdp: bool = False  # the chosen option shards weights for memory
    stream: str = ""  # layout of the stream the chosen option reads/writes (planner.placements notation)
    unit: str = "forward"
    state: str = ""  # which stream layout that is (DiT block macros): STATE A | STATE B | SP-Megatron
    family: str = ""  # a further block family's prefix (``vace_blocks``); ``macro`` is then its block-generic name
    pad_heads: Optional[HeadPadding] = None  # the chosen option runs the attention on zero-padded heads
    ring: Optional[RingAttention] = None  # a self-attention with SP: ring attention priced beside the choice
    # FSDP per block range: blocks [first, stop) run ``fsdp_strategy`` (the chosen strategy with its
    # weights also split over its SP axes, gathered per use), the others ``strategy``; None: all
    # blocks run ``strategy`` (which may itself be an FSDP option: ``fsdp``)
    fsdp_blocks: Optional[tuple[int, int]] = None
    fsdp_strategy: str = ""

    @property
    def scope(self) -> str:
        """The module path the choice applies to: ``blocks.*.attn1``, ``vace_blocks.*.attn1``,
        ``condition_embedder.time_embedder``."""
        if self.family:
            return self.macro
        return f"blocks.*.{self.macro}" if self.in_block else self.macro

    @property
    def node(self) -> str:
        """For readers: ``blocks.*.attn1 (x40)``."""
        return self.scope + (f" (x{self.count})" if self.count > 1 else "")

    @property
    def margin(self) -> Optional[float]:
        """Seconds per unit the choice is worth: the best plan without it minus the best plan with it."""
        return self.rejected_cost - self.cost if self.rejected and self.rejected_cost is not None else None

    def option(self, name: str) -> Optional[OptionCost]:
        return next((o for o in self.options if o.name == name), None)

    def to_json(self) -> dict:
        out = {
            "node": self.node,
            "macro": self.macro,
            "count": self.count,
            "in_block": self.in_block,
            "members": list(self.members),
            "strategy": self.strategy,
            "cost": self.cost,
            "rejected": self.rejected,
            "rejected_cost": self.rejected_cost,
            "rejected_split": self.rejected_split.to_json() if self.rejected_split is not None else None,
            "cheaper_alone": self.cheaper_alone.to_json() if self.cheaper_alone is not None else None,
            "options": [o.to_json() for o in self.options],
            "excluded": [x.to_json() for x in self.excluded],
            "weight_bytes_per_device": self.weight_bytes_per_device,
            "fsdp": self.fsdp,
            "stream": self.stream,
            "unit": self.unit,
            "state": self.state,
            **({"family": self.family} if self.family else {}),
            **(
                {"fsdp_blocks": list(self.fsdp_blocks), "fsdp_strategy": self.fsdp_strategy}
                if self.fsdp_blocks is not None
                else {}
            ),
        } | ({"pad_heads": self.pad_heads.to_json()} if self.pad_heads is not None else {})
        return out | ({"ring": self.ring.to_json()} if self.ring is not None else {})

    @classmethod
    def from_json(cls, d: Mapping) -> "Decision":
        return cls(
            macro=str(d["macro"]),
            strategy=str(d["strategy"]),
            cost=float(d["cost"]),
            count=int(d.get("count", 1)),
            in_block=bool(d.get("in_block", False)),
            members=tuple(str(m) for m in d.get("members", ())),
            rejected=str(d.get("rejected", "")),
            rejected_cost=_maybe(float, d.get("rejected_cost")),
            rejected_split=_maybe(CostSplit.from_json, d.get("rejected_split")),
            cheaper_alone=_maybe(Alternative.from_json, d.get("cheaper_alone")),
            options=tuple(OptionCost.from_json(o) for o in d.get("options", ())),
            excluded=tuple(Exclusion.from_json(x) for x in d.get("excluded", ())),
            weight_bytes_per_device=int(d.get("weight_bytes_per_device", 0)),
            fsdp=bool(d.get("fsdp", False)),
            stream=str(d.get("stream", "")),
            unit=str(d.get("unit", "forward")),
            state=str(d.get("state", "")),
            family=str(d.get("family", "")),
            pad_heads=_maybe(HeadPadding.from_json, d.get("pad_heads")),
            ring=_maybe(RingAttention.from_json, d.get("ring")),
            fsdp_blocks=_maybe(lambda r: (int(r[0]), int(r[1])), d.get("fsdp_blocks")),
            fsdp_strategy=str(d.get("fsdp_strategy", "")),
        )


@dataclass(frozen=True)
class CfgOption:
    """One way to run a denoising step's CFG pair (a batch-2 forward), as the planner priced it.

    ``name`` is ``off`` (the batch-2 plan on the whole mesh), ``split(AXIS)`` (mesh axis AXIS halved:
    each half runs one branch's plan on its submesh) or ``sequential`` (two batch-1 forwards on the whole
    mesh, the caller's to run). Times are per denoising step (cond + uncond); ``None`` where no plan
    exists (``reason`` says why: memory, divisibility). An option priced but not for the taking (``sequential``
    where the caller runs the batch-2 forward itself) keeps its times and gives its ``reason``."""

    name: str
    mesh: MeshSpec  # the mesh this option's plan is made on (3-D for a split)
    split_axis: Optional[str] = None  # axis of the user's mesh that was halved
    step_seconds: Optional[float] = None
    compute_seconds: Optional[float] = None
    comm_seconds: Optional[float] = None
    memory_bytes_per_device: Optional[int] = None
    reason: str = ""
    memory_needed_bytes: Optional[int] = None  # no plan fits memory: a lower bound on what the smallest plan needs

    @property
    def feasible(self) -> bool:
        """Priced and for the taking."""
        return self.step_seconds is not None and not self.reason

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "mesh": self.mesh.to_json(),
            "split_axis": self.split_axis,
            "step_seconds": self.step_seconds,
            "compute_seconds": self.compute_seconds,
            "comm_seconds": self.comm_seconds,
            "memory_bytes_per_device": self.memory_bytes_per_device,
            "feasible": self.feasible,
            "reason": self.reason,
            "memory_needed_bytes": self.memory_needed_bytes,
        }

    @classmethod
    def from_json(cls, d: Mapping) -> "CfgOption":
        mem = d.get("memory_bytes_per_device")
        need = d.get("memory_needed_bytes")
        return cls(
            str(d["name"]),
            MeshSpec.from_json(d["mesh"]),
            d.get("split_axis"),
            d.get("step_seconds"),
            d.get("compute_seconds"),
            d.get("comm_seconds"),
            None if mem is None else int(mem),
            str(d.get("reason", "")),
            None if need is None else int(need),
        )


@dataclass(frozen=True)
class CfgParallel:
    """The CFG-parallel decision of a batch-2 DiT plan (`planner.cfg`): what was asked (``mode``:
    auto / on / off), every option with its cost, the chosen one, and the user's mesh (the plan's own
    ``mesh`` is the split 3-D mesh when a split was chosen)."""

    mode: str
    chosen: str
    base_mesh: MeshSpec
    batch: int
    options: tuple[CfgOption, ...]
    axis: str = "cfg"

    def option(self, name: str) -> CfgOption:
        return next(o for o in self.options if o.name == name)

    @property
    def split(self) -> bool:
        return self.option(self.chosen).split_axis is not None

    def to_json(self) -> dict:
        return {
            "mode": self.mode,
            "chosen": self.chosen,
            "axis": self.axis,
            "base_mesh": self.base_mesh.to_json(),
            "batch": self.batch,
            "options": [o.to_json() for o in self.options],
        }

    @classmethod
    def from_json(cls, d: Mapping) -> "CfgParallel":
        out = cls(
            str(d["mode"]),
            str(d["chosen"]),
            MeshSpec.from_json(d["base_mesh"]),
            int(d["batch"]),
            tuple(CfgOption.from_json(o) for o in d["options"]),
            str(d.get("axis", "cfg")),
        )
        if out.chosen not in {o.name for o in out.options}:
            raise PlanError(f"plan.json cfg_parallel.chosen {out.chosen!r} is none of its options")
        return out


@dataclass(frozen=True)
class RewriteRecord:
    """A rewrite pass the plan's graph went through: ``count`` sites rewritten at module paths ``where``,
    and ``skipped``: one entry per candidate it left unchanged (where: why), so a pass that could not
    run where it was asked to is on the record, not silently dropped."""

    name: str
    count: int
    where: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()

    def to_json(self) -> dict:
        out = {"name": self.name, "count": self.count, "where": list(self.where)}
        if self.skipped:
            out["skipped"] = list(self.skipped)
        return out


@dataclass(frozen=True)
class Plan:
    model: str
    mesh: MeshSpec
    params: Mapping[str, PartitionSpec]
    activations: tuple[ActivationConstraint, ...] = ()
    hardware: str = ""
    collectives: tuple[Collective, ...] = ()
    predicted: Predicted = field(default_factory=Predicted)
    solver: SolverInfo = field(default_factory=SolverInfo)
    decisions: tuple[Decision, ...] = ()
    rewrites: tuple[RewriteRecord, ...] = ()
    notes: tuple[str, ...] = ()
    schema_version: int = SCHEMA_VERSION
    guards: tuple[Guard, ...] = ()  # divisibility the plan assumes of symbolic dims (planner.guards)
    # Weight sets resident per device that the memory budget held (2: both Wan 2.2 experts); None: the
    # plan was not budgeted (hand-written, replicated) or was saved before plans recorded it.
    weight_sets: Optional[int] = None
    cfg_parallel: Optional[CfgParallel] = None  # batch-2 DiT plans: the CFG-parallel choice (planner.cfg)
    target: str = "gspmd"  # the partitioner the plan is for (planner.targets)
    # the predicted collectives in the target's own terms where the graph was needed to tell them
    # (planner.pins.target_collectives); empty: `Target.lower` of `collectives`
    target_collectives: tuple[Collective, ...] = field(default=(), compare=False)

    def predicted_by_partitioner(self) -> dict[str, tuple[Collective, ...]]:
        """The predicted collectives as each partitioner compiles them (`planner.targets.Target.lower`):
        ``gspmd`` is ``collectives`` itself; ``tt-mlir`` counts TTNN ops (one per mesh axis,
        point-to-point transfers as collective-permutes)."""
        from planner.targets import TARGETS

        return {
            name: self.target_collectives
            if name == self.target and self.target_collectives
            else t.lower(self.collectives, self.mesh)
            for name, t in TARGETS.items()
        }

    @property
    def user_mesh(self) -> MeshSpec:
        """The mesh the plan was asked for: ``mesh`` itself, or the unsplit mesh of a CFG-split plan."""
        return self.cfg_parallel.base_mesh if self.cfg_parallel is not None else self.mesh

    # The DiT geometry the plan was made for (`model_geometry`): heads, head_dim, tokens (an int, or the
    # symbolic expression whose divisibility `guards` state). Checked by `check`; {} for other graphs.
    geometry: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def with_(self, **changes: Any) -> "Plan":
        return replace(self, **changes)

    @property
    def ring_attention(self) -> tuple[Decision, ...]:
        """The decisions whose chosen option runs ring attention (`RingAttention.chosen`)."""
        return tuple(d for d in self.decisions if d.ring is not None and d.ring.chosen)

    @property
    def head_padding(self) -> dict[str, int]:
        """{block-generic attention module: padded heads} for the attentions the plan runs padded
        (its decisions' ``pad_heads``): the graph it names is the model's with those padded."""
        return {d.pad_heads.module: d.pad_heads.padded for d in self.decisions if d.pad_heads is not None}

    # --- checking against a captured model ------------------------------------------------------

    @property
    def layers(self) -> int:
        """Blocks the plan's parameter names cover (``blocks.N.``), 0 for a graph without blocks."""
        idx = {int(m.group(1)) for p in self.params for m in [_BLOCK.match(p)] if m}
        return max(idx) + 1 if idx else 0

    def check(self, graph: Graph, *, unpadded: Optional[Graph] = None) -> None:
        """Raise PlanError unless the graph has the geometry the plan was made for, the plan names
        exactly the graph's parameters, every spec divides its tensor on this mesh, and every
        activation location exists. A plan that pads heads (`head_padding`) names ops of the padded
        graph; its geometry is the model's: pass the graph before padding as `unpadded`."""
        self._check_geometry(unpadded if unpadded is not None else graph)
        shapes = {n.param: n.out.shape for n in graph.params()}
        unknown = sorted(set(self.params) - set(shapes))
        missing = sorted(set(shapes) - set(self.params))
        if unknown or missing:
            parts = []
            if unknown:
                parts.append(f"{len(unknown)} parameter(s) the model does not have (e.g. {', '.join(unknown[:3])})")
            if missing:
                parts.append(f"no spec for {len(missing)} of the model's parameter(s) (e.g. {', '.join(missing[:3])})")
            blocks = len(graph.blocks("blocks"))  # the stack `layers` counts
            if self.layers and blocks and self.layers != blocks:
                parts.append(f"it covers {self.layers} layers, this model has {blocks}")
            raise PlanError(
                f"plan for model {self.model!r} does not fit this model ({graph.model or 'captured graph'}): "
                + "; ".join(parts)
                + ". Was it saved for another config? Re-plan (drop the `plan` option) or regenerate it for this model."
            )
        for name, spec in self.params.items():
            try:
                check_spec(spec, shapes[name], self.mesh, f"plan parameter {name}")
            except MeshError as e:
                raise PlanError(str(e)) from None
        by_loc = graph.by_location()
        for c in self.activations:
            node = by_loc.get(c.location)
            if node is None:
                raise PlanError(
                    f"plan constrains {c.location}, but the captured graph has no such op. The plan was made for a "
                    f"different model structure or rewrite set; re-plan, or keep the `rewrites` option it was made with."
                )
            if c.input is not None:
                if not 0 <= c.input < len(node.inputs) or not graph[node.inputs[c.input]].outputs:
                    raise PlanError(
                        f"plan constrains input {c.input} of {c.location}, which has no such tensor input "
                        f"({len(node.inputs)} input(s)); re-plan for this model"
                    )
                shape = graph[node.inputs[c.input]].out.shape
            elif c.output >= len(node.outputs):
                raise PlanError(
                    f"plan constrains output {c.output} of {c.location}, which has {len(node.outputs)} output(s)"
                )
            else:
                shape = node.outputs[c.output].shape
            try:
                check_spec(c.spec, shape, self.mesh, f"plan activation {c.location}")
            except MeshError as e:
                raise PlanError(str(e)) from None

    def _check_geometry(self, graph: Graph) -> None:
        here = model_geometry(graph)
        if not self.geometry or not here:
            return
        wrong = []
        for key, unit in (("heads", "attention heads"), ("head_dim", "head dim"), ("tokens", "tokens")):
            a, b = self.geometry.get(key), here.get(key)
            if a is None or b is None or not isinstance(a, int) or not isinstance(b, int):
                continue  # a symbolic token count: its guards decide (planner.guards)
            if a != b:
                wrong.append(f"{unit} {a} (this model: {b})")
        if wrong:
            hint = (
                " — another resolution or frame count: save one plan per resolution, or compile with dynamic=True"
                if len(wrong) == 1 and wrong[0].startswith("tokens")
                else ""
            )
            raise PlanError(
                f"plan for model {self.model!r} was made for "
                + ", ".join(wrong)
                + hint
                + ". Re-plan for this model (drop the `plan` option) or pass the plan made for it."
            )

    # --- summaries -------------------------------------------------------------------------------

    def constraint_layouts(self, graph: Graph) -> tuple[dict[str, Layout], dict[tuple[str, int], Layout]]:
        """The activation constraints as `planner.propagate.evaluate` takes them: node name -> layout of
        its output (the last one where a node has several), and (node name, input index) -> layout of
        the copy of that input the node reads."""
        by_loc = graph.by_location()
        forced: dict[str, Layout] = {}
        inputs: dict[tuple[str, int], Layout] = {}
        for a in self.activations:
            if a.location not in by_loc:
                continue
            if a.input is None:
                node = by_loc[a.location]
                if a.output or node.op in TUPLE_OPS:  # output k of a tuple-valued op: the getitem taking it
                    node = graph.picker(node.name, a.output)
                    if node is None:
                        continue
                forced[node.name] = Layout.from_spec(a.spec)
            else:
                inputs[(by_loc[a.location].name, a.input)] = Layout.from_spec(a.spec)
        return forced, inputs

    def sharded_params(self) -> dict[str, PartitionSpec]:
        return {k: v for k, v in self.params.items() if any(e is not None for e in v)}

    def summary(self) -> str:
        lines = [
            f"plan for {self.model} on mesh {self.mesh} {self.mesh.axis_names}"
            + (f" ({self.hardware})" if self.hardware else ""),
            f"  parameters: {len(self.params)} ({len(self.sharded_params())} sharded); activation constraints: {len(self.activations)}",
            f"  solver: {self.solver.status}, {self.solver.seconds:.2f} s",
        ]
        if self.predicted.step_seconds:
            p = self.predicted
            lines.append(
                f"  predicted: {p.step_seconds * 1e3:.2f} ms/forward (compute {p.compute_seconds * 1e3:.2f} ms, "
                f"comm {p.comm_seconds * 1e3:.2f} ms), {p.memory_bytes_per_device / 2**30:.2f} GiB/device"
            )
        return "\n".join(lines)

    # --- JSON ------------------------------------------------------------------------------------

    def to_json(self) -> dict:
        return {
            "schema_version": self.schema_version,
            "model": self.model,
            "mesh": self.mesh.to_json(),
            "hardware": self.hardware,
            "solver": self.solver.to_json(),
            "params": {k: spec_to_json(v) for k, v in self.params.items()},
            "activations": [a.to_json() for a in self.activations],
            "collectives": [c.to_json() for c in self.collectives],
            "target": self.target,
            "predicted_by_partitioner": {
                name: [c.to_json() for c in cs] for name, cs in self.predicted_by_partitioner().items()
            },
            "predicted": self.predicted.to_json(),
            "decisions": [d.to_json() for d in self.decisions],
            "rewrites": [r.to_json() for r in self.rewrites],
            "notes": list(self.notes),
            "guards": [{"expr": g.expr, "divisor": g.divisor, "what": g.what} for g in self.guards],
            "weight_sets": self.weight_sets,
            **({"cfg_parallel": self.cfg_parallel.to_json()} if self.cfg_parallel is not None else {}),
            **({"geometry": {**self.geometry, "layers": self.layers}} if self.geometry else {}),
        }

    @classmethod
    def from_json(cls, data: Mapping) -> "Plan":
        if not isinstance(data, Mapping):
            raise PlanError("plan.json must hold a JSON object")
        version = data.get("schema_version")
        if isinstance(version, int) and not isinstance(version, bool) and 1 <= version < SCHEMA_VERSION:
            raise PlanError(
                f"plan.json has schema_version {version}, an older format (its decisions are prose, not typed "
                f"data); this wancompile reads version {SCHEMA_VERSION} only. Re-plan to write a new one: "
                "`wancompile plan ... --out DIR` (or drop the `plan` option and set dump_dir)."
            )
        if version != SCHEMA_VERSION:
            raise PlanError(
                f"plan.json has schema_version {version!r}; this wancompile reads version {SCHEMA_VERSION}. "
                f"Re-plan with this version (`wancompile plan ... --out DIR`, or drop the `plan` option) to write a new one."
            )
        for key in ("model", "mesh", "params"):
            if key not in data:
                raise PlanError(
                    f"plan.json lacks the required field {key!r}; it is not a wancompile plan or it is truncated"
                )
        try:
            return cls(
                model=str(data["model"]),
                mesh=MeshSpec.from_json(data["mesh"]),
                params={str(k): _spec_from_json(v) for k, v in data["params"].items()},
                activations=tuple(ActivationConstraint.from_json(a) for a in data.get("activations", [])),
                hardware=str(data.get("hardware", "")),
                collectives=tuple(Collective.from_json(c) for c in data.get("collectives", [])),
                predicted=Predicted(**data.get("predicted", {})),
                solver=SolverInfo(**data.get("solver", {})),
                decisions=tuple(Decision.from_json(d) for d in data.get("decisions", [])),
                rewrites=tuple(
                    RewriteRecord(r["name"], int(r["count"]), tuple(r.get("where", ())), tuple(r.get("skipped", ())))
                    for r in data.get("rewrites", [])
                ),
                notes=tuple(data.get("notes", ())),
                guards=tuple(
                    Guard(str(g["expr"]), int(g["divisor"]), str(g.get("what", ""))) for g in data.get("guards", [])
                ),
                weight_sets=_weight_sets_from_json(data.get("weight_sets")),
                cfg_parallel=(
                    CfgParallel.from_json(data["cfg_parallel"]) if data.get("cfg_parallel") is not None else None
                ),
                geometry={k: v for k, v in dict(data.get("geometry", {})).items() if k != "layers"},
                target=_target_from_json(data.get("target", "gspmd")),
            )
        except PlanError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise PlanError(
                f"plan.json is malformed ({type(e).__name__}: {e}); regenerate it with `wancompile plan`"
            ) from None


def _target_from_json(value: Any) -> str:
    from planner.targets import TARGETS

    if value not in TARGETS:
        raise PlanError(f"plan.json field 'target' must be one of {', '.join(TARGETS)}, got {value!r}")
    return str(value)


def _weight_sets_from_json(value: Any) -> Optional[int]:
    if value is None:  # not budgeted, or saved before plans recorded it
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanError(f"plan.json field 'weight_sets' must be an integer >= 1 or null, got {value!r}")
    return value


_BLOCK = re.compile(r"^blocks\.(\d+)\.")


def model_geometry(graph: Graph) -> dict[str, Any]:
    """Heads, head dim and token count of a Wan DiT graph, read from block 0's self-attention
    (SDPA output ``(B, heads, tokens, head_dim)``); {} for a graph without one (the VAE)."""
    sdpa = next((n for n in graph if n.block == 0 and n.op == "scaled_dot_product_attention"), None)
    if sdpa is None or len(sdpa.out.shape) != 4:
        return {}
    _, heads, tokens, head_dim = sdpa.out.shape
    return {
        "heads": int(heads),
        "head_dim": int(head_dim),
        "tokens": tokens if isinstance(tokens, int) else str(tokens),
    }


def spec_to_json(spec: PartitionSpec) -> list:
    return [list(e) if isinstance(e, tuple) else e for e in spec]


def _spec_from_json(value: Any) -> PartitionSpec:
    if not isinstance(value, list) or not all(e is None or isinstance(e, (str, list)) for e in value):
        raise PlanError(f"bad partition spec {value!r}: expected a list of null, axis names, or lists of axis names")
    return normalize_spec(value)


def save_plan(plan: Plan, path: str | Path) -> Path:
    from planner.files import write_text

    return write_text(path, json.dumps(plan.to_json(), indent=1) + "\n")


def load_plan(path: str | Path) -> Plan:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise PlanError(f"cannot read plan {path}: {e.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise PlanError(
            f"plan {path} is not valid JSON ({e.msg} at line {e.lineno}); it may be truncated or corrupted — regenerate it"
        ) from None
    return Plan.from_json(data)


def replicated_params(graph: Graph) -> dict[str, PartitionSpec]:
    return {n.param: (None,) * len(n.out.shape) for n in graph.params()}
