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
    cfg: Optional["_CFGState"] = field(default=None, repr=False)
    decode: Any = field(default=None, repr=False)  # the compiled decode installed on pipe.vae
    dumps: Optional["_ExpertDumps"] = field(default=None, repr=False)  # dump_dir: one folder per expert

    before: list = field(default_factory=list, repr=False)  # the backend's recent programs when compiled

    def programs(self) -> list:
        """The DiT `ShardedProgram`s the backend compiled since `compile_pipeline` (newest last): this
        pipeline's transformers', unless other modules were compiled in between."""
        from wancompile.backend import Component, recent_programs

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
    from wancompile.backend import recent_programs

    state = PipelineCompilation(
        options=dict(opts), transformers=names, vae=vae, cfg_parallel=cfg_mode != "off", before=recent_programs()
    )
    dump = Path(dump_dir) if dump_dir is not None else None

    # One options dict for every transformer: equal options let the experts share one compiled graph.
    dit_opts = dict(opts, weight_sets=opts.get("weight_sets", len(names)))
    if cfg_mode != "off":
        dit_opts["cfg_parallel"] = cfg_mode  # the batch-2 graph's split, costed by planner.cfg
    if dump is not None:  # the backend's dumps (plan, HLO) of the DiT graph(s); `_ExpertDumps` adds one per expert
        dit_opts["dump_dir"] = str(dump / names[0] if names else dump / TRANSFORMERS[0])
        state.dumps = _ExpertDumps(dump, state)
    if state.cfg_parallel:
        state.cfg = _CFGState(cfg_mode)
        _capture_negative_prompt(pipe, state.cfg)
    # the calls `CFGBatched` does not batch (a pipeline passing more inputs, e.g. SkyReels-V2's diffusion
    # forcing, or one without cache contexts, e.g. ChronoEdit) are no CFG pair: planned without cfg_parallel
    plain_opts = {k: v for k, v in dit_opts.items() if k != "cfg_parallel"}
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


# --- the VAE decode ----------------------------------------------------------------------------------


def _install_decode(pipe, mode: Union[str, int], vae_opts: dict, state: PipelineCompilation):
    from wancompile.vae import enable_full_t

    vae = pipe.vae
    enable_full_t(vae, mode if isinstance(mode, int) else None)
    compiled = torch.compile(vae.decode, backend="wan_autoshard", options=vae_opts)
    decode = _BudgetedDecode(vae, compiled, vae_opts, state) if mode == "auto" else compiled
    vae.decode = decode  # what the pipeline calls: `self.vae.decode(latents, return_dict=False)`
    return decode


class _BudgetedDecode:
    """``vae="auto"``: per latent shape, full-T when the clip's decode fits the per-device budget, else the
    chunk size `choose_t_chunk` picks (then the compiled decode recompiles for that chunking).

    The budget is ``memory_gb`` (or the hardware profile's DRAM) less the transformers' weights per device
    as their plans place them (they stay resident while the VAE decodes). The first decode of a shape is
    sized for the whole latent on every device (no plan exists before it compiles); once its VAE plan is
    made, the chunk is sized again for the tile of the activations that plan puts on each device
    (`spatial_split`), so later decodes of that shape take larger chunks (or full-T) where the plan splits
    H/W."""

    def __init__(self, vae, compiled, vae_opts: dict, state: PipelineCompilation) -> None:
        self.vae, self.compiled, self.opts, self.state = vae, compiled, vae_opts, state
        self.t_chunks: dict[tuple, Optional[int]] = {}  # latent shape -> t_chunk chosen
        self.splits: dict[tuple, tuple[int, int]] = {}  # latent shape -> the plan's (H, W) split, once planned

    def budget_bytes(self) -> int:
        from planner.hardware import resolve_hardware
        from wancompile.options import Options

        opts = Options.from_user(self.opts)
        if opts.memory_gb is not None:
            budget = opts.memory_gb * 1e9
        else:
            mesh = opts.mesh
            if opts.hardware is None and mesh is None:
                from planner.mesh import MeshSpec
                from wancompile import runtime

                mesh = MeshSpec((1, runtime.device_count()), ("batch", "model"))
            budget = float(resolve_hardware(opts.hardware, mesh).dram_bytes)
        return int(budget - resident_weight_bytes(self.state.programs()))

    def choose(self, z: torch.Tensor, split: tuple[int, int] = (1, 1)) -> Optional[int]:
        from wancompile.vae import choose_t_chunk

        return choose_t_chunk(
            self.vae.config, tuple(z.shape), self.budget_bytes(), element_bytes=z.element_size(), split=split
        )

    def __call__(self, z: torch.Tensor, return_dict: bool = True):
        from wancompile.backend import Component, recent_programs
        from wancompile.vae.decode import _T_CHUNK_ATTR

        key = (tuple(z.shape), z.dtype)
        if key not in self.t_chunks:
            self.t_chunks[key] = self.choose(z)
            self._log(z, key, "the whole latent per device")
        if self.vae.__dict__[_T_CHUNK_ATTR] != self.t_chunks[key]:
            setattr(self.vae, _T_CHUNK_ATTR, self.t_chunks[key])
        before = {id(p) for p in recent_programs()}
        out = self.compiled(z, return_dict=return_dict)
        if key not in self.splits:
            programs = recent_programs(Component.VAE)
            new = [p for p in programs if id(p) not in before] or programs[-1:]
            if new:  # the plan(s) of this decode: the least split one bounds the chunk
                self.splits[key] = min((spatial_split(p.plan) for p in new), key=lambda s: s[0] * s[1])
                if self.splits[key] != (1, 1):
                    self.t_chunks[key] = self.choose(z, self.splits[key])
                    self._log(z, key, f"the plan's tile, H/W split {self.splits[key]}")
        return out

    def _log(self, z: torch.Tensor, key: tuple, sized: str) -> None:
        chunk = self.t_chunks[key]
        log.info(
            "compile_pipeline: VAE decode of latents %s: %s (sized for %s)",
            tuple(z.shape),
            "full-T" if chunk is None else f"chunked-T, {chunk} frames per chunk",
            sized,
        )


