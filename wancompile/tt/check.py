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
from wancompile.composites import Site
from wancompile.tt import env, ttnn
from wancompile.tt.mesh import chip_mesh, system_for  # noqa: F401  (system_for: re-exported)
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
    # the TTNN ops of @main by part of the model, in program order (`ttnn.by_part`): ("blocks.0", {op: n})
    parts: tuple[tuple[str, Mapping[str, int]], ...] = ()
    # attention score matrices in the program (`ttnn.score_matrices`), and those of an attention handed
    # over as fused attention (predicted as one kernel that never writes them): those refuse the program
    score_matrices: tuple[ttnn.ScoreMatrix, ...] = ()
    unfused_scores: tuple[ttnn.ScoreMatrix, ...] = ()
    scores_priced: bool = False  # its planner prices its attention's score matrices (the VAE's)

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
        return tuple(p for p in self.parts if p[0] not in (ttnn.PROLOGUE, ttnn.EPILOGUE))

    def to_json(self) -> dict:
        return {
            **_attrs(self, "program", "system", "compiled", "error", "seconds", "as_predicted", "compiler_peak_bytes"),
            "options": dict(self.options),
            "level_0_because": self.level_0_because,
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
                {**_attrs(x, "value", "op", "type", "bytes", "lq", "lk"), "fused_predicted": x in self.unfused_scores}
                for x in self.score_matrices
            ],
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
) -> list[ProgramCheck]:
    """Compile each program (name -> its ``.tt.mlir``) for `system`; compare with `predicted` (name ->
    the target's predicted collectives, absent = none), all on `mesh`: the chips' mesh (the plan's
    user mesh; `on_device` names a refined plan mesh's collectives by it), and each program's DRAM per
    chip (`ttnn.memory`) with `planned_bytes` (name -> the planner's per-device estimate). `attentions`:
    name -> the program's attention calls (`wancompile.composites.Site`): a score matrix of one handed
    over fused refuses the program, unless it is one of `scores_priced` (its planner prices its attention's
    score matrices: the VAE's, `wancompile.vae.budget`). Where the export named the module's arguments (``.arguments.json``
    beside it), the TTNN ops are counted by part of the model (`ttnn.by_part`)."""
    env.require()
    desc = env.system_path(system)
    out: list[ProgramCheck] = []
    for name, module in programs.items():
        export = Path(out_dir) / f"{name}.{system}"
        options, why = compile_options(module)
        compiled_with = dict(options=options, level_0_because=why)
        res = env.run_worker(["compile", str(module), str(desc), str(export), json.dumps(options)])
        line = next((x for x in res.stdout.splitlines() if x.startswith("TT-CHECK ")), None)
        if line is None:
            out.append(ProgramCheck(name, system, False, _process_failure(res), **compiled_with))
            continue
        r = json.loads(line[len("TT-CHECK ") :])
        peak = int(r.get("peak_rss_bytes", 0))
        if not r["ok"]:
            out.append(
                ProgramCheck(name, system, False, r["error"], r["seconds"], compiler_peak_bytes=peak, **compiled_with)
            )
            continue
        text = Path(r["ttnn"]).read_text()
        observed = ttnn.parse_collectives(text, mesh)
        names = _argument_names(module)
        scores, unfused = _scores(text, (attentions or {}).get(name, ()), mesh, names)
        priced = name in set(scores_priced)
        unfused = () if priced else unfused
        out.append(
            ProgramCheck(
                name,
                system,
                True,
                "",
                r["seconds"],
                tuple(compare_collectives(predicted.get(name, ()), observed)),
                ttnn.local_slices(text),
                _metrics(r["metrics"]),
                r["ttnn"],
                ttnn.memory(text),
                (planned_bytes or {}).get(name),
                peak,
                options,
                why,
                _parts(text, names),
                scores,
                unfused,
                priced,
            )
        )
    return out


def _argument_names(module: Path) -> Optional[list[list[str]]]:
    """What the export wrote of the module's arguments (``<name>.arguments.json``), None if nothing."""
    path = Path(module).with_name(Path(module).name.split(".tt.mlir")[0] + ".arguments.json")
    return json.loads(path.read_text()) if path.exists() else None


def _parts(ttnn_text: str, names: Optional[list]) -> tuple[tuple[str, Mapping[str, int]], ...]:
    if names is None:
        return ()
    return tuple((part, dict(ops)) for part, ops in ttnn.by_part(ttnn_text, names))


