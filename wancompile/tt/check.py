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

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional

from planner.collective import Collective
from planner.mesh import MeshSpec
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

    @property
    def memory_ratio(self) -> Optional[float]:
        """TTNN's peak DRAM per chip / the planner's estimate."""
        if self.memory is None or not self.planned_bytes:
            return None
        return self.memory.peak_bytes / self.planned_bytes

    @property
    def as_predicted(self) -> bool:
        return self.compiled and all(m.count_ok for m in self.matches)

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
) -> list[ProgramCheck]:
    """Compile each program (name -> its ``.tt.mlir``) for `system`; compare with `predicted` (name ->
    the target's predicted collectives, absent = none), all on `mesh`: the chips' mesh (the plan's
    user mesh; `on_device` names a refined plan mesh's collectives by it), and each program's DRAM per
    chip (`ttnn.memory`) with `planned_bytes` (name -> the planner's per-device estimate)."""
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
            )
        )
    return out


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
        predicted[sink.names["main"]] = on_device(
            plan.predicted_by_partitioner()[plan.target], plan.mesh, plan.user_mesh
        )
        planned[sink.names["main"]] = (
            planned_bytes(program) if planned_bytes is not None else plan.predicted.memory_bytes_per_device
        )
    device = chip_mesh(programs[-1].plan.user_mesh)
    predicted = {k: on_device(v, programs[-1].plan.user_mesh, device) for k, v in predicted.items()}
    return [c for s in systems for c in check_programs(modules, predicted, s, device, out_dir, planned)]


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
        if c.memory is not None:
            mem = c.memory
            vs = f"; planner's estimate {c.planned_bytes / 2**20:.2f} MiB" if c.planned_bytes else ""
            lines.append(
                f"  DRAM per chip (TTNN): peak {mem.peak_bytes / 2**20:.2f} MiB at {mem.peak_op} "
                f"({mem.peak_logical_bytes / 2**20:.2f} MiB of data, x{mem.tile_padding:.1f} in 32x32 tiles){vs}"
            )
        lines.append("  " + ("as predicted" if c.as_predicted else "NOT as predicted"))
    return "\n".join(lines)


@dataclass(frozen=True)
class ModelCheck:
    """`check_model`'s result: the plan, the CPU numerics of the same pinned plan, one check per program."""

    plan_summary: str
    pins: int
    constraints: int
    pcc: float
    max_abs: float
    checks: tuple[ProgramCheck, ...]

    @property
    def ok(self) -> bool:
        return all(c.as_predicted for c in self.checks)

    def to_json(self) -> dict:
        return {
            "plan": self.plan_summary,
            **_attrs(self, "pins", "constraints", "pcc", "max_abs", "ok"),
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
) -> ModelCheck:
    """Compile `model`'s `component` (a tiny random-weight config) with ``target="tt-mlir"`` on
    ``mesh.size`` virtual CPU devices, run it once (numerics against eager fp32: the pinned plan on
    GSPMD), then compile every program the call wrote through tt-mlir for each system. `dtype`: the DiT
    as a pipeline loads it in that dtype (`wancompile.models.as_loaded`; inputs likewise), its numerics still
    against eager fp32. Starts the XLA runtime: call it in a process where it has not started."""
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
        from wancompile.models import build_transformer, transformer_inputs

        options["cfg_parallel"] = cfg_parallel
        from wancompile.models import as_loaded

        module = build_transformer(model)
        inputs = transformer_inputs(model, "tiny", frames, batch=batch)
        with torch.no_grad():
            eager = module(**inputs, return_dict=False)[0]  # fp32: the reference in every dtype
        if dtype != "float32":
            module = as_loaded(module, getattr(torch, dtype))
            inputs = {k: v.to(getattr(torch, dtype)) if v.is_floating_point() else v for k, v in inputs.items()}
        compiled = torch.compile(module, backend="wan_autoshard", options=options, fullgraph=True)
        with torch.no_grad():
            out = compiled(**inputs, return_dict=False)[0].float()
    result = numerics(out, eager)
    programs = [p for p in recent_programs() if p.stablehlo_sink is not None and p.stablehlo_sink.written]
    checks = check_compiled(programs, systems, out_dir)
    plan = programs[-1].plan
    return ModelCheck(plan.summary(), pin_count(plan), len(plan.activations), result.pcc, result.max_abs, tuple(checks))
