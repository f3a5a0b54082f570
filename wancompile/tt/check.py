"""``wancompile tt-check``: compile a call's programs through tt-mlir (compile-only) and hold TTNN's
collectives against the plan's prediction for the ``tt-mlir`` target.

`check_programs` takes the Shardy-form modules a call wrote (`wancompile.tt.export`), compiles each for a
system descriptor in the worker process, reads the final TTNN IR (`wancompile.tt.ttnn`) and compares, per
(kind, mesh axis), the compiled collectives with the predicted ones (`planner.targets.Target.lower` of
the plan's collectives for the main program; nothing for the fold program, which the plans keep
collective-free). Counts are compared; bytes are reported, in TTNN's own types (tt-mlir may compute in
bf16 where the program says f32).

Before compiling, the worker refuses a module in which a convolution reads an input split on a spatial
dim that its window spans (`worker.spatial_convs`): Shardy treats those dims as pass-through and tt-mlir
emits no halo exchange (tt-mlir #8216), so each chip would convolve its tile padded with zeros — a
wrong answer at every shard edge, never compiled silently.

TTNN's own metrics (``ttnn_perf_metrics_enabled``) are kept per program: ``total_flops`` (per chip, of
the ops TTNN's perf model counts: matmuls, linears, convolutions and the collectives' reductions),
``total_ops`` (TTNN ops, deallocations and layout moves included) and the share spilled to DRAM. They
carry no time estimate on a multi-chip mesh.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional

from planner.collective import Collective
from planner.mesh import MeshSpec
from planner.plan import MAIN_STACK
from planner.ttnn_kernels import Kernels, plan_kernels
from wancompile.composites import Site
from wancompile.tt import env, parts, ttnn
from wancompile.tt.mesh import chip_mesh, system_for  # noqa: F401  (system_for: re-exported)
from wancompile.tt.wormhole import StandIn
from wancompile.verify import CollectiveMatch, compare_collectives


def _attrs(obj, *names: str) -> dict:
    """`obj`'s attributes `names`, by name (the plain fields of a `to_json`)."""
    return {n: getattr(obj, n) for n in names}


