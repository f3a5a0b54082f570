"""How many latent frames a decode chunk may hold under a memory budget, from the VAE config alone.

Pure arithmetic on a config mapping (`vae.config` or a plain dict): no model, no diffusers, no
torch_xla, so a planner can call it on a laptop. The estimate (docs/vae.md, "Choosing t_chunk"):

    bytes(chunk of k latent frames) = k * per_frame + history + output

- per_frame: the decoder's widest point, `LIVE_ACTIVATIONS` tensors of the widest stage
  (channels x pixel frames per latent frame x upscaled H x W), or the mid-block attention's
  score and softmax matrices per frame if larger.
- history: `CACHE_T` frames of the input of every temporal causal conv, carried between chunks.
- output: the decoded clip, twice: it exists both before and after the final clamp (full-T), or
  both as the list of decoded chunks and as their concatenation (chunked-T).

Full-T is one chunk of all T frames with no history.

``split=(h, w)``: a spatially split plan (`planner.vae_plan`, ``spatial(H:a,W:b)``) holds on each device
a tile of every activation, ceil(H/h) x ceil(W/w) rows and columns plus a halo row and column on each
side (kernel-3 convs), so per_frame, history and output are that tile's; the mid-block attention's
matrices stay whole (its input is gathered, the ``gather`` strategy).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Tensors of the widest stage alive at once inside a residual block: its input (kept for the
# shortcut), the shortcut, the normalised activation, the causally padded conv input, the conv output.
LIVE_ACTIVATIONS = 5
CACHE_T = 2  # frames of history per temporal conv (wancompile.vae.frames.CACHE_T)


@dataclass(frozen=True)
class Stage:
    """Activations of one decoder stage: channels at `frames` pixel frames per latent frame, H and W times `scale`."""

    name: str
    channels: int
    frames: int
    scale: int
    temporal_convs: int  # kernel-3 causal convs whose input has `channels` (history carried per conv)

    def elements(self, latent_hw: int) -> int:
        return self.channels * self.frames * self.scale**2 * latent_hw

    def tile(self, height: int, width: int, split: tuple[int, int]) -> int:
        """Pixels of one device's tile of this stage (H x W at `scale`, split `split`, with its halo)."""
        return _part(self.scale * height, split[0]) * _part(self.scale * width, split[1])


def _part(n: int, parts: int) -> int:
    """Rows one device holds of `n` split `parts` ways: its share and a halo row on each side."""
    return n if parts <= 1 else math.ceil(n / parts) + 2


def decoder_stages(config: Mapping) -> list[Stage]:
    """The decoder's stages in execution order, as `WanDecoder3d.__init__` builds them."""
    mult = list(config["dim_mult"])
    dims = [_decoder_base_dim(config) * u for u in [mult[-1], *mult[::-1]]]
    temporal_up = list(config["temperal_downsample"])[::-1]
    residual = bool(config.get("is_residual", False))
    resnets = config.get("num_res_blocks", 2) + 1

    stages = [Stage("conv_in", config["z_dim"], 1, 1, 1), Stage("mid_block", dims[0], 1, 1, 4)]
    frames, scale = 1, 1
    for i, (in_dim, out_dim) in enumerate(zip(dims[:-1], dims[1:])):
        if i > 0 and not residual:
            in_dim //= 2  # Wan 2.1: the previous upsampler halved the channels
        stages.append(Stage(f"up_blocks.{i}", max(in_dim, out_dim), frames, scale, 2 * resnets))
        if i == len(mult) - 1:
            break
        if temporal_up[i]:
            stages.append(Stage(f"up_blocks.{i}.time_conv", 2 * out_dim, frames, scale, 1))
            frames *= 2
        scale *= 2
        # nearest-exact 2x upsampled input of the upsampler's conv2d
        stages.append(Stage(f"up_blocks.{i}.upsample", out_dim, frames, scale, 0))
    stages.append(Stage("conv_out", dims[-1], frames, scale, 1))
    return stages


@dataclass(frozen=True)
class DecodeMemory:
    """Estimated activation bytes of one decode, split by how they scale with the chunk size."""

    per_frame: int  # peak activations per latent frame in a chunk
    history: int  # causal history carried between chunks (chunked-T only)
    output: int  # the decoded clip, twice (see the module docstring)
    frames: int  # latent frames of the clip

    def peak(self, t_chunk: int | None) -> int:
        """Peak bytes with `t_chunk` latent frames per chunk (None: full-T, one chunk, no history)."""
        if t_chunk is None:
            return self.frames * self.per_frame + self.output
        return min(t_chunk, max(self.frames - 1, 1)) * self.per_frame + self.history + self.output


def decode_memory(
    config: Mapping, latent_shape: Sequence[int], *, element_bytes: int = 4, split: tuple[int, int] = (1, 1)
) -> DecodeMemory:
    """The estimate for decoding latents of `latent_shape` (B, C, T, H, W) with this VAE config, per device
    of a plan that splits H over ``split[0]`` and W over ``split[1]`` devices (default: not split)."""
    batch, _, frames, height, width = latent_shape
    hw = height * width
    stages = decoder_stages(config)
    tile = {s.name: s.tile(height, width, split) for s in stages}  # pixels per device, per stage
    widest = max(s.channels * s.frames * tile[s.name] for s in stages)
    attention = 2 * hw * hw  # scores and softmax of the mid-block's per-frame attention (gathered: whole)
    head = stages[-1]
    pixel_frames = 1 + head.frames * (frames - 1)
    return DecodeMemory(
        per_frame=batch * max(LIVE_ACTIVATIONS * widest, attention) * element_bytes,
        history=batch * sum(CACHE_T * s.channels * tile[s.name] * s.temporal_convs for s in stages) * element_bytes,
        output=2 * batch * config.get("out_channels", 3) * pixel_frames * tile[head.name] * element_bytes,
        frames=frames,
    )


def choose_t_chunk(
    vae_config: Mapping,
    latent_shape: Sequence[int],
    memory_bytes: int,
    *,
    element_bytes: int = 4,
    split: tuple[int, int] = (1, 1),
) -> int | None:
    """`t_chunk` for `enable_full_t`: None if the whole clip fits in `memory_bytes`, else a chunk size.

    The chunk size is the fewest chunks that fit, made as even as possible (a shorter last chunk
    costs one more compiled graph). `split`: the plan's spatial split (H, W), each device holding a tile.
    Raises ValueError when even one latent frame does not fit.
    """
    memory = decode_memory(vae_config, latent_shape, element_bytes=element_bytes, split=split)
    if memory.peak(None) <= memory_bytes:
        return None
    most = (memory_bytes - memory.history - memory.output) // memory.per_frame
    if most < 1:
        raise ValueError(
            f"decoding one latent frame of {tuple(latent_shape)} needs about {memory.peak(1) / 2**30:.2f} GiB of "
            f"activations, more than the {memory_bytes / 2**30:.2f} GiB budget: shard the decode spatially (H/W) "
            f"over more devices, decode one video at a time (vae.enable_slicing()), or raise the memory budget"
        )
    chunks = math.ceil((memory.frames - 1) / most)
    return math.ceil((memory.frames - 1) / chunks)


def _decoder_base_dim(config: Mapping) -> int:
    return config.get("decoder_base_dim") or config["base_dim"]
