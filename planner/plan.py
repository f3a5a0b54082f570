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
The records below are the format: `planner.records` writes and reads them from their fields and
type hints, and generates ``wancompile/schema/plan.schema.json`` from them
(``python -m wancompile.report.schema --write``); only what a type cannot say is written here (the
partition-spec and location encodings, the version check, ``geometry.layers``).

Over 400 lines because it is the format's one definition: every plan.json record with its field
documentation, plus the checks that a plan fits a captured graph (`Plan.check`); the decision
records are `planner.decision`'s, the JSON mapping `planner.records`'.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Mapping, Optional

from planner.collective import Collective
from planner.decision import (
    MAIN_STACK,
    Alternative,
    CostSplit,
    Decision,
    Exclusion,
    HeadPadding,
    Move,
    OptionCost,
    RingAttention,
)
from planner.graph import TUPLE_OPS, Graph, Location, Node
from planner.mesh import MeshError, MeshSpec, PartitionSpec, normalize_spec
from planner.placements import Guard, Layout, check_spec
from planner.records import ADDED, HIDDEN, OMIT, Codec, Key, Record, Schema

# 2: typed decisions (options, exclusions, cost split, block-generic scope as data) replaced the
# prose ``note``; collectives may carry ``reason``/``seconds``.
SCHEMA_VERSION = 2

# re-exported: the plan's collectives are `planner.collective.Collective`, its decisions `planner.decision`'s
__all__ = ["Alternative", "Collective", "CostSplit", "Decision", "Exclusion", "HeadPadding", "Move", "OptionCost"]
__all__ += ["MAIN_STACK", "RingAttention"]


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


# --- encodings a type cannot say ------------------------------------------------------------------------


def spec_to_json(spec: PartitionSpec) -> list:
    return [list(e) if isinstance(e, tuple) else e for e in spec]


def _spec_from_json(value: Any) -> PartitionSpec:
    if not isinstance(value, list) or not all(e is None or isinstance(e, (str, list)) for e in value):
        raise PlanError(f"bad partition spec {value!r}: expected a list of null, axis names, or lists of axis names")
    return normalize_spec(value)


def _weight_sets_from_json(value: Any) -> Optional[int]:
    if value is None:  # not budgeted, or saved before plans recorded it
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanError(f"plan.json field 'weight_sets' must be an integer >= 1 or null, got {value!r}")
    return value


def _target_from_json(value: Any) -> str:
    from planner.targets import TARGETS

    if value not in TARGETS:
        raise PlanError(f"plan.json field 'target' must be one of {', '.join(TARGETS)}, got {value!r}")
    return str(value)


def _targets_schema() -> dict:
    from planner.targets import TARGETS

    return {"enum": list(TARGETS)}


_AXES = {"type": "array", "items": {"type": "string"}, "minItems": 1}
Spec = Annotated[
    PartitionSpec,
    Codec(
        spec_to_json,
        _spec_from_json,
        {
            "description": "one entry per tensor dim: null (replicated), a mesh axis name, or a list of axis names (major first)",
            "type": "array",
            "items": {"anyOf": [{"type": "null"}, {"type": "string"}, _AXES]},
        },
        name="spec",
    ),
]
Dim = Annotated[
    Any,
    Codec(
        lambda d: d if isinstance(d, int) else str(d),
        lambda d: d,
        {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "string"}]},
        name="dim",
    ),
]
_LOCATION = {"type": "string", "pattern": "^[^:]*:[^#]+#[0-9]+$", "description": "Location: module.path:op#occurrence"}
NonNeg = Schema(minimum=0)
_WEIGHT_SETS = {"type": ["integer", "null"], "minimum": 1}
_GEOMETRY = Schema(
    description="the DiT geometry the plan was made for; a plan is refused on a model with other values",
    additionalProperties=False,
    properties={
        "heads": {"type": "integer", "minimum": 1},
        "head_dim": {"type": "integer", "minimum": 1},
        "tokens": {
            "type": ["integer", "string"],
            "description": "token count, or its symbolic expression (see guards)",
        },
        "layers": {"type": "integer", "minimum": 0},
    },
)
CFG_OPTION_ORDER = ("name", "mesh", "split_axis", "step_seconds", "compute_seconds", "comm_seconds")
CFG_OPTION_ORDER += ("memory_bytes_per_device", "feasible")