@dataclass(frozen=True)
class ProgramCheck:
    """One program compiled for one system."""

    program: str
    system: str
    compiled: bool
    error: str = ""  # the compiler's (or the halo check's) first error line
    seconds: float = 0.0
    matches: tuple[CollectiveMatch, ...] = ()
    local_slices: int = 0  # ttnn.mesh_partition: each chip keeps its part of a replicated value
    metrics: Mapping[str, float] = field(default_factory=dict)
    ttnn_ir: Optional[str] = None
    memory: Optional[ttnn.Memory] = None  # the TTNN program's DRAM per chip, walked op by op
    planned_bytes: Optional[int] = None  # the planner's per-device estimate (plan.predicted), for the main program
    compiler_peak_bytes: int = 0  # the compiler process's peak resident memory on this host
    options: Mapping[str, str] = field(default_factory=dict)  # the compile options it was compiled with
    level_0_because: str = ""  # why a program that hands over fused attention was compiled at level 0
    # the TTNN ops of @main by part of the model, in program order (`parts.by_part`): ("blocks.0", {op: n})
    parts: tuple[tuple[str, Mapping[str, int]], ...] = ()
    # attention-sized tensors in the program (`parts.lq_lk_tensors`: score matrices, and masks as TTNN holds them,
    # by `ScoreMatrix.kind`), and those of an attention handed over as fused attention (predicted as one kernel
    # that never writes them and reads no L_q x L_k mask): those refuse the program
    score_matrices: tuple[parts.ScoreMatrix, ...] = ()
    unfused_scores: tuple[parts.ScoreMatrix, ...] = ()
    scores_priced: bool = False  # its planner prices its attention's score matrices (the VAE's)
    # the pinned program per part against the same module compiled without the plan (tt-check --unannotated)
    pin_costs: tuple[parts.PinCost, ...] = ()
    unannotated_error: str = ""  # why the unannotated module gave no comparison
    # the parameters handed over marked ``parameter`` (computed from once: tt-mlir's const-eval), and those left
    # unmarked because the plan gathers them per use (`wancompile.tt.worker` compile: first parameter of each)
    parameter_arguments: int = 0
    gathered_per_use: tuple[str, ...] = ()
    # block index -> the TTNN kernels the plan predicts that block runs per call (`planner.ttnn_kernels`)
    predicted_kernels: Mapping[int, Kernels] = field(default_factory=dict)
    stand_in: Optional[StandIn] = (
        None  # kernels JIT-built from grafted sources: compile-only (`wancompile.tt.wormhole`)
    )

    @property
    def kernels(self) -> tuple[tuple[str, Kernels, Optional[Kernels]], ...]:
        """Per block: (its part, the kernels it runs as compiled, as predicted (None: no prediction))."""
        return tuple(
            (name, Kernels.of_ttnn(ops), self.predicted_kernels.get(int(name.rsplit(".", 1)[1])))
            for name, ops in self.blocks
            if name.rsplit(".", 1)[0] == MAIN_STACK
        )

    @property
    def kernel_error(self) -> Optional[float]:
        """The largest |predicted / compiled - 1| of a block's kernels per call (None: nothing to compare)."""
        errs = [abs(p.total / c.total - 1) for _, c, p in self.kernels if p is not None and c.total]
        return max(errs) if errs else None

    @property
    def pins_clean(self) -> bool:
        """No block lost a fusion or gained a move that the plan's reshards do not explain (the prologue's and
        epilogue's are reported, not judged: the blocks are what repeats 30 to 40 times)."""
        blocks = [c for c in self.pin_costs if c.part not in (parts.PROLOGUE, parts.EPILOGUE)]
        return not self.unannotated_error and all(not c.unexplained for c in blocks)

    @property
    def memory_ratio(self) -> Optional[float]:
        """TTNN's peak DRAM per chip / the planner's estimate."""
        if self.memory is None or not self.planned_bytes:
            return None
        return self.memory.peak_bytes / self.planned_bytes

    @property
    def as_predicted(self) -> bool:
        return self.compiled and all(m.count_ok for m in self.matches) and not self.unfused_scores

    @property
    def blocks(self) -> tuple[tuple[str, Mapping[str, int]], ...]:
        """`parts` without the prologue and the epilogue."""
        return tuple(p for p in self.parts if p[0] not in (parts.PROLOGUE, parts.EPILOGUE))

    def to_json(self) -> dict:
        return {
            **_attrs(self, "program", "system", "compiled", "error", "seconds", "as_predicted", "compiler_peak_bytes"),
            "options": dict(self.options),
            "level_0_because": self.level_0_because,
            "stand_in": None if self.stand_in is None else self.stand_in.to_json(),
            "collectives": [
                {
                    "kind": m.kind,
                    "axes": list(m.axes),
                    "predicted_count": m.predicted_count,
                    "ttnn_count": m.observed_count,
                    "predicted_bytes": m.predicted_bytes,
                    "ttnn_bytes": m.observed_bytes,
                }
                for m in self.matches
            ],
            "local_slices": self.local_slices,
            "ttnn_ops_by_part": [{"part": name, "ops": dict(ops)} for name, ops in self.parts],
            "score_matrices": [
                {
                    **_attrs(x, "value", "op", "type", "bytes", "lq", "lk", "kind"),
                    "fused_predicted": x in self.unfused_scores,
                }
                for x in self.score_matrices
            ],
            "pin_costs": [
                {
                    "part": c.part,
                    "kernels": {k: list(v) for k, v in c.kernels.items()},
                    "moves": {k: list(v) for k, v in c.moves.items()},
                    "moves_at_reshards": dict(c.moves_at_reshards),
                    "matmuls_before_reductions": c.matmuls_before_reductions,
                    "unexplained": c.unexplained,
                }
                for c in self.pin_costs
            ],
            "unannotated_error": self.unannotated_error,
            "kernels_by_block": [
                {"part": name, "compiled": c.to_json(), "predicted": None if p is None else p.to_json()}
                for name, c, p in self.kernels
            ],
            "kernel_error": self.kernel_error,
            "parameter_arguments": self.parameter_arguments,
            "gathered_per_use": list(self.gathered_per_use),
            "pins_clean": self.pins_clean,
            "metrics": dict(self.metrics),
            "ttnn_ir": self.ttnn_ir,
            "memory": None
            if self.memory is None
            else {
                **_attrs(self.memory, "peak_bytes", "peak_logical_bytes", "arguments_bytes", "constants_bytes"),
                **_attrs(self.memory, "l1_peak_bytes", "peak_op", "tile_padding"),
                "largest": [list(x) for x in self.memory.largest],
                "planned_bytes": self.planned_bytes,
                "ttnn_over_planned": self.memory_ratio,
            },
        }