def _scores(ttnn_text: str, sites: Iterable[Site], mesh: MeshSpec, names: Optional[list] = None) -> tuple[tuple, tuple]:
    """The program's attention score matrices, and those of attention calls handed over fused."""
    sites = [s for s in sites if s.family == "attention" and s.lq]
    splits = {math.prod(c) for k in range(len(mesh.shape) + 1) for c in itertools.combinations(mesh.shape, k)}
    weights = frozenset(ttnn.from_parameters(ttnn_text, names)) if names is not None else frozenset()
    found = ttnn.score_matrices(ttnn_text, {(s.lq, s.lk, s.head_dim) for s in sites}, splits, weights)
    fused = {(s.lq, s.lk) for s in sites if not s.why_not}
    return tuple(found), tuple(x for x in found if (x.lq, x.lk) in fused)


# the lines of a compiler's log that say what went wrong (its log is mostly "info" lines)
_FAILURE = re.compile(r"error|fatal|critical|TT_THROW|Segmentation|Aborted", re.IGNORECASE)


def _process_failure(res) -> str:
    """What a compiler process that printed no result died of: its exit (a signal by name) and the last
    line of its log that names a failure (else its last line)."""
    import signal

    rc = res.returncode
    how = f"exit {rc}"
    if rc < 0:
        try:
            how = f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            pass
    lines = (res.stderr or res.stdout or "").strip().splitlines()
    said = next((x for x in reversed(lines) if _FAILURE.search(x)), lines[-1] if lines else "no output")
    return f"the compiler process failed ({how}): {said.strip()}"


def _metrics(path: Optional[str]) -> dict[str, float]:
    if not path:
        return {}
    data = json.loads(Path(path).read_text())
    summary = data.get("summary", {})
    return {
        "total_flops": float(data.get("flops", {}).get("total_flops", 0)),
        "total_ops": float(summary.get("total_ops", 0)),
        "spilled_percentage": float(summary.get("spilled_percentage", 0)),
    }


def check_compiled(
    programs: Iterable, systems: Iterable[str], out_dir: Path, planned_bytes: Optional[Callable] = None
) -> list[ProgramCheck]:
    """Every program the `ShardedProgram`s wrote for tt-mlir (main and fold), compiled for each system
    and compared with its plan's tt-mlir prediction (the fold program: none). `planned_bytes(program)`:
    the planner's DRAM per device for a main program (default: its plan's estimate for the whole model)."""
    modules: dict[str, Path] = {}
    predicted: dict[str, list[Collective]] = {}
    planned: dict[str, int] = {}
    attentions: dict[str, tuple[Site, ...]] = {}
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
        predicted[sink.names["main"]] = on_device(
            plan.predicted_by_partitioner()[plan.target], plan.mesh, plan.user_mesh
        )
        planned[sink.names["main"]] = (
            planned_bytes(program) if planned_bytes is not None else plan.predicted.memory_bytes_per_device
        )
    device = chip_mesh(programs[-1].plan.user_mesh)
    predicted = {k: on_device(v, programs[-1].plan.user_mesh, device) for k, v in predicted.items()}
    return [
        c for s in systems for c in check_programs(modules, predicted, s, device, out_dir, planned, attentions, priced)
    ]


def format_checks(checks: Iterable[ProgramCheck]) -> str:
    lines = []
    for c in checks:
        head = (
            f"{c.program} on {c.system}: "
            + (f"compiled in {c.seconds:.1f} s" if c.compiled else f"REFUSED: {c.error}")
            + "".join(f" ({k} {v})" for k, v in c.options.items())
            + (f": level 0 because of {c.level_0_because}" if c.level_0_because else "")
        )
        lines.append(head)
        if not c.compiled:
            continue
        for m in c.matches:
            ok = "" if m.count_ok else "   <-- differs"
            lines.append(
                f"  {m.kind:18} {'+'.join(m.axes) or '-':12} predicted {m.predicted_count:4} / TTNN {m.observed_count:4}{ok}"
            )
        if not c.matches:
            lines.append("  no collectives predicted, none in TTNN")
        m = c.metrics
        if m:
            lines.append(
                f"  TTNN: {c.local_slices} local slices (mesh_partition); perf metrics: {m['total_flops']:.3g} FLOPs "
                f"per chip, {m['total_ops']:.0f} ops ({m['spilled_percentage']:.0f}% spilled to DRAM)"
            )
        lines.extend(_format_parts(c.parts))
        lines.extend(_format_scores(c))
        if c.memory is not None:
            mem = c.memory
            vs = f"; planner's estimate {c.planned_bytes / 2**20:.2f} MiB" if c.planned_bytes else ""
            lines.append(
                f"  DRAM per chip (TTNN): peak {mem.peak_bytes / 2**20:.2f} MiB at {mem.peak_op} "
                f"({mem.peak_logical_bytes / 2**20:.2f} MiB of data, x{mem.tile_padding:.1f} in 32x32 tiles){vs}"
            )
        lines.append("  " + ("as predicted" if c.as_predicted else "NOT as predicted"))
    return "\n".join(lines)


