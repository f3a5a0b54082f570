"""The records a plan is made of, beside `planner.plan.Plan` itself, and the encodings a type cannot say.

`ActivationConstraint` (a sharding constraint at a `Location`), `Predicted` (the cost model's
account of one forward), `SolverInfo`, the CFG-parallel decision (`CfgParallel` of `CfgOption`s),
`RewriteRecord` and `CompiledMemory`: each is a plan.json section, written and read by
`planner.records` from its fields and type hints; the field documentation here is the schema's
(``wancompile/schema/plan.schema.json``). Also the encodings shared by the records: a partition
spec (`Spec`: `spec_to_json`), a dimension that may be symbolic (`Dim`), non-negative numbers.
Import them from `planner.plan`, which re-exports them with the plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Mapping, Optional

from planner.errors import PlanError
from planner.graph import Location, Node
from planner.mesh import MeshSpec, PartitionSpec, normalize_spec
from planner.records import ADDED, OMIT, Codec, Key, Record, Schema

# --- encodings a type cannot say ------------------------------------------------------------------------


def spec_to_json(spec: PartitionSpec) -> list:
    return [list(e) if isinstance(e, tuple) else e for e in spec]


def _spec_from_json(value: Any) -> PartitionSpec:
    if not isinstance(value, list) or not all(e is None or isinstance(e, (str, list)) for e in value):
        raise PlanError(f"bad partition spec {value!r}: expected a list of null, axis names, or lists of axis names")
    return normalize_spec(value)


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
    # why it ran: the user asked for it, the saved plan was made with it, or the target's default and its reason
    why: Annotated[str, OMIT] = ""

    def to_json(self) -> dict:
        out = {"name": self.name, "count": self.count, "where": list(self.where)}
        if self.skipped:
            out["skipped"] = list(self.skipped)
        if self.why:
            out["why"] = self.why
        return out


@dataclass(frozen=True)
class CompiledKernels(Record):
    """The kernels of one part of a plan's main program (the prologue, a block, the epilogue) as a compiler
    built it for one system: the compiled program's ops by name (`wancompile.tt.parts.by_part`, written by
    ``wancompile tt-check``)."""

    system: str
    part: Annotated[str, Schema(description="prologue, a block (blocks.0, ...) or epilogue")]
    ops: Annotated[Mapping[str, int], Schema(description="op name (ttnn.matmul, ...) -> how many")]


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