def device_axes(mesh: MeshSpec, device: MeshSpec) -> dict[str, str]:
    """Each axis of a plan's mesh -> the axis of the chips' 2-D mesh it lies along: a plan mesh that
    refines the user's (a CFG split: ``cfg=2, batch=1, model=4`` on 2x4) folds row-major onto it, and
    TTNN's ``cluster_axis`` counts the chips' axes."""
    out, k, size = {}, 0, 1
    for name, n in zip(mesh.axis_names, mesh.shape):
        while k < len(device.shape) - 1 and size == device.shape[k] and n > 1:
            k, size = k + 1, 1
        out[name] = device.axis_names[k]
        size *= n
    return out


def on_device(collectives: Iterable[Collective], mesh: MeshSpec, device: MeshSpec) -> list[Collective]:
    """`collectives` over a plan's mesh axes, named by the chips' mesh axes they run along."""
    if mesh == device or set(mesh.axis_names) == set(device.axis_names):
        return list(collectives)
    to = device_axes(mesh, device)
    return [replace(c, axes=tuple(dict.fromkeys(to[a] for a in c.axes))) for c in collectives]


# tt-mlir decomposes ttnn.scaled_dot_product_attention back into matmul + softmax + matmul unless its op model
# validates the kernel, which only the optimizer (optimization_level >= 1) does; level 1 also validates every
# other op (a tiny DiT: ~20 s more) and refuses conv3d ("not linked in this libtt build" in the compile-only
# libtt), so a program is compiled at level 1 where it hands over fused attention and holds no 3-D
# convolution (tt-xla compiles Wan's DiT at level 1 too). A DiT's only conv3d is its patch embedding, which
# the ``patch_embed`` rewrite turns into a Linear; the VAE is all conv3d and holds no attention composite.
_LEVEL_1_FOR = 'stablehlo.composite "tenstorrent.scaled_dot_product_attention"'
_CONV3D = re.compile(r"stablehlo\.convolution[^\n]*dim_numbers = \[[^\]]*\b2\b")  # a third spatial dim


def compile_options(module: Path) -> tuple[dict[str, str], str]:
    """The tt-xla compile options a Shardy module is compiled with, and why not level 1 where the module
    hands over fused attention but holds an op level 1 refuses ("" otherwise)."""
    text = Path(module).read_text()
    if _LEVEL_1_FOR not in text:
        return {"optimization_level": "0"}, ""
    if _CONV3D.search(text):
        why = (
            "a 3-D convolution (level 1 refuses ttnn.conv3d: not linked in this libtt build), so fused attention "
            "is decomposed at level 0; the patch_embed rewrite turns the DiT's patch embedding into a Linear"
        )
        return {"optimization_level": "0"}, why
    return {"optimization_level": "1"}, ""


