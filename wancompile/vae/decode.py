"""`vae.decode` replaced on one `AutoencoderKLWan` instance by a full-T or chunked-T decode.

`enable_full_t(vae)` binds a new `decode` on the instance (the class and other instances are untouched);
`disable_full_t(vae)` removes it, so the class's streaming `decode` is found again.
"""

from __future__ import annotations

import types

import torch
import torch.nn as nn

from wancompile.vae.frames import CausalHistory, decode_chunk

# Instance attribute holding the chunk size; its presence is what "enabled" means.
_T_CHUNK_ATTR = "_wancompile_t_chunk"


def enable_full_t(vae: nn.Module, t_chunk: int | None = None) -> nn.Module:
    """Make `vae.decode(z)` decode all latent frames in one pass, or in chunks of `t_chunk` frames.

    The result equals diffusers' frame-by-frame decode. With `t_chunk=None` the whole clip runs as one
    pass (one captured graph under `torch.compile`). With `t_chunk=k`, latent frame 0 runs alone and
    then chunks of k frames follow, carrying the last two input frames of every causal conv; this
    bounds activation memory to about k frames (see `choose_t_chunk`).

    Compile after enabling: `torch.compile(vae.decode)` captures the method bound at that time.
    Returns `vae`.
    """
    _check_is_wan_vae(vae)
    _check_t_chunk(t_chunk)
    setattr(vae, _T_CHUNK_ATTR, t_chunk)
    vae.decode = types.MethodType(_decode, vae)
    return vae


def disable_full_t(vae: nn.Module) -> nn.Module:
    """Restore diffusers' streaming `vae.decode` on this instance (a no-op if not enabled). Returns `vae`."""
    if is_full_t_enabled(vae):
        del vae.decode
        delattr(vae, _T_CHUNK_ATTR)
    return vae


def is_full_t_enabled(vae: nn.Module) -> bool:
    """Whether `enable_full_t` is active on this instance."""
    return _T_CHUNK_ATTR in vae.__dict__


def installed_t_chunk(vae: nn.Module) -> int | None:
    """The chunk size `enable_full_t` installed on `vae` (None: full-T)."""
    if not is_full_t_enabled(vae):
        raise ValueError("enable_full_t is not active on this VAE; call wancompile.enable_full_t(vae, t_chunk) first")
    return vae.__dict__[_T_CHUNK_ATTR]


def _decode(self: nn.Module, z: torch.Tensor, return_dict: bool = True):
    """`AutoencoderKLWan.decode` with the frame loop replaced; same arguments and outputs."""
    from diffusers.models.autoencoders.vae import DecoderOutput

    hook = getattr(self, "_hf_hook", None)  # what diffusers' @apply_forward_hook does (accelerate offload)
    if hook is not None and hasattr(hook, "pre_forward"):
        hook.pre_forward(self)
    _check_latents(self, z)
    t_chunk = getattr(self, _T_CHUNK_ATTR)
    if self.use_slicing and z.shape[0] > 1:
        decoded = torch.cat([_decode_frames(self, z_slice, t_chunk) for z_slice in z.split(1)])
    else:
        decoded = _decode_frames(self, z, t_chunk)
    if not return_dict:
        return (decoded,)
    return DecoderOutput(sample=decoded)


def _decode_frames(vae: nn.Module, z: torch.Tensor, t_chunk: int | None) -> torch.Tensor:
    if t_chunk is None:
        return decode_chunk(vae, z, CausalHistory(keep=False), first_chunk=True)
    return _decode_chunked(vae, z, t_chunk)


@torch._dynamo.disable(recursive=False)
def _decode_chunked(vae: nn.Module, z: torch.Tensor, t_chunk: int) -> torch.Tensor:
    # Dynamo skips this loop but compiles the two step functions it calls: one graph per chunk shape.
    frames, history = _decode_first_frame(vae, z[:, :, :1])
    chunks = [frames]
    for start in range(1, z.shape[2], t_chunk):
        z_chunk = z[:, :, start : start + t_chunk]
        # a shorter last chunk gets its own static graph rather than making the frame count symbolic
        torch._dynamo.mark_static(z_chunk, 2)
        frames, history = _decode_next_chunk(vae, z_chunk, history)
        chunks.append(frames)
    return torch.cat(chunks, dim=2)


def _decode_first_frame(vae: nn.Module, z: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    history = CausalHistory()
    return decode_chunk(vae, z, history, first_chunk=True), history.after


def _decode_next_chunk(
    vae: nn.Module, z: torch.Tensor, before: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    history = CausalHistory(before)
    return decode_chunk(vae, z, history, first_chunk=False), history.after


def _check_is_wan_vae(vae: nn.Module) -> None:
    from diffusers import AutoencoderKLWan

    if not isinstance(vae, AutoencoderKLWan):
        raise TypeError(f"enable_full_t expects a diffusers AutoencoderKLWan, got {type(vae).__name__}")


def _check_t_chunk(t_chunk: object) -> None:
    if t_chunk is None:
        return
    if isinstance(t_chunk, bool) or not isinstance(t_chunk, int) or t_chunk < 1:
        raise ValueError(
            f"t_chunk must be a positive int (latent frames per chunk) or None (all frames in one pass), "
            f"got {t_chunk!r}; choose_t_chunk(vae.config, latent_shape, memory_bytes) picks one from a memory budget"
        )


def _check_latents(vae: nn.Module, z: torch.Tensor) -> None:
    z_dim = vae.config.z_dim
    if z.dim() != 5 or z.shape[1] != z_dim:
        raise ValueError(
            f"vae.decode expects latents of shape (batch, {z_dim}, frames, height, width) for this VAE "
            f"(config.z_dim={z_dim}), got {tuple(z.shape)}; pass the transformer's output latents "
            f"(denormalised with latents_mean/latents_std), not pixels or another VAE's latents"
        )
    tile_h = vae.tile_sample_min_height // vae.spatial_compression_ratio
    tile_w = vae.tile_sample_min_width // vae.spatial_compression_ratio
    if vae.use_tiling and (z.shape[3] > tile_h or z.shape[4] > tile_w):
        raise ValueError(
            "enable_full_t replaces the frame loop, not diffusers' spatial tiling: call vae.disable_tiling() "
            "(and bound memory with t_chunk), or wancompile.disable_full_t(vae) to decode tiled"
        )