@dataclass(frozen=True)
class ActivationConstraint(Record):
    """Constrain output ``output`` of the op at ``location`` to ``spec`` (in place: every reader of
    the value sees the constrained layout; several on one op apply in order). With ``input`` set,
    the op at ``location`` reads its ``input``-th input (graph order) through a copy constrained to
    ``spec`` instead: the value's other readers keep their layout (a stream value read by two
    macros with different layouts); readers of one value with the same spec share one copy. ``via``:
    layouts the value is constrained to first, in order, where the target cannot lower the direct
    reshard (`planner.reshard.route`: tt-mlir lowers no collective-permute)."""

    json_order = ("node", "module", "output", "shape")
    json_derived = ("module",)

    location: Annotated[Location, Key("node"), Codec(str, Location.parse, _LOCATION)]
    spec: Spec
    shape: Annotated[tuple[Dim, ...], ADDED] = ()
    output: Annotated[int, ADDED, NonNeg] = 0
    reason: Annotated[str, ADDED] = ""
    input: Annotated[Optional[int], OMIT, NonNeg] = None
    via: Annotated[tuple[Spec, ...], OMIT] = ()

    @classmethod
    def whole(cls, node: Node, reason: str) -> "ActivationConstraint":
        """`node`'s output kept whole (replicated on every dim)."""
        return cls(node.location, (None,) * len(node.out.shape), node.out.shape, reason=reason)

    @property
    def module(self) -> str:
        return self.location.module


@dataclass(frozen=True)
class Predicted(Record):
    """What the cost model predicts for one forward (per decode for the VAE, per step for CFG) and
    the memory each device holds."""

    step_seconds: Annotated[float, NonNeg] = 0.0
    compute_seconds: Annotated[float, NonNeg] = 0.0
    comm_seconds: Annotated[float, NonNeg] = 0.0
    memory_bytes_per_device: Annotated[int, NonNeg, Schema(description="weights and live activations")] = 0


@dataclass(frozen=True)
class SolverInfo(Record):
    """How the plan was found: the solver's status (``OPTIMAL``, ``FEASIBLE``, ``hand-written``), its
    objective, wall time, model size and optimality gap."""

    status: str = "none"  # OPTIMAL | FEASIBLE | hand-written | ...
    objective: float = 0.0
    seconds: Annotated[float, NonNeg] = 0.0
    variables: Annotated[int, NonNeg] = 0
    constraints: Annotated[int, NonNeg] = 0
    gap: Annotated[float, NonNeg] = 0.0


@dataclass(frozen=True)
class CfgOption(Record):
    """One way to run a denoising step's CFG pair (a batch-2 forward), as the planner priced it.

    ``name`` is ``off`` (the batch-2 plan on the whole mesh), ``split(AXIS)`` (mesh axis AXIS halved:
    each half runs one branch's plan on its submesh) or ``sequential`` (two batch-1 forwards on the whole
    mesh, the caller's to run). Times are per denoising step (cond + uncond); ``None`` where no plan
    exists (``reason`` says why: memory, divisibility). An option priced but not for the taking (``sequential``
    where the caller runs the batch-2 forward itself) keeps its times and gives its ``reason``."""

    json_order = CFG_OPTION_ORDER
    json_derived = ("feasible",)

    name: Annotated[str, Schema(pattern=r"^(off|sequential|split\([A-Za-z_][\w]*\))$")]
    mesh: MeshSpec  # the mesh this option's plan is made on (3-D for a split)
    split_axis: Optional[str] = None  # axis of the user's mesh that was halved
    step_seconds: Annotated[Optional[float], NonNeg] = None
    compute_seconds: Annotated[Optional[float], ADDED, NonNeg] = None
    comm_seconds: Annotated[Optional[float], ADDED, NonNeg] = None
    memory_bytes_per_device: Annotated[Optional[int], ADDED, NonNeg] = None
    reason: Annotated[str, ADDED] = ""
    memory_needed_bytes: Annotated[Optional[int], ADDED, NonNeg] = (
        None  # no plan fits memory: a lower bound on what the smallest plan needs
    )

    @property
    def feasible(self) -> bool:
        """Priced and for the taking."""
        return self.step_seconds is not None and not self.reason


