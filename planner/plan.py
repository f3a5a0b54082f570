"""`Plan`: what to shard and how, saved as a versioned ``plan.json``.

A plan is data the lowering applies and a person can read:

- ``params``: fully qualified parameter name -> partition spec (one entry per tensor dim: a mesh
  axis, a tuple of axes, or null). Every parameter of the model appears, replicated ones too, so a
  plan for a different model is caught by name.
- ``activations``: sharding constraints at `Location`s (module path + op + occurrence), which survive
  recompiles, unlike dynamo's node names.
- ``collectives``: what the plan predicts the partitioned program will hold.
- ``predicted``, ``solver``, ``decisions``, ``rewrites``: the planner's account of itself.

JSON only (no pickles), with ``schema_version``; `load_plan` rejects anything it does not
understand with a message that says what is wrong.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Optional

from planner.graph import Graph, Location
from planner.mesh import MeshError, MeshSpec, PartitionSpec, check_spec, normalize_spec
from planner.placements import Guard, Layout

SCHEMA_VERSION = 1


class PlanError(ValueError):
    """A plan that cannot be applied to this model or mesh; the message names the fix."""


class MemoryBudgetError(PlanError):
    """No plan fits the per-device memory budget. ``need_gb`` is a budget the planner then accepts
    on this mesh (found by solving, not estimated); ``meshes`` names larger system meshes that
    plan within the given budget (may be empty)."""

    def __init__(self, message: str, *, budget_gb: float, need_gb: float, meshes: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.budget_gb, self.need_gb, self.meshes = budget_gb, need_gb, meshes


class SolverTimeout(PlanError):
    """The solver stopped at its time limit before finding any plan; nothing says none exists.
    Raise ``time_limit_s`` (``wancompile plan --time-limit``)."""

    def __init__(self, message: str, *, time_limit_s: float) -> None:
        super().__init__(message)
        self.time_limit_s = time_limit_s


@dataclass(frozen=True)
class ActivationConstraint:
    """Constrain output ``output`` of the op at ``location`` to ``spec`` (in place: every reader of
    the value sees the constrained layout). With ``input`` set, the op at ``location`` reads its
    ``input``-th input (graph order) through a copy constrained to ``spec`` instead: the value's
    other readers keep their layout (a stream value read by two macros with different layouts);
    readers of one value with the same spec share one copy."""

    location: Location
    spec: PartitionSpec
    shape: tuple[Any, ...] = ()
    output: int = 0
    reason: str = ""
    input: Optional[int] = None

    def to_json(self) -> dict:
        out = {
            "node": str(self.location),
            "module": self.location.module,
            "output": self.output,
            "shape": [d if isinstance(d, int) else str(d) for d in self.shape],
            "spec": _spec_json(self.spec),
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


@dataclass(frozen=True)
class Collective:
    """A collective the partitioned program runs: kind, mesh axes, bytes moved per call, count."""

    kind: str  # all-reduce | all-gather | reduce-scatter | all-to-all | collective-permute
    axes: tuple[str, ...]
    bytes: int
    count: int = 1
    where: str = ""

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "axes": list(self.axes),
            "bytes": int(self.bytes),
            "count": int(self.count),
            "where": self.where,
        }

    @classmethod
    def from_json(cls, d: Mapping) -> "Collective":
        return cls(d["kind"], tuple(d["axes"]), int(d["bytes"]), int(d.get("count", 1)), d.get("where", ""))


@dataclass(frozen=True)
class Predicted:
    step_seconds: float = 0.0
    compute_seconds: float = 0.0
    comm_seconds: float = 0.0
    memory_bytes_per_device: int = 0

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class SolverInfo:
    status: str = "none"  # OPTIMAL | FEASIBLE | hand-written | ...
    objective: float = 0.0
    seconds: float = 0.0
    variables: int = 0
    constraints: int = 0
    gap: float = 0.0

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Decision:
    """What was chosen for a node (or block-shared group) and what lost."""

    node: str
    strategy: str
    cost: float
    rejected: str = ""
    rejected_cost: Optional[float] = None
    note: str = ""

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class CfgOption:
    """One way to run a denoising step's CFG pair (a batch-2 forward), as the planner priced it.

    ``name`` is ``off`` (the batch-2 plan on the whole mesh) or ``split(AXIS)`` (mesh axis AXIS halved:
    each half runs one branch's plan on its submesh). Times are per denoising step (cond + uncond);
    ``None`` where no plan exists (``reason`` says why: memory, divisibility)."""

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
        return self.step_seconds is not None

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
        return self.chosen != "off"

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
    name: str
    count: int
    where: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"name": self.name, "count": self.count, "where": list(self.where)}


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

    @property
    def user_mesh(self) -> MeshSpec:
        """The mesh the plan was asked for: ``mesh`` itself, or the unsplit mesh of a CFG-split plan."""
        return self.cfg_parallel.base_mesh if self.cfg_parallel is not None else self.mesh

    # The DiT geometry the plan was made for (`model_geometry`): heads, head_dim, tokens (an int, or the
    # symbolic expression whose divisibility `guards` state). Checked by `check`; {} for other graphs.
    geometry: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def with_(self, **changes: Any) -> "Plan":
        return replace(self, **changes)

    # --- checking against a captured model ------------------------------------------------------

    @property
    def layers(self) -> int:
        """Blocks the plan's parameter names cover (``blocks.N.``), 0 for a graph without blocks."""
        idx = {int(m.group(1)) for p in self.params for m in [_BLOCK.match(p)] if m}
        return max(idx) + 1 if idx else 0

    def check(self, graph: Graph) -> None:
        """Raise PlanError unless the graph has the geometry the plan was made for, the plan names
        exactly the graph's parameters, every spec divides its tensor on this mesh, and every
        activation location exists."""
        self._check_geometry(graph)
        shapes = {n.param: n.out.shape for n in graph.params()}
        unknown = sorted(set(self.params) - set(shapes))
        missing = sorted(set(shapes) - set(self.params))
        if unknown or missing:
            parts = []
            if unknown:
                parts.append(f"{len(unknown)} parameter(s) the model does not have (e.g. {', '.join(unknown[:3])})")
            if missing:
                parts.append(f"no spec for {len(missing)} of the model's parameter(s) (e.g. {', '.join(missing[:3])})")
            blocks = len(graph.blocks())
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
                forced[by_loc[a.location].name] = Layout.from_spec(a.spec)
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
            "params": {k: _spec_json(v) for k, v in self.params.items()},
            "activations": [a.to_json() for a in self.activations],
            "collectives": [c.to_json() for c in self.collectives],
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
        if version != SCHEMA_VERSION:
            raise PlanError(
                f"plan.json has schema_version {version!r}; this wancompile reads version {SCHEMA_VERSION}. "
                f"Re-plan with this version (drop the `plan` option) to write a new one."
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
                decisions=tuple(Decision(**d) for d in data.get("decisions", [])),
                rewrites=tuple(
                    RewriteRecord(r["name"], int(r["count"]), tuple(r.get("where", ())))
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
            )
        except PlanError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise PlanError(
                f"plan.json is malformed ({type(e).__name__}: {e}); regenerate it with `wancompile plan`"
            ) from None


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


def _spec_json(spec: PartitionSpec) -> list:
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
