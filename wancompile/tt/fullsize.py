"""Full-width programs through tt-mlir without running them: ``wancompile tt-check --blocks N``.

A full-size Wan DiT does not run on this machine, and tt-mlir needs only its program. `check_full_size`:

1. captures a model of `blocks` blocks at full width on the meta device, in the dtype a pipeline loads it
   (`wancompile.models.as_loaded`: bf16 but the modules diffusers keeps in fp32);
2. plans it as the whole model (every block of the config, each expert's weight set resident) for
   target ``tt-mlir`` and the system's hardware profile — the plan ``wancompile plan`` would make;
3. lowers that plan on the captured graph through the backend, as a compile with ``plan=`` that file
   does (tt-mlir's pins and routes, the Shardy export);
4. puts the parameters on the device as data (uninitialised: nothing reads their values) and traces
   the main program without compiling or running it (`ShardedProgram.trace_only`);
5. compiles the programs through tt-mlir for each system (`wancompile.tt.check.check_compiled`): its
   collectives against the plan's, its DRAM per chip against the planner's estimate for the same
   program (`blocks` blocks, one weight set: `planner.forward.evaluate_forward`).

`FullSizeCheck` also says what it cost here: wall time per step and the peak host memory of this
process and of the compiler's.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

from planner.graph import Graph
from planner.mesh import MeshSpec
from planner.plan import Plan
from wancompile.tt import env
from wancompile.tt.check import ProgramCheck
from wancompile.tt.format import format_checks
from wancompile.tt.worker import peak_rss_bytes

log = logging.getLogger("wancompile")


@dataclass(frozen=True)
class FullSizeCheck:
    """`check_full_size`'s result."""

    model: str
    resolution: str
    frames: int
    tokens: int  # the DiT's tokens; the VAE's latent positions (T x H x W)
    blocks: int  # blocks in the compiled program (0: not a block model, the VAE)
    num_blocks: int  # blocks of the model the plan was made for (0: the VAE)
    weight_sets: int  # weight sets the plan keeps resident (A14B: its two experts)
    plan_summary: str
    planned_model_bytes: int  # the planner's estimate per device for the whole model
    seconds: dict  # step -> wall seconds here (capture, plan, lower, export, compile: as they ran)
    executions: int  # XLA programs run here while exporting: a fold program's, never the main program
    host_peak_bytes: int  # this process's peak resident memory
    compiler_peak_bytes: int  # the largest peak of the compiler's processes (one per program and system)
    checks: tuple[ProgramCheck, ...]

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.as_predicted and c.pins_clean for c in self.checks)

    def to_json(self) -> dict:
        return {
            **{k: v for k, v in self.__dict__.items() if k != "checks"},
            "ok": self.ok,
            "programs": [c.to_json() for c in self.checks],
        }

    def format(self) -> str:
        s = self.seconds
        return "\n".join(
            [
                self.plan_summary,
                f"  full size: {self.model} at {self.resolution}, {self.frames} frames ({self.tokens} tokens); "
                + (
                    f"program of {self.blocks} of {self.num_blocks} blocks, planned for all {self.num_blocks} with "
                    f"{self.weight_sets} weight set(s)"
                    if self.num_blocks
                    else "the whole decode in one program"
                )
                + f": {self.planned_model_bytes / 2**30:.2f} GiB per device",
                "  here: " + ", ".join(f"{k} {v:.0f} s" for k, v in s.items()) + f"; host peak "
                f"{self.host_peak_bytes / 2**30:.1f} GiB "
                f"(compiler {self.compiler_peak_bytes / 2**30:.1f} GiB); XLA programs run: {self.executions} "
                "(a fold program, if any; the main program is traced, never run)",
                format_checks(self.checks),
            ]
        )