@dataclass(frozen=True)
class CfgParallel(Record):
    """The CFG-parallel decision of a batch-2 DiT plan (`planner.cfg`): what was asked (``mode``:
    auto / on / off), every option with its cost, the chosen one, and the user's mesh (the plan's own
    ``mesh`` is the split 3-D mesh when a split was chosen)."""

    json_order = ("mode", "chosen", "axis")

    mode: Annotated[str, Schema(enum=["auto", "on", "off"])]
    chosen: str
    base_mesh: MeshSpec
    batch: Annotated[int, Schema(minimum=2)]
    options: Annotated[tuple[CfgOption, ...], Schema(minItems=1)]
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


@dataclass(frozen=True)
class RewriteRecord(Record):
    """A rewrite pass the plan's graph went through: ``count`` sites rewritten at module paths ``where``,
    and ``skipped``: one entry per candidate it left unchanged (where: why), so a pass that could not
    run where it was asked to is on the record, not silently dropped."""

    name: str
    count: Annotated[int, NonNeg]
    where: tuple[str, ...] = ()
    skipped: Annotated[tuple[str, ...], OMIT] = ()  # one 'module path: reason' each

    def to_json(self) -> dict:
        out = {"name": self.name, "count": self.count, "where": list(self.where)}
        if self.skipped:
            out["skipped"] = list(self.skipped)
        return out


@dataclass(frozen=True)
class CompiledMemory(Record):
    """A plan's main program as a compiler built it for one system: its peak memory per chip read from the
    compiled program (`wancompile.tt.ttnn.memory`, written by ``wancompile tt-check``) beside the
    planner's estimate."""

    system: str
    peak_bytes: Annotated[int, NonNeg, Schema(description="DRAM per chip at the program's peak, as allocated")]
    peak_logical_bytes: Annotated[int, NonNeg, Schema(description="the same tensors' data, without tile padding")]
    arguments_bytes: Annotated[int, NonNeg, Schema(description="weights and inputs, as allocated")]
    constants_bytes: Annotated[int, NonNeg, Schema(description="constants the program keeps, as allocated")]
    planned_bytes: Annotated[int, NonNeg, Schema(description="the planner's per-device estimate (predicted)")]
    chip_bytes: Annotated[int, NonNeg, Schema(description="the chip's DRAM")] = 0