def check_programs(
    programs: Mapping[str, Path],
    predicted: Mapping[str, Iterable[Collective]],
    system: str,
    mesh: MeshSpec,
    out_dir: Path,
    planned_bytes: Optional[Mapping[str, int]] = None,
    attentions: Optional[Mapping[str, Iterable[Site]]] = None,
    scores_priced: Iterable[str] = (),
    unannotated: Iterable[str] = (),
    kernels: Optional[Mapping[str, Mapping[int, Kernels]]] = None,
) -> list[ProgramCheck]:
    """Compile each program (name -> its ``.tt.mlir``) for `system`; compare with `predicted` (name ->
    the target's predicted collectives, absent = none), all on `mesh`: the chips' mesh (the plan's
    user mesh; `on_device` names a refined plan mesh's collectives by it), and each program's DRAM per
    chip (`ttnn.memory`) with `planned_bytes` (name -> the planner's per-device estimate). `attentions`:
    name -> the program's attention calls (`wancompile.composites.Site`): a score matrix of one handed
    over fused refuses the program, unless it is one of `scores_priced` (its planner prices its attention's
    score matrices: the VAE's, `wancompile.vae.budget`). Where the export named the module's arguments (``.arguments.json``
    beside it), the TTNN ops are counted by part of the model (`parts.by_part`); for those of `unannotated`,
    the same module with the plan taken out is compiled too and each part's fused kernels and moves held
    against it (`parts.pin_costs`); `kernels`: name -> block index -> the kernels predicted per call, held
    against each compiled block's (`ProgramCheck.kernels`)."""
    env.require()
    desc = env.system_path(system)
    out: list[ProgramCheck] = []
    for name, module in programs.items():
        options, why = compile_options(module)
        r, failure = env.compile_program(module, desc, Path(out_dir) / f"{name}.{system}", options)
        if r is not None and r.get("level_0_because"):  # the worker compiled at level 0: the chips need it
            options, why = r["options"], r["level_0_because"]
        compiled_with = dict(
            options=options, level_0_because=why, stand_in=StandIn.from_json(r.get("stand_in")) if r else None
        )
        if r is None or not r["ok"]:
            seconds, peak = (r["seconds"], int(r.get("peak_rss_bytes", 0))) if r else (0.0, 0)
            out.append(ProgramCheck(name, system, False, failure, seconds, compiler_peak_bytes=peak, **compiled_with))
            continue
        text = Path(r["ttnn"]).read_text()
        observed = ttnn.parse_collectives(text, mesh)
        names = _argument_names(module)
        scores, unfused = _scores(text, (attentions or {}).get(name, ()), mesh, names)
        priced = name in set(scores_priced)
        costs, bare_error = (), ""
        if name in set(unannotated) and names is not None:
            costs, bare_error = _pin_costs(
                module, text, names, desc, Path(out_dir) / f"{name}.{system}.unannotated", options
            )
        out.append(
            ProgramCheck(
                name,
                system,
                True,
                "",
                r["seconds"],
                tuple(compare_collectives(predicted.get(name, ()), observed)),
                ttnn.local_slices(text),
                ttnn.perf_metrics(r["metrics"]),
                r["ttnn"],
                ttnn.memory(text),
                (planned_bytes or {}).get(name),
                int(r.get("peak_rss_bytes", 0)),
                options,
                why,
                _parts(text, names),
                scores,
                () if priced else unfused,
                priced,
                costs,
                bare_error,
                r.get("parameter_arguments", 0),
                tuple(names[i][0] for i in r.get("unmarked_arguments", ())) if names else (),
                dict((kernels or {}).get(name, {})),
                stand_in=StandIn.from_json(r.get("stand_in")),
            )
        )
    return out


def _pin_costs(module: Path, pinned: str, names: list, desc: Path, export: Path, options) -> tuple[tuple, str]:
    """The module with its plan taken out (the worker's ``unannotated``), compiled with the same options, held
    against the pinned TTNN program per part (`parts.pin_costs`); or (), why it could not be compiled."""
    bare = Path(module).with_name(Path(module).name.replace(".tt.mlir", ".unannotated.tt.mlir"))
    res = env.run_worker(["unannotated", str(module), str(bare)])
    if res.returncode != 0:
        return (), f"the unannotated module could not be written: {env.worker_failure(res)}"
    r, failure = env.compile_program(bare, desc, export, options)
    if failure:
        return (), f"tt-mlir refused the unannotated module: {failure}"
    return parts.pin_costs(pinned, Path(r["ttnn"]).read_text(), names), ""