class _Steps:
    """Wall seconds per step, each logged with the host's peak memory so far (``-v``)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._clock = time.perf_counter()

    def done(self, step: str) -> None:
        now = time.perf_counter()
        self.seconds[step], self._clock = now - self._clock, now
        log.info(
            "tt-check full size: %s %.1f s; host peak so far %.2f GiB",
            step,
            self.seconds[step],
            peak_rss_bytes() / 2**30,
        )


def _start(systems: Iterable[str], out_dir: Path, mesh: MeshSpec) -> tuple[list[str], Path]:
    """The compiler is there, `out_dir` holds no earlier call's programs, the runtime has the mesh's devices."""
    from wancompile import runtime

    env.require()
    out_dir = Path(out_dir)
    for old in [*out_dir.glob("*.mlirbc"), *out_dir.glob("*.tt.mlir")]:  # a reused --out: this call's programs only
        old.unlink()
    runtime.configure(num_devices=mesh.size)
    return list(systems), out_dir


def _options(
    mesh: MeshSpec,
    system: str,
    hardware: Optional[str],
    memory_gb: Optional[float],
    rewrites: Optional[tuple[str, ...]] = None,
    **more,
) -> dict:
    """The backend's options for a full-size check: target tt-mlir, priced as `hardware` (default: the
    first system's profile), nothing run to verify; `rewrites` None: the target's default."""
    out = {"mesh": str(mesh), "target": "tt-mlir", "verify": False, **more}
    if rewrites is not None:
        out["rewrites"] = list(rewrites) or "none"
    out["hardware"] = hardware or env.SYSTEM_PROFILES.get(system)
    if memory_gb is not None:
        out["memory_gb"] = memory_gb
    return {k: v for k, v in out.items() if v is not None}


def _finish(
    names: dict, program, planned_model_bytes: int, steps: _Steps, ran: int, checks: list[ProgramCheck]
) -> FullSizeCheck:
    from planner.pins import pin_count

    plan = program.plan
    return FullSizeCheck(
        **names,
        plan_summary=plan.summary() + f"\n  pinned for tt-mlir: {pin_count(plan)} pins",
        planned_model_bytes=planned_model_bytes,
        seconds=steps.seconds,
        executions=ran,
        host_peak_bytes=peak_rss_bytes(),
        compiler_peak_bytes=max((c.compiler_peak_bytes for c in checks), default=0),
        checks=tuple(checks),
    )


@dataclass(frozen=True)
class PlannedBlocks:
    """The first blocks of a full-size DiT, captured on the meta device and planned for the whole model."""

    module: Any  # the model of `blocks` blocks, on the meta device, as a pipeline loads it
    gm: Any  # its FX graph as dynamo hands it to the backend
    graph: Graph  # the rewritten graph the plan is made on
    plan: Plan  # the plan for every block of the model
    cut: Plan  # that plan cut to the captured blocks, with their collectives (`Plan.first_blocks`)
    options: dict  # the backend's options for it
    names: dict  # model, resolution, frames, tokens, blocks, num_blocks, weight_sets: what the report names
    dtype: str


def plan_first_blocks(
    model: str,
    mesh: MeshSpec,
    system: str,
    *,
    blocks: int = 2,
    resolution: str = "720p",
    frames: int = 81,
    dtype: str = "bfloat16",
    hardware: Optional[str] = None,
    memory_gb: Optional[float] = None,
    weight_sets: Optional[int] = None,
    rewrites: Optional[tuple[str, ...]] = None,
    steps: Optional[_Steps] = None,
) -> PlannedBlocks:
    """Steps 1 and 2 of the module docstring: `blocks` blocks of the full-size `model` captured at `resolution`
    on the meta device in `dtype`, planned for `system` (target tt-mlir) as a model of all its blocks, and the
    plan cut to them. `hardware`: the cost-model profile (default: `system`'s); `weight_sets`: default 2 for the
    A14B experts; `rewrites`: the backend's passes, run before planning as the backend runs them (None: tt-mlir's
    default, every pass: ``patch_embed`` keeps the program free of conv3d, so that fused attention is compiled at
    optimization_level 1); `steps` times the capture and the plan."""
    import torch

    from planner.pins import graph_collectives
    from wancompile.backend import rewrite_graph
    from wancompile.capture import annotate, capture_fx
    from wancompile.models import as_loaded, build_transformer, get_model, transformer_inputs
    from wancompile.options import Options
    from wancompile.planning import HeadPadder, request_for, solve

    spec = get_model(model)
    tokens = spec.tokens(resolution, frames)  # checks resolution and frames before anything slow
    num_blocks = spec.transformer["num_layers"]
    if not 1 <= blocks <= num_blocks:
        raise ValueError(f"blocks must be 1..{num_blocks} for {model}; got {blocks}")
    sets = weight_sets if weight_sets is not None else (2 if "a14b" in model else 1)
    dt = getattr(torch, dtype)
    module = as_loaded(build_transformer(model, device="meta", num_layers=blocks), dt)
    gm = capture_fx(module, **transformer_inputs(model, resolution, frames, device="meta", dtype=dt), return_dict=False)
    if steps is not None:
        steps.done("capture")
    options = _options(mesh, system, hardware, memory_gb, rewrites, weight_sets=sets)
    opts = Options.from_user(options)
    request = request_for(opts, mesh, num_blocks=num_blocks)
    rewritten, records = rewrite_graph(gm, request, *opts.rewrites_for(request.target))
    graph = annotate(rewritten, model=model)
    request = request.variant(pad_heads=HeadPadder(rewritten, graph))
    plan = solve(graph, request).with_(target="tt-mlir", rewrites=records)
    cut = plan.first_blocks(blocks)
    cut = cut.with_(collectives=graph_collectives(graph, cut))  # the collectives of these blocks alone
    if steps is not None:
        steps.done("plan")
    names = dict(model=model, resolution=resolution, frames=frames, tokens=tokens, blocks=blocks)
    names |= dict(num_blocks=num_blocks, weight_sets=sets)
    return PlannedBlocks(module, gm, graph, plan, cut, options, names, dtype)


def check_full_size(
    model: str, mesh: MeshSpec, systems: Iterable[str], out_dir: Path, *, unannotated: bool = False, **planning
) -> FullSizeCheck:
    """Compile the first blocks of the full-size `model` (a ``wancompile.models`` config) through tt-mlir for each
    of `systems`, planned for the whole model (module docstring) as `plan_first_blocks` plans them for the first
    system (`planning`: its keywords). `unannotated`: the program also compiled with its plan taken out
    (`wancompile.tt.parts.PinCost`). Starts the XLA runtime: call it in a process where it has not started."""
    import torch

    from planner.forward import evaluate_forward
    from planner.plan import save_plan
    from wancompile.backend import wan_autoshard
    from wancompile.models import get_model, transformer_inputs
    from wancompile.tt.check import check_compiled

    planning.setdefault("resolution", "720p")
    get_model(model).tokens(planning["resolution"], planning.get("frames", 81))  # before anything slow
    systems, out_dir = _start(systems, out_dir, mesh)
    steps = _Steps()
    p = plan_first_blocks(model, mesh, systems[0], steps=steps, **planning)
    blocks = p.names["blocks"]
    save_plan(p.plan, out_dir / f"plan-{p.names['num_blocks']}-blocks.json")
    saved = save_plan(p.cut, out_dir / f"plan-first-{blocks}-blocks.json")

    program = wan_autoshard(p.gm, [], options={**p.options, "plan": str(saved), "dump_dir": str(out_dir)})
    steps.done("lower")
    inputs = transformer_inputs(model, p.names["resolution"], p.names["frames"], dtype=getattr(torch, p.dtype))
    ran = _trace(program, p.gm, p.module, inputs)
    steps.done("export")

    planned = evaluate_forward(program.graph, program.plan, program.plan.hardware, num_blocks=blocks).memory_bytes
    checks = check_compiled([program], systems, out_dir, planned_bytes=lambda _: int(planned), unannotated=unannotated)
    steps.done("compile")
    return _finish(p.names, program, p.plan.predicted.memory_bytes_per_device, steps, ran, checks)


# a full-size VAE -> the DiT whose latents it decodes (their latent grid: `WanModel.latent_shape`)
VAE_LATENTS = {"wan2.1": "wan2.2-t2v-a14b", "wan2.2": "wan2.2-ti2v-5b"}


def check_full_size_vae(
    vae: str,
    mesh: MeshSpec,
    systems: Iterable[str],
    out_dir: Path,
    *,
    resolution: str = "480p",
    frames: int = 81,
    hardware: Optional[str] = None,
    memory_gb: Optional[float] = None,
    rewrites: Optional[tuple[str, ...]] = None,
) -> FullSizeCheck:
    """The full-size `vae` (``wan2.1`` | ``wan2.2``) decoding a whole clip in one pass (full-T), fp32 as
    Wan pipelines load their VAE, planned by the backend for target tt-mlir and traced without running,
    then compiled through tt-mlir for each of `systems` (as `check_full_size`; the estimate beside TTNN's
    is the plan's own: the program is the whole decode). `rewrites`: as the backend's option (None: its default)."""
    import torch

    import wancompile.vae as wvae
    from wancompile.backend import wan_autoshard
    from wancompile.capture import capture_fx
    from wancompile.models import get_model
    from wancompile.tt.check import check_compiled
    from wancompile.vae.configs import VAE_CONFIGS, build_vae

    t, h, w = get_model(VAE_LATENTS[vae]).latent_shape(resolution, frames)
    shape = (1, VAE_CONFIGS[vae]["z_dim"], t, h, w)
    systems, out_dir = _start(systems, out_dir, mesh)
    steps = _Steps()
    module = wvae.enable_full_t(build_vae(vae, device="meta"))
    gm = capture_fx(module.decode, torch.empty(shape, device="meta"))
    steps.done("capture")
    options = _options(mesh, systems[0], hardware, memory_gb, rewrites, dump_dir=str(out_dir))
    program = wan_autoshard(gm, [], options=options)
    steps.done("plan")  # and lower: the backend plans the decode itself
    ran = _trace(program, gm, module, {"z": torch.empty(shape)})
    steps.done("export")
    checks = check_compiled([program], systems, out_dir)
    steps.done("compile")
    names = dict(model=f"vae-{vae}", resolution=resolution, frames=frames, tokens=t * h * w)
    names |= dict(blocks=0, num_blocks=0, weight_sets=1)
    return _finish(names, program, program.plan.predicted.memory_bytes_per_device, steps, ran, checks)


def _trace(program, gm, module, inputs: dict) -> int:
    """Trace `program` (lowered from `gm`, captured from `module` on the meta device) for `inputs` without
    running it, the parameters given storage first (uninitialised: nothing reads them); returns the XLA
    programs run meanwhile (the fold program's)."""
    from wancompile import runtime
    from wancompile.capture import input_name, param_fqn

    module.to_empty(device="cpu")
    state = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    args = []
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            fqn = param_fqn(str(n.target))
            args.append(state[fqn] if fqn is not None else inputs[input_name(str(n.target)).rsplit(".", 1)[-1]])
    ran = runtime.executions()
    program.trace_only(*args)
    return runtime.executions() - ran