@dataclass(frozen=True)
class Plan(Record):
    json_order = ("schema_version", "model", "mesh", "hardware", "solver", "params", "activations", "collectives")
    json_order += ("target", "predicted_by_partitioner", "predicted")
    json_derived = ("predicted_by_partitioner",)

    model: str
    mesh: MeshSpec
    params: Annotated[
        Mapping[str, Spec], Schema(description="fully qualified parameter or buffer name -> partition spec")
    ]
    activations: tuple[ActivationConstraint, ...] = ()
    hardware: str = ""
    collectives: tuple[Collective, ...] = ()
    predicted: Predicted = field(default_factory=Predicted)
    solver: SolverInfo = field(default_factory=SolverInfo)
    decisions: tuple[Decision, ...] = ()
    rewrites: tuple[RewriteRecord, ...] = ()
    notes: Annotated[tuple[str, ...], ADDED] = ()
    schema_version: Annotated[int, Schema(const=SCHEMA_VERSION)] = SCHEMA_VERSION
    guards: Annotated[tuple[Guard, ...], ADDED] = ()  # divisibility the plan assumes of symbolic dims (planner.guards)
    # Weight sets resident per device that the memory budget held (2: both Wan 2.2 experts); None: the
    # plan was not budgeted (hand-written, replicated) or was saved before plans recorded it.
    weight_sets: Annotated[Optional[int], ADDED, Codec(lambda n: n, _weight_sets_from_json, _WEIGHT_SETS)] = None
    # batch-2 DiT plans: the CFG-parallel choice (planner.cfg)
    cfg_parallel: Annotated[Optional[CfgParallel], OMIT] = None
    # the partitioner the plan is for (planner.targets)
    target: Annotated[str, ADDED, Codec(str, _target_from_json, _targets_schema)] = "gspmd"
    # the main program's memory per chip as the target's compiler built it (`wancompile tt-check`)
    compiled_memory: Annotated[tuple[CompiledMemory, ...], OMIT] = ()
    # the predicted collectives in the target's own terms where the graph was needed to tell them
    # (planner.pins.target_collectives); empty: `Target.lower` of `collectives`
    target_collectives: Annotated[tuple[Collective, ...], HIDDEN] = field(default=(), compare=False)
    # The DiT geometry the plan was made for (`model_geometry`): heads, head_dim, tokens (an int, or the
    # symbolic expression whose divisibility `guards` state). Checked by `check`; {} for other graphs.
    geometry: Annotated[Mapping[str, Any], OMIT, _GEOMETRY] = field(default_factory=dict, hash=False)

    def predicted_by_partitioner(self) -> Annotated[dict[str, tuple[Collective, ...]], ADDED]:
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

    @cached_property
    def stacks(self) -> dict[str, int]:
        """{prefix: blocks} of the plan's block stacks, main stack first: the DiT's (`MAIN_STACK`, what
        its ``in_block`` decisions apply to) and every further family its decisions name (VACE's
        ``vace_blocks``), each with the blocks its parameter names cover; {} for a plan without blocks."""
        out = {}
        for prefix in dict.fromkeys((MAIN_STACK, *(d.family for d in self.decisions if d.family))):
            idx = {b[0] for name in self.params if (b := _in_stack(name, prefix)) is not None}
            if idx:
                out[prefix] = max(idx) + 1
        return out

    def block_of(self, name: str) -> Optional[tuple[str, int, str]]:
        """(stack prefix, block index, the rest) of a parameter name, module path or location text
        inside one of the plan's `stacks` (``blocks.3.attn1:linear#0`` -> ``("blocks", 3,
        ".attn1:linear#0")``); None outside them."""
        for prefix in sorted(self.stacks, key=len, reverse=True):
            b = _in_stack(name, prefix)
            if b is not None:
                return (prefix, *b)
        return None

    def generic(self, name: str) -> str:
        """`name` as it reads for every block of its stack (``blocks.*.attn1.to_q.weight``); unchanged
        outside the stacks (see `block_of`)."""
        b = self.block_of(name)
        return name if b is None else f"{b[0]}.*{b[2]}"

    @property
    def layers(self) -> int:
        """Blocks of the main stack (`stacks`), 0 for a plan without one."""
        return self.stacks.get(MAIN_STACK, 0)

    def first_blocks(self, n: int) -> "Plan":
        """This plan for the model cut to the first `n` blocks of each stack: the specs of the later
        blocks' parameters and activations dropped, everything else (the decisions, the prediction for
        the whole model) as planned. What a program of a few full-width blocks compiles under the plan made
        for all of them (`wancompile.tt.fullsize`)."""
        if n < 1:
            raise ValueError(f"first_blocks needs at least one block; got {n}")

        def kept(name: str) -> bool:
            b = self.block_of(name)
            return b is None or b[1] < n

        return self.with_(
            params={k: v for k, v in self.params.items() if kept(k)},
            activations=tuple(c for c in self.activations if kept(c.module)),
        )

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
            blocks = len(graph.blocks(MAIN_STACK))  # the stack `layers` counts
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
        out = super().to_json()
        if self.geometry:
            out["geometry"] = {**out["geometry"], "layers": self.layers}
        return out

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
            plan = super().from_json(data)
        except PlanError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise PlanError(
                f"plan.json is malformed ({type(e).__name__}: {e}); regenerate it with `wancompile plan`"
            ) from None
        cfg = plan.cfg_parallel
        if cfg is not None and cfg.chosen not in {o.name for o in cfg.options}:
            raise PlanError(f"plan.json cfg_parallel.chosen {cfg.chosen!r} is none of its options")
        return plan.with_(geometry={k: v for k, v in plan.geometry.items() if k != "layers"})


def _in_stack(name: str, prefix: str) -> Optional[tuple[int, str]]:
    """(block index, the rest) of `name` under ``prefix.<int>`` (followed by ``.``, ``:`` or nothing)."""
    if not name.startswith(prefix + "."):
        return None
    rest = name[len(prefix) + 1 :]
    cut = min((i for i in (rest.find("."), rest.find(":")) if i >= 0), default=len(rest))
    return (int(rest[:cut]), rest[cut:]) if rest[:cut].isdigit() else None


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
