"""`compile_pipeline`'s VAE decode: the compiled full-T or chunked-T decode it installs on ``pipe.vae``, and for
``vae="auto"`` the choice per latent shape (`_BudgetedDecode`), from the per-device budget left by the
resident DiT weights (`resident_weight_bytes`) and the VAE plan's spatial split (`spatial_split`)."""

from __future__ import annotations

import logging
from typing import Optional, Protocol, Union

import torch

log = logging.getLogger("wancompile")


class _Compiled(Protocol):
    """What the decode reads of `wancompile.pipeline.PipelineCompilation` (named here, not imported: the
    pipeline imports this module)."""

    def programs(self) -> list: ...


def _install_decode(pipe, mode: Union[str, int], vae_opts: dict, state: _Compiled):
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

    def __init__(self, vae, compiled, vae_opts: dict, state: _Compiled) -> None:
        self.vae, self.compiled, self.opts, self.state = vae, compiled, vae_opts, state
        self.t_chunks: dict[tuple, Optional[int]] = {}  # latent shape -> t_chunk chosen
        self.splits: dict[tuple, tuple[int, int]] = {}  # latent shape -> the plan's (H, W) split, once planned

    def budget_bytes(self) -> int:
        from planner.mesh import MeshSpec
        from wancompile.options import Options
        from wancompile.planning import request_for

        opts = Options.from_user(self.opts)
        mesh = opts.mesh
        if mesh is None:
            from wancompile import runtime

            mesh = MeshSpec((1, runtime.device_count()), ("batch", "model"))
        budget = request_for(opts, mesh).budget_bytes  # memory_gb, else the hardware's DRAM
        return int(budget - resident_weight_bytes(self.state.programs()))

    def choose(self, z: torch.Tensor, split: tuple[int, int] = (1, 1)) -> Optional[int]:
        from wancompile.vae import choose_t_chunk

        return choose_t_chunk(
            self.vae.config, tuple(z.shape), self.budget_bytes(), element_bytes=z.element_size(), split=split
        )

    def __call__(self, z: torch.Tensor, return_dict: bool = True):
        from wancompile.programs import Component, recent_programs
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