def _argument_names(module: Path) -> Optional[list[list[str]]]:
    """What the export wrote of the module's arguments (``<name>.arguments.json``), None if nothing."""
    path = Path(module).with_name(Path(module).name.split(".tt.mlir")[0] + ".arguments.json")
    return json.loads(path.read_text()) if path.exists() else None


def _parts(ttnn_text: str, names: Optional[list]) -> tuple[tuple[str, Mapping[str, int]], ...]:
    if names is None:
        return ()
    return tuple((part, dict(ops)) for part, ops in parts.by_part(ttnn_text, names))


def _scores(ttnn_text: str, sites: Iterable[Site], mesh: MeshSpec, names: Optional[list] = None) -> tuple[tuple, tuple]:
    """The program's L_q x L_k tensors (`parts.lq_lk_tensors`: score matrices and masks), and those of attention
    calls handed over fused."""
    sites = [s for s in sites if s.family == "attention" and s.lq]
    splits = {math.prod(c) for k in range(len(mesh.shape) + 1) for c in itertools.combinations(mesh.shape, k)}
    weights = frozenset(parts.from_parameters(ttnn_text, names)) if names is not None else frozenset()
    # the score matrices and every other L_q x L_k tensor (a mask repeated up to each chip's queries): a fused
    # attention is priced as one kernel that reads q, k and v alone
    found = parts.lq_lk_tensors(ttnn_text, {(s.lq, s.lk, s.head_dim) for s in sites}, splits, weights)
    fused = {(s.lq, s.lk) for s in sites if not s.why_not}
    return tuple(found), tuple(x for x in found if (x.lq, x.lk) in fused)


def check_compiled(
    programs: Iterable,
    systems: Iterable[str],
    out_dir: Path,
    planned_bytes: Optional[Callable] = None,
    unannotated: bool = False,
) -> list[ProgramCheck]:
    """Every program the `ShardedProgram`s wrote for tt-mlir (main and fold), compiled for each system
    and compared with its plan's tt-mlir prediction (the fold program: none). `planned_bytes(program)`:
    the planner's DRAM per device for a main program (default: its plan's estimate for the whole model).
    `unannotated`: each main program also compiled without its plan, for what the pins cost (`parts.PinCost`)."""
    modules: dict[str, Path] = {}
    predicted: dict[str, list[Collective]] = {}
    planned: dict[str, int] = {}
    attentions: dict[str, tuple[Site, ...]] = {}
    kernels: dict[str, dict[int, Kernels]] = {}
    priced: set[str] = set()
    programs = list(programs)
    if not programs:
        raise RuntimeError("no program was written for tt-mlir (compile with target='tt-mlir' and a dump_dir)")
    for program in programs:
        sink = program.stablehlo_sink
        for which, path in sink.written.items():
            if path.suffix != ".mlir":
                raise RuntimeError(f"{path} was not converted to Shardy form: {env.available(need_plugin=False)}")
            modules[sink.names[which]] = path
        plan = program.plan
        attentions[sink.names["main"]] = tuple(program.fused_sites)
        if program.kind == "wan-vae":  # its budget holds the mid-block attention's scores (wancompile.vae.budget)
            priced.add(sink.names["main"])
        elif plan.target == "tt-mlir" and plan.layers:
            kernels[sink.names["main"]] = plan_kernels(program.graph, plan)
        predicted[sink.names["main"]] = on_device(
            plan.predicted_by_partitioner()[plan.target], plan.mesh, plan.user_mesh
        )
        planned[sink.names["main"]] = (
            planned_bytes(program) if planned_bytes is not None else plan.predicted.memory_bytes_per_device
        )
    device = chip_mesh(programs[-1].plan.user_mesh)
    predicted = {k: on_device(v, programs[-1].plan.user_mesh, device) for k, v in predicted.items()}
    bare = list(predicted) if unannotated else []
    return [
        c
        for s in systems
        for c in check_programs(modules, predicted, s, device, out_dir, planned, attentions, priced, bare, kernels)
    ]
