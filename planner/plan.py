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
The records are the format: `planner.records` writes and reads them from their fields and
type hints, and generates ``wancompile/schema/plan.schema.json`` from them
(``python -m wancompile.report.schema --write``); only what a type cannot say is written here (the
partition-spec and location encodings, the version check, ``geometry.layers``).

This module is the `Plan` record (what it holds, how its blocks are named, its summary, its JSON
with the version check) and the file functions. The records it is made of and the encodings they
share are `planner.plan_records`'s; the check that a plan fits a graph is `planner.plan_check`'s;
the errors are `planner.errors`' (`PlanError` and its subclasses); the decision records are
`planner.decision`'s, the JSON mapping `planner.records`'. All are importable from here.
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
from planner.errors import InfeasiblePlanError, MemoryBudgetError, PlanError, SolverTimeout
from planner.graph import TUPLE_OPS, Graph
from planner.mesh import MeshSpec, PartitionSpec
from planner.placements import Guard, Layout
from planner.plan_check import check_fits, model_geometry
from planner.plan_records import (
    ActivationConstraint,
    CfgOption,
    CfgParallel,
    CompiledKernels,
    CompiledMemory,
    Predicted,
    RewriteRecord,
    SolverInfo,
    Spec,
    spec_to_json,
)
from planner.records import ADDED, OMIT, Codec, Record, Schema

# 2: typed decisions (options, exclusions, cost split, block-generic scope as data) replaced the
# prose ``note``; collectives may carry ``reason``/``seconds``.
SCHEMA_VERSION = 2

# re-exported: the plan's collectives are `planner.collective.Collective`, its decisions `planner.decision`'s,
# its errors `planner.errors`', its other records `planner.plan_records`', its check `planner.plan_check`'s
__all__ = ["Alternative", "Collective", "CostSplit", "Decision", "Exclusion", "HeadPadding", "Move", "OptionCost"]
__all__ += ["MAIN_STACK", "RingAttention"]
__all__ += ["InfeasiblePlanError", "MemoryBudgetError", "PlanError", "SolverTimeout"]
__all__ += [
    "ActivationConstraint",
    "CfgOption",
    "CfgParallel",
    "CompiledKernels",
    "CompiledMemory",
    "Predicted",
    "RewriteRecord",
]
__all__ += ["SolverInfo", "Spec", "spec_to_json", "model_geometry"]
__all__ += ["Plan", "SCHEMA_VERSION", "load_plan", "save_plan", "replicated_params"]

# --- encodings of the plan's own fields ------------------------------------------------------------------


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
    # the main program's kernels per part of the model as the target's compiler built it (`wancompile tt-check`)
    compiled_kernels: Annotated[tuple[CompiledKernels, ...], OMIT] = ()
    # the predicted collectives in the target's own terms where the graph was needed to tell them
    # (planner.pins.target_collectives); empty: `Target.lower` of `collectives`. Written, so that a plan read back
    # (tt-check adds what it compiled to the plan.json it wrote) predicts what tt-check held the program against
    target_collectives: Annotated[tuple[Collective, ...], OMIT] = field(default=(), compare=False)
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
        """Raise PlanError unless this plan fits `graph` (`planner.plan_check.check_fits`): its geometry,
        exactly the graph's parameters, specs that divide on this mesh, activation locations that exist.
        A plan that pads heads (`head_padding`) names ops of the padded graph; its geometry is the
        model's: pass the graph before padding as `unpadded`."""
        check_fits(self, graph, unpadded=unpadded)

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