def _format_scores(c: ProgramCheck) -> list[str]:
    """One line per kind of score matrix found: its type, how many, and whether it refuses the program."""
    seen: dict[tuple, int] = {}
    for x in c.score_matrices:
        key = (x.type, x.op, x.bytes, x.lq, x.lk, x in c.unfused_scores)
        seen[key] = seen.get(key, 0) + 1
    out = []
    for (kind, op, nbytes, lq, lk, refused), n in seen.items():
        verdict = (
            "REFUSED: handed over as fused attention, priced as one kernel that never writes it"
            + (f" (compiled at level 0: {c.level_0_because})" if c.level_0_because else "")
            if refused
            else "priced by the planner (its memory holds the scores)"
            if c.scores_priced
            else "not handed over as fused attention (an fp32 attention, or fused_ops off)"
        )
        out.append(
            f"  {n} x score matrix {kind} ({op}, {nbytes / 2**20:.2f} MiB per chip) of an attention with "
            f"L_q {lq}, L_k {lk}: {verdict}"
        )
    return out


def _ops(ops: Mapping[str, int], top: int = 8) -> str:
    shown = sorted(((n, k) for k, n in ops.items() if k != "ttnn.deallocate"), reverse=True)
    head = ", ".join(f"{k.removeprefix('ttnn.')} {n}" for n, k in shown[:top])
    return f"{sum(ops.values())} ops: {head}" + (", ..." if len(shown) > top else "")


def _format_parts(parts) -> list[str]:
    """The per-part histogram: identical blocks once, with their count."""
    out, k = [], 0
    while k < len(parts):
        name, ops = parts[k]
        same = 1
        while name not in (ttnn.PROLOGUE, ttnn.EPILOGUE) and k + same < len(parts) and parts[k + same][1] == ops:
            same += 1
        label = name if same == 1 else f"{name}..{parts[k + same - 1][0]} (each)"
        out.append(f"  TTNN {label}: {_ops(ops)}")
        k += same
    return out


@dataclass(frozen=True)
class ModelCheck:
    """`check_model`'s result: the plan, the CPU numerics of the same pinned plan, one check per program."""

    plan_summary: str
    pins: int
    constraints: int
    pcc: float
    max_abs: float
    checks: tuple[ProgramCheck, ...]
    # eager in the model's dtype against eager fp32 (1.0 and 0 for fp32): the error the dtype itself costs
    eager_pcc: float = 1.0
    eager_max_abs: float = 0.0

    @property
    def ok(self) -> bool:
        return all(c.as_predicted for c in self.checks)

    def to_json(self) -> dict:
        return {
            "plan": self.plan_summary,
            **_attrs(self, "pins", "constraints", "pcc", "max_abs", "eager_pcc", "eager_max_abs", "ok"),
            "programs": [c.to_json() for c in self.checks],
        }


