"""One call to compile a diffusers Wan pipeline: its transformer(s) and its VAE decode.

`PIPELINES` lists the pipelines it takes: `WanPipeline` (text-to-video), `WanImageToVideoPipeline` (Wan 2.1
with its image encoder, Wan 2.2 without), `WanVideoToVideoPipeline`, `WanVACEPipeline`, `WanAnimatePipeline`,
SkyReels-V2's five (`SkyReelsV2Pipeline`, its image-to-video, and the diffusion-forcing text-, image- and
video-to-video ones) and `ChronoEditPipeline`; each by the attributes of its DiTs.

    import wancompile
    wancompile.compile_pipeline(pipe, mesh="2x4")            # then call pipe(...) as usual
    frames = pipe(prompt_embeds=..., negative_prompt_embeds=..., output_type="np").frames

What it does to `pipe` (everything else, and diffusers' denoising loop, stays as it is):

* ``pipe.transformer`` and ``pipe.transformer_2`` (when present) become
  ``torch.compile(module, backend="wan_autoshard", options=...)`` with ``weight_sets`` = the number of
  transformers, so the planner's memory budget holds every resident expert. The two Wan 2.2 experts
  have the same forward code, so dynamo hands the backend one graph for both (parameters are graph
  inputs): one plan (budgeted for both), one compiled program, and the constant-fold cache keeps one
  entry per expert (`wancompile.fold`), so switching experts re-folds nothing.
* ``pipe.vae.decode`` becomes the compiled full-T decode (`wancompile.enable_full_t`), chunked-T with
  ``vae=k``, or with ``vae="auto"`` full-T when the clip fits the memory budget and chunked-T with the
  chunk size `wancompile.vae.choose_t_chunk` picks otherwise, counting the VAE plan's spatial split once
  it is planned (see `_BudgetedDecode`).
* ``cfg_parallel=True`` (or "auto") wraps each transformer in `CFGBatched`: the classifier-free-guidance
  pair of one step (diffusers' ``cache_context("cond")`` call, then ``cache_context("uncond")``) runs as
  one batch-2 forward; the uncond call gets its cached half back. The backend's ``cfg_parallel`` option
  ("on" / "auto", `planner.cfg`) places the batch on the mesh. Calls it cannot batch (diffusion forcing's
  extra arguments, ChronoEdit's calls outside cache contexts) run as they are, compiled without it.

Calling it again first restores what it changed (`restore_pipeline`), so it is safe to call twice or
with other arguments. The pipe is returned; `compilation(pipe)` gives the `PipelineCompilation` record.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import torch

from wancompile.pipeline_cfg import CFGBatched, _capture_negative_prompt, _CFGState
from wancompile.pipeline_decode import _install_decode
from wancompile.pipeline_decode import resident_weight_bytes as resident_weight_bytes  # re-exported
from wancompile.pipeline_decode import spatial_split as spatial_split

log = logging.getLogger("wancompile")

TRANSFORMERS = ("transformer", "transformer_2")
# The diffusers pipelines `compile_pipeline` takes (by class name, matched along the MRO) -> the attributes
# holding their DiTs, in the order they are compiled; the first one's folder holds the backend's DiT dumps.
# A pipeline whose denoising loop calls its transformer(s) through these attributes needs only a row here.
PIPELINES: dict[str, tuple[str, ...]] = {
    "WanPipeline": TRANSFORMERS,  # text-to-video, Wan 2.1 (one DiT) and Wan 2.2 (two experts)
    "WanImageToVideoPipeline": TRANSFORMERS,  # Wan 2.1 I2V (image encoder) and Wan 2.2 I2V (two experts)
    "WanVideoToVideoPipeline": ("transformer",),
    "WanVACEPipeline": TRANSFORMERS,  # WanVACETransformer3DModel(s): the DiT with VACE context blocks
    "WanAnimatePipeline": ("transformer",),  # WanAnimateTransformer3DModel: motion encoder and face adapter
    # SkyReelsV2Transformer3DModel: the Wan DiT (blocks found by structure), plus the fps embedding and a
    # timestep per latent frame in the diffusion-forcing pipelines
    "SkyReelsV2Pipeline": ("transformer",),
    "SkyReelsV2ImageToVideoPipeline": ("transformer",),
    "SkyReelsV2DiffusionForcingPipeline": ("transformer",),
    "SkyReelsV2DiffusionForcingImageToVideoPipeline": ("transformer",),
    "SkyReelsV2DiffusionForcingVideoToVideoPipeline": ("transformer",),
    "ChronoEditPipeline": ("transformer",),  # ChronoEditTransformer3DModel: Wan 2.1 I2V DiT, temporal-skip RoPE
}
DIT_ONLY_OPTIONS = ("plan", "weight_sets")  # backend options given to the transformers only
_STATE_ATTR = "_wancompile_compilation"  # instance attribute of the pipeline holding its PipelineCompilation


@dataclass
class PipelineCompilation:
    """What `compile_pipeline` did to one pipeline, and what it needs to undo it."""

    options: dict[str, Any]  # backend options shared by every component
    transformers: tuple[str, ...]  # the pipeline attributes compiled ("transformer", ...)
    vae: Optional[Union[str, int]]  # "full", "auto", k (chunked-T), or None (left alone)
    cfg_parallel: bool
    originals: dict[str, Any] = field(default_factory=dict, repr=False)  # attribute -> module before compiling
    vae_before: Optional[tuple[bool, Optional[int]]] = field(default=None, repr=False)  # (full-T on, its t_chunk)
    cfg: Optional[_CFGState] = field(default=None, repr=False)
    decode: Any = field(default=None, repr=False)  # the compiled decode installed on pipe.vae
    dumps: Optional["_ExpertDumps"] = field(default=None, repr=False)  # dump_dir: one folder per expert

    before: list = field(default_factory=list, repr=False)  # the backend's recent programs when compiled

    def programs(self) -> list:
        """The DiT `ShardedProgram`s the backend compiled since `compile_pipeline` (newest last): this
        pipeline's transformers', unless other modules were compiled in between."""
        from wancompile.programs import Component, recent_programs

        return [p for p in recent_programs(Component.DIT) if not any(p is q for q in self.before)]


def compilation(pipe) -> Optional[PipelineCompilation]:
    """The `PipelineCompilation` of a pipeline `compile_pipeline` compiled, else None."""
    return pipe.__dict__.get(_STATE_ATTR)


def compile_pipeline(
    pipe,
    mesh: Any = None,
    hardware: Optional[str] = None,
    memory_gb: Optional[float] = None,
    *,
    vae: Optional[Union[str, int, bool]] = "auto",
    cfg_parallel: Union[bool, str] = False,
    dump_dir: Optional[Union[str, Path]] = None,
    fullgraph: bool = True,
    **options: Any,
):
    """Compile `pipe`'s transformer(s) and VAE decode with ``backend="wan_autoshard"``; returns `pipe`.

    Args:
        pipe: a diffusers `WanPipeline` (Wan 2.1 style, or Wan 2.2 with ``transformer_2``), or another
            pipeline of `PIPELINES` (image-to-video, video-to-video, VACE, Animate).
        mesh, hardware, memory_gb: the backend options of those names, for every component.
        vae: "auto" (full-T if it fits the memory budget, else chunked-T with the budget's chunk size),
            "full" (full-T), an int k (chunked-T, k latent frames per chunk), or None/False (leave the
            VAE alone).
        cfg_parallel: False/"off": two forwards per step, as diffusers runs them. True/"on": each step's
            cond + uncond forwards as one batch-2 forward (`CFGBatched`) with the batch split over a mesh
            axis (the backend's ``cfg_parallel="on"``, `planner.cfg`); "auto": batched, and the cost
            model chooses between the split and the whole mesh (about two sequential forwards' work).
        dump_dir: decision dumps (plan.json, plan.md, plan.html, graph.json, summary.txt) in one folder per
            component: ``dump_dir/transformer``, ``dump_dir/transformer_2`` (each expert's plan, written after
            its first forward; the same plan where the experts share one graph) and ``dump_dir/vae``. The
            DiT's HLO goes under ``dump_dir/transformer/hlo``.
        fullgraph: passed to `torch.compile` for the transformers (the Wan DiT captures in one graph).
        **options: further backend options (``rewrites``, ``verify``, ...) for every component; ``plan``
            and ``weight_sets`` (default: the number of transformers) go to the transformers only.
    """
    _check_pipeline(pipe)
    if vae is True:
        vae = "auto"
    if vae is False:
        vae = None
    if not (vae in (None, "auto", "full") or (isinstance(vae, int) and not isinstance(vae, bool) and vae >= 1)):
        raise ValueError(
            f"compile_pipeline: vae must be 'auto', 'full', a positive int (latent frames per chunk) or "
            f"None (leave the VAE alone), got {vae!r}"
        )
    from planner.cfg import normalize_mode

    try:  # True/"on": batch the pair and split it over a mesh axis; "auto": the cost model decides the split
        cfg_mode = normalize_mode(cfg_parallel)
    except ValueError:
        raise ValueError(
            f"compile_pipeline: cfg_parallel must be True/'on', False/'off' or 'auto', got {cfg_parallel!r}"
        ) from None
    if "cfg_parallel" in options:
        raise ValueError("compile_pipeline: pass cfg_parallel as compile_pipeline's own argument")
    if compilation(pipe) is not None:
        restore_pipeline(pipe)

    names = tuple(n for n in transformer_attributes(pipe) if getattr(pipe, n, None) is not None)
    opts = {k: v for k, v in dict(mesh=mesh, hardware=hardware, memory_gb=memory_gb).items() if v is not None}
    opts.update(options)
    from wancompile.options import Options

    Options.from_user({**opts, "weight_sets": opts.get("weight_sets", len(names) or 1)})  # bad options fail here
    from wancompile.programs import recent_programs

    state = PipelineCompilation(
        options=dict(opts), transformers=names, vae=vae, cfg_parallel=cfg_mode != "off", before=recent_programs()
    )
    dump = Path(dump_dir) if dump_dir is not None else None

    # One options dict for every transformer: equal options let the experts share one compiled graph.
    dit_opts = dict(opts, weight_sets=opts.get("weight_sets", len(names)))
    if cfg_mode != "off":
        dit_opts["cfg_parallel"] = cfg_mode  # the batch-2 graph's split, costed by planner.cfg
    if cfg_mode == "auto":  # `CFGBatched` can run the pair as two forwards: the planner may decide that
        dit_opts["cfg_pair_splittable"] = True
    if dump is not None:  # the backend's dumps (plan, HLO) of the DiT graph(s); `_ExpertDumps` adds one per expert
        dit_opts["dump_dir"] = str(dump / names[0] if names else dump / TRANSFORMERS[0])
        state.dumps = _ExpertDumps(dump, state)
    if state.cfg_parallel:
        state.cfg = _CFGState(cfg_mode)
        _capture_negative_prompt(pipe, state.cfg)
    # the calls `CFGBatched` does not batch (a pipeline passing more inputs, e.g. SkyReels-V2's diffusion
    # forcing, or one without cache contexts, e.g. ChronoEdit) are no CFG pair: planned without cfg_parallel
    plain_opts = {k: v for k, v in dit_opts.items() if k not in ("cfg_parallel", "cfg_pair_splittable")}
    for name in names:
        module = getattr(pipe, name)
        state.originals[name] = module
        compiled = torch.compile(module, backend="wan_autoshard", options=dit_opts, fullgraph=fullgraph)
        if state.dumps is not None:
            state.dumps.watch(name, compiled)
        if state.cfg_parallel:
            plain = torch.compile(module, backend="wan_autoshard", options=plain_opts, fullgraph=fullgraph)
            compiled = CFGBatched(compiled, module, state.cfg, plain=plain)
        setattr(pipe, name, compiled)

    if vae is not None:
        from wancompile.vae import installed_t_chunk, is_full_t_enabled

        state.vae_before = (True, installed_t_chunk(pipe.vae)) if is_full_t_enabled(pipe.vae) else (False, None)
        # `plan` (a DiT plan or "tt-xla") and `weight_sets` are the transformers' options; the VAE is planned
        # by the VAE planner and holds its own weights once.
        vae_opts = {k: v for k, v in opts.items() if k not in DIT_ONLY_OPTIONS}
        if dump is not None:
            vae_opts["dump_dir"] = str(dump / "vae")
        state.decode = _install_decode(pipe, vae, vae_opts, state)
    pipe.__dict__[_STATE_ATTR] = state
    log.info(
        "compile_pipeline: %s compiled (%s), vae=%s, cfg_parallel=%s",
        ", ".join(names) or "no transformer",
        opts,
        vae,
        cfg_parallel,
    )
    return pipe


def restore_pipeline(pipe):
    """Undo `compile_pipeline` on `pipe` (a no-op if it was not compiled); returns `pipe`."""
    state = compilation(pipe)
    if state is None:
        return pipe
    for name, module in state.originals.items():
        setattr(pipe, name, module)
    if state.dumps is not None:
        state.dumps.close()
    pipe.__dict__.pop("encode_prompt", None)
    if state.vae_before is not None:
        from wancompile.vae import disable_full_t, enable_full_t

        disable_full_t(pipe.vae)
        was_on, t_chunk = state.vae_before
        if was_on:
            enable_full_t(pipe.vae, t_chunk)
    del pipe.__dict__[_STATE_ATTR]
    return pipe


def transformer_attributes(pipe) -> tuple[str, ...]:
    """The attributes of `pipe` that hold its DiT(s) (`PIPELINES`), or () for a pipeline not in the table."""
    for cls in type(pipe).__mro__:
        if cls.__name__ in PIPELINES:
            return PIPELINES[cls.__name__]
    return ()


def _check_pipeline(pipe) -> None:
    if not transformer_attributes(pipe):
        raise TypeError(
            f"compile_pipeline expects a diffusers WanPipeline or another pipeline of wancompile.pipeline.PIPELINES "
            f"({', '.join(PIPELINES)}), got {type(pipe).__name__}; compile its transformer with "
            f"torch.compile(..., backend='wan_autoshard') instead"
        )
    missing = [a for a in ("vae", "encode_prompt") if not hasattr(pipe, a)]
    if missing:
        raise TypeError(f"compile_pipeline: the {type(pipe).__name__} has no {', '.join(missing)}")
    if all(getattr(pipe, n, None) is None for n in transformer_attributes(pipe)) and getattr(pipe, "vae", None) is None:
        raise ValueError(
            f"compile_pipeline: the pipeline has no {', '.join(transformer_attributes(pipe))} or vae to compile"
        )


class _ExpertDumps:
    """``dump_dir``: each expert's plan under ``dump_dir/<its attribute>``.

    The transformers share one options dict (so the experts share one compiled graph), hence one backend
    ``dump_dir``: the first expert's folder. Hooks on each compiled expert find the program that ran its
    first forward (compiled during it, or the one whose parameter cache holds the expert's weights) and
    write that program's dumps into the expert's folder; a later compile rewrites every expert's folder,
    since the backend's dump of a new graph lands in the first expert's."""

    def __init__(self, root: Path, state: PipelineCompilation) -> None:
        self.root, self.state = root, state
        self.programs: dict[str, Any] = {}  # expert attribute -> the program of its last dumped forward
        self.modules: dict[str, torch.nn.Module] = {}
        self.handles: list = []
        self._before: dict[str, set[int]] = {}  # expert -> ids of the programs before its forward
        self.first = next(iter(state.transformers), None)  # whose folder is the backend's dump_dir

    def watch(self, name: str, compiled: torch.nn.Module) -> None:
        self.modules[name] = self.state.originals[name]
        self.handles.append(compiled.register_forward_pre_hook(lambda *_: self._mark(name)))
        self.handles.append(compiled.register_forward_hook(lambda *_: self._record(name)))

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()

    def _mark(self, name: str) -> None:
        self._before[name] = {id(p) for p in self.state.programs()}

    def _record(self, name: str) -> None:
        programs = self.state.programs()
        before = self._before.pop(name, None)
        new = [p for p in programs if before is not None and id(p) not in before]
        if new:  # compiled during this forward: this expert's graph, which the backend dumped in `first`'s folder
            self.programs[name] = new[-1]
            for other, program in self.programs.items():
                if not (other == self.first and program is new[-1]):
                    self._write(other, program)
        elif name not in self.programs and programs:
            self.programs[name] = _program_holding(programs, self.modules[name])
            self._write(name, self.programs[name])

    def _write(self, name: str, program) -> None:
        from wancompile.backend import _dump

        _dump(self.root / name, program.graph, program.plan)


def _program_holding(programs: list, module: torch.nn.Module):
    """The program (newest first) whose parameter cache holds one of `module`'s parameters; else the newest."""
    params = list(module.parameters())
    for program in reversed(programs):
        if any(program.holds(p) for p in params):
            return program
    return programs[-1]