def spatial_split(plan) -> tuple[int, int]:
    """(devices over H, devices over W) of the largest 5-D (B, C, T, H, W) activation a VAE plan constrains:
    the split of the decoder's widest point; (1, 1) where the plan splits no activation spatially."""
    import math

    size = dict(zip(plan.mesh.axis_names, plan.mesh.shape))

    def devices(entry) -> int:
        axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        return math.prod(size[a] for a in axes)

    sized = [a for a in plan.activations if len(a.shape) == 5 and all(isinstance(d, int) for d in a.shape)]
    if not sized:
        return (1, 1)
    widest = max(sized, key=lambda a: math.prod(a.shape))
    spec = tuple(widest.spec) + (None,) * (5 - len(tuple(widest.spec)))
    return devices(spec[3]), devices(spec[4])


def resident_weight_bytes(programs) -> int:
    """Bytes per device of the weights of the newest DiT program's plan, times the weight sets it budgeted."""
    if not programs:
        return 0
    import math

    program = programs[-1]
    plan = program.plan
    size = dict(zip(plan.mesh.axis_names, plan.mesh.shape))
    total = 0
    for node in program.graph.params():
        spec = plan.params.get(node.param) or (None,) * len(node.out.shape)
        numel = 1
        for dim, entry in zip(node.out.shape, spec):
            axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
            numel *= math.ceil(int(dim) / math.prod(size[a] for a in axes))
        total += numel * node.out.itemsize
    return total * (plan.weight_sets or 1)


# --- classifier-free guidance as one batch-2 forward -------------------------------------------------


class _CFGState:
    """The uncond prompt embeddings of the pipeline call in progress, shared by its transformers."""

    def __init__(self, mode: str = "on") -> None:
        self.mode = mode  # "on" or "auto" (the backend's cfg_parallel for the batch-2 graph)
        self.negative: Optional[torch.Tensor] = None
        # "auto" only: why batching was given up (no batch-2 plan fits memory); then two forwards per step
        self.unbatched: Optional[str] = None
        self.batched = 0  # batch-2 forwards run
        self.served = 0  # uncond calls answered from a batch-2 forward
        self.fallthrough = 0  # calls that ran as plain forwards


def _capture_negative_prompt(pipe, cfg: _CFGState) -> None:
    """Wrap the instance's `encode_prompt` to keep the negative embeddings it returns for this call."""
    encode = type(pipe).encode_prompt.__get__(pipe)

    def encode_prompt(*args: Any, **kwargs: Any):
        prompt_embeds, negative = encode(*args, **kwargs)
        cfg.negative = negative if kwargs.get("do_classifier_free_guidance", True) else None
        return prompt_embeds, negative

    pipe.__dict__["encode_prompt"] = encode_prompt


def _same(a: Any, b: torch.Tensor, version: int) -> bool:
    """`a` is `b` as it was when its version was `version` (the same tensor, or equal values)."""
    if not isinstance(a, torch.Tensor) or b._version != version:
        return False
    if a is b:
        return True
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    return bool(torch.equal(a, b))