def check_model(
    model: str,
    mesh: MeshSpec,
    systems: Iterable[str],
    out_dir: Path,
    *,
    component: str = "transformer",
    plan: Optional[str] = None,
    memory_gb: Optional[float] = None,
    rewrites: str = "none",
    frames: int = 9,
    batch: int = 1,
    cfg_parallel: str = "auto",
    hardware: Optional[str] = None,
    t_chunk: Optional[int] = None,
    dtype: str = "float32",
    tightest: bool = False,
) -> ModelCheck:
    """Compile `model`'s `component` (a tiny random-weight config: ``tiny``, a Wan-family DiT of
    `wancompile.models.FAMILIES` such as ``wan-i2v`` or ``wan-ti2v`` with its example inputs, or a VAE) with ``target="tt-mlir"`` on
    ``mesh.size`` virtual CPU devices, run it once (numerics against eager fp32: the pinned plan on
    GSPMD), then compile every program the call wrote through tt-mlir for each system. `dtype`: the DiT
    as a pipeline loads it in that dtype (`wancompile.models.as_loaded`; inputs likewise), its numerics still
    against eager fp32. `tightest`: a DiT planned at the smallest budget the planner accepts on `mesh`
    (`MemoryBudgetError.need_gb`), as the fuzz's ``min`` cases. Starts the XLA runtime: call it in a process
    where it has not started."""
    import torch

    from planner.pins import pin_count
    from wancompile import runtime

    out_dir = Path(out_dir)
    env.require()
    for old in [*out_dir.glob("*.mlirbc"), *out_dir.glob("*.tt.mlir")]:  # a reused --out: this call's programs only
        old.unlink()
    runtime.configure(num_devices=mesh.size, dump_dir=out_dir / "hlo")
    from wancompile.programs import recent_programs
    from wancompile.verify import numerics

    options = {"mesh": str(mesh), "target": "tt-mlir", "dump_dir": str(out_dir), "rewrites": rewrites}
    options.update({k: v for k, v in (("plan", plan), ("memory_gb", memory_gb), ("hardware", hardware)) if v})
    if component == "vae":
        import wancompile.vae as wvae
        from wancompile.vae.configs import VAE_CONFIGS, build_vae

        vae = wvae.enable_full_t(build_vae(model), t_chunk=t_chunk)
        z_dim = VAE_CONFIGS[model]["z_dim"]
        z = torch.randn(1, z_dim, 3, 8, 8, generator=torch.Generator().manual_seed(0))
        # chunked-T decodes one graph per chunk shape (its driver loop stays in Python)
        compiled = torch.compile(vae.decode, backend="wan_autoshard", options=options, fullgraph=t_chunk is None)
        with torch.no_grad():
            out = compiled(z).sample
            eager = vae.decode(z).sample
    else:
        from wancompile.models import FAMILIES, as_loaded, build_family, build_transformer, transformer_inputs

        options["cfg_parallel"] = cfg_parallel
        if model in FAMILIES:  # a Wan-family DiT (wan-i2v, wan-ti2v, ...) with its own example inputs
            module, inputs = build_family(model)
        else:
            module = build_transformer(model)
            inputs = transformer_inputs(model, "tiny", frames, batch=batch)
        with torch.no_grad():
            eager = module(**inputs, return_dict=False)[0]  # fp32: the reference in every dtype
        if dtype != "float32":
            module = as_loaded(module, getattr(torch, dtype))
            inputs = {k: _cast(v, getattr(torch, dtype)) for k, v in inputs.items()}
        if tightest:
            options["memory_gb"] = _tightest(module, inputs, options)
        compiled = torch.compile(module, backend="wan_autoshard", options=options, fullgraph=True)
        with torch.no_grad():
            out = compiled(**inputs, return_dict=False)[0].float()
            if dtype != "float32":  # the error the dtype itself costs: eager in it, against eager fp32
                in_dtype = numerics(module(**inputs, return_dict=False)[0].float(), eager)
    result = numerics(out, eager)
    programs = [p for p in recent_programs() if p.stablehlo_sink is not None and p.stablehlo_sink.written]
    checks = check_compiled(programs, systems, out_dir)
    plan = programs[-1].plan
    eager_pcc, eager_max_abs = (
        (in_dtype.pcc, in_dtype.max_abs) if dtype != "float32" and component != "vae" else (1.0, 0.0)
    )
    return ModelCheck(
        plan.summary(),
        pin_count(plan),
        len(plan.activations),
        result.pcc,
        result.max_abs,
        tuple(checks),
        eager_pcc,
        eager_max_abs,
    )


def _cast(value, dtype):
    """A floating-point input tensor in `dtype`; anything else as it is."""
    import torch

    return value.to(dtype) if isinstance(value, torch.Tensor) and value.is_floating_point() else value


def _tightest(module, inputs: dict, options: dict) -> float:
    """The smallest per-device budget (GB) the planner accepts for `module` under `options`: what it names
    when asked to plan within none."""
    import torch

    from planner.errors import MemoryBudgetError

    try:
        with torch.no_grad():
            torch.compile(module, backend="wan_autoshard", options={**options, "memory_gb": 1e-9}, fullgraph=True)(
                **inputs, return_dict=False
            )
    except Exception as e:  # the planner's error, out of dynamo's BackendCompilerFailed
        inner = getattr(e, "inner_exception", None) or e
        if isinstance(inner, MemoryBudgetError):
            torch._dynamo.reset()
            return inner.need_gb
        raise
    raise RuntimeError("a 1e-9 GB budget planned: the model holds no parameters to budget")