class CFGBatched(torch.nn.Module):
    """A transformer that runs diffusers' cond + uncond forwards of one denoising step as one batch-2 forward.

    In ``cache_context("cond")`` a call with the pipeline's latents ``x``, timestep ``t`` and prompt
    embeddings ``c`` runs ``inner(cat[x, x], cat[t, t], cat[c, n])`` with ``n`` the uncond embeddings
    captured from this pipeline call's `encode_prompt`, returns the first half and keeps the second. The
    next call, in ``cache_context("uncond")``, gets the kept half if its inputs are that ``x``, ``t`` and
    ``n`` (the same tensors, or equal ones); any other call (other inputs, extra arguments, no cache
    context) runs as it is, on ``plain`` (the transformer compiled without ``cfg_parallel``: such a call is
    no CFG pair) or, without one, on ``inner``. Attributes the pipeline reads (``config``, ``dtype``,
    ``device``, ...) come from the wrapped transformer.
    """

    def __init__(
        self,
        inner: torch.nn.Module,
        original: torch.nn.Module,
        cfg: _CFGState,
        plain: Optional[torch.nn.Module] = None,
    ) -> None:
        super().__init__()
        self.inner = inner
        self.plain = plain if plain is not None else inner
        object.__setattr__(self, "_original", original)
        object.__setattr__(self, "_cfg", cfg)
        object.__setattr__(self, "_context", None)
        object.__setattr__(self, "_pending", None)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.__dict__["_original"], name)

    def cache_context(self, name: str, **kwargs: Any):
        """diffusers' `CacheMixin.cache_context` of the wrapped transformer, also telling the wrapper which
        call of the guidance pair comes next."""
        from contextlib import contextmanager

        @contextmanager
        def context():
            object.__setattr__(self, "_context", name)
            try:
                with self._original.cache_context(name, **kwargs):
                    yield
            finally:
                object.__setattr__(self, "_context", None)

        return context()

    def forward(
        self,
        hidden_states: torch.Tensor,
        timestep: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        *args: Any,
        return_dict: bool = True,
        attention_kwargs: Optional[dict] = None,
        **kwargs: Any,
    ):
        cfg, context, pending = self._cfg, self._context, self._pending
        object.__setattr__(self, "_pending", None)
        if context == "uncond" and pending is not None and not args and not kwargs:
            (x, xv), (t, tv), (n, nv), attn, half = pending
            if (
                attn is attention_kwargs
                and _same(hidden_states, x, xv)
                and _same(timestep, t, tv)
                and _same(encoder_hidden_states, n, nv)
            ):
                cfg.served += 1
                return _output(half, return_dict)
        negative = cfg.negative
        if (
            context == "cond"
            and negative is not None
            and cfg.unbatched is None
            and not args
            and not kwargs
            and negative.shape == encoder_hidden_states.shape
        ):
            n = negative.to(device=encoder_hidden_states.device, dtype=encoder_hidden_states.dtype)
            from wancompile.backend import cfg_pair_splittable

            try:
                with cfg_pair_splittable(cfg.mode == "auto"):  # "auto" may choose two batch-1 forwards
                    out = self.inner(
                        hidden_states=torch.cat([hidden_states, hidden_states]),
                        timestep=torch.cat([timestep, timestep]),
                        encoder_hidden_states=torch.cat([encoder_hidden_states, n]),
                        attention_kwargs=attention_kwargs,
                        return_dict=False,
                    )[0]
            except Exception as e:
                budget = _planner_error(e, "MemoryBudgetError")
                sequential = _planner_error(e, "CfgSequential")
                if cfg.mode != "auto" or (budget is None and sequential is None):
                    raise
                # "auto": two forwards per step, the cost model's choice (planner.cfg: ``sequential`` is the
                # cheapest option), or its answer for a CFG pair that does not fit
                cfg.unbatched = str(sequential or budget)
                if sequential is not None:
                    log.info("compile_pipeline: %s", sequential)
                else:
                    log.warning(
                        "compile_pipeline: no batch-2 plan fits memory (%s); running cond and uncond as two "
                        "forwards per step",
                        budget,
                    )
                return self.forward(
                    hidden_states,
                    timestep,
                    encoder_hidden_states,
                    return_dict=return_dict,
                    attention_kwargs=attention_kwargs,
                )
            cond, uncond = out.chunk(2)
            pending = tuple((v, v._version) for v in (hidden_states, timestep, n)) + (attention_kwargs, uncond)
            object.__setattr__(self, "_pending", pending)
            cfg.batched += 1
            return _output(cond, return_dict)
        cfg.fallthrough += 1
        return self.plain(
            hidden_states,
            timestep,
            encoder_hidden_states,
            *args,
            return_dict=return_dict,
            attention_kwargs=attention_kwargs,
            **kwargs,
        )


def _planner_error(e: BaseException, name: str):
    """The planner's error of class `name` (`MemoryBudgetError`, `planner.cfg.CfgSequential`) behind `e`
    (dynamo wraps backend errors), else None."""
    from planner.cfg import CfgSequential
    from planner.plan import MemoryBudgetError

    cls = {"MemoryBudgetError": MemoryBudgetError, "CfgSequential": CfgSequential}[name]
    while e is not None:
        if isinstance(e, cls):
            return e
        e = getattr(e, "inner_exception", None) or e.__cause__
    return None


def _output(sample: torch.Tensor, return_dict: bool):
    if not return_dict:
        return (sample,)
    from diffusers.models.modeling_outputs import Transformer2DModelOutput

    return Transformer2DModelOutput(sample=sample)
