"""The decoder of `AutoencoderKLWan` run over many latent frames at once.

diffusers decodes one latent frame per call and threads a `feat_cache` list (plus a `"Rep"` string
sentinel) through every block so that each causal conv sees the frames before it. Here the same blocks
run over a whole chunk of frames; the only state crossing a chunk boundary is a `CausalHistory`: the
last two input frames of every temporal conv, keyed by module path. Full-T is the single chunk that
starts at frame 0 with an empty history.

Every block calls the module's own submodules; the only code that differs from diffusers' blocks is
the bookkeeping of which frames a causal conv sees, the frame-0 rule of temporal upsampling, and the
2x nearest upsample written as a broadcast for XLA (`upsample_2x`, same pixels). See docs/vae.md for
why this equals the streaming decode.
"""

from __future__ import annotations

import torch
import torch.nn as nn

# Frames of context a kernel-3 causal conv needs from before its chunk (diffusers' CACHE_T).
CACHE_T = 2


class CausalHistory:
    """The last `CACHE_T` input frames of each temporal conv, carried from one chunk to the next.

    `before` is what the previous chunk left, by module path; a conv with no entry pads zero frames in
    front, which is what the streaming decode does when its cache entry is still empty. Entries always
    hold `CACHE_T` frames (zeros where the clip had fewer), so every chunk after the first has the same
    input shapes and compiles to the same graph. With `keep=False` (full-T) nothing is recorded.
    """

    def __init__(self, before: dict[str, torch.Tensor] | None = None, keep: bool = True):
        self.before = before or {}
        self.after: dict[str, torch.Tensor] = {}
        self.keep = keep

    def conv(self, name: str, conv: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """`conv(x)` with the frames before `x` taken from the previous chunk."""
        past = self.before.get(name)
        self.remember(name, x)
        return conv(x, past)

    def remember(self, name: str, x: torch.Tensor) -> None:
        """Record the last `CACHE_T` frames `name` has seen, ending with `x`, for the next chunk."""
        if not self.keep:
            return
        past = self.before.get(name)
        if past is None:
            b, c, _, h, w = x.shape
            past = x.new_zeros(b, c, CACHE_T, h, w)
        # clone: a view would keep the whole chunk's activation alive until the next chunk
        self.after[name] = torch.cat([past, x], dim=2)[:, :, -CACHE_T:].clone()


def decode_chunk(vae: nn.Module, z: torch.Tensor, history: CausalHistory, first_chunk: bool) -> torch.Tensor:
    """Pixels `(B, C, F, H, W)` for latent frames `z`, as `AutoencoderKLWan._decode` computes them.

    `first_chunk` says `z` starts at latent frame 0 (which decodes to one pixel frame, the others to
    `scale_factor_temporal` each).
    """
    from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify

    x = vae.post_quant_conv(z)  # kernel 1: no temporal context
    x = decode_latents(vae.decoder, x, history, first_chunk)
    if vae.config.patch_size is not None:
        x = unpatchify(x, patch_size=vae.config.patch_size)
    return torch.clamp(x, min=-1.0, max=1.0)


def decode_latents(decoder: nn.Module, x: torch.Tensor, history: CausalHistory, first_chunk: bool) -> torch.Tensor:
    """`WanDecoder3d.forward` over all frames of `x`."""
    x = history.conv("conv_in", decoder.conv_in, x)
    x = mid_block(decoder.mid_block, x, history, "mid_block")
    for i, block in enumerate(decoder.up_blocks):
        x = up_block(block, x, history, f"up_blocks.{i}", first_chunk)
    x = decoder.nonlinearity(decoder.norm_out(x))
    return history.conv("conv_out", decoder.conv_out, x)


def residual_block(block: nn.Module, x: torch.Tensor, history: CausalHistory, name: str) -> torch.Tensor:
    """`WanResidualBlock.forward`; its kernel-1 shortcut needs no history."""
    shortcut = block.conv_shortcut(x)
    x = block.nonlinearity(block.norm1(x))
    x = history.conv(f"{name}.conv1", block.conv1, x)
    x = block.dropout(block.nonlinearity(block.norm2(x)))
    x = history.conv(f"{name}.conv2", block.conv2, x)
    return x + shortcut


def mid_block(block: nn.Module, x: torch.Tensor, history: CausalHistory, name: str) -> torch.Tensor:
    """`WanMidBlock.forward`; attention is per frame, so the module runs unchanged on all frames."""
    x = residual_block(block.resnets[0], x, history, f"{name}.resnets.0")
    for i, (attention, resnet) in enumerate(zip(block.attentions, block.resnets[1:]), start=1):
        if attention is not None:
            x = attention(x)
        x = residual_block(resnet, x, history, f"{name}.resnets.{i}")
    return x


def up_block(block: nn.Module, x: torch.Tensor, history: CausalHistory, name: str, first_chunk: bool) -> torch.Tensor:
    """`WanUpBlock.forward` (Wan 2.1) or `WanResidualUpBlock.forward` (Wan 2.2, with a `DupUp3D` shortcut)."""
    block_input = x
    for i, resnet in enumerate(block.resnets):
        x = residual_block(resnet, x, history, f"{name}.resnets.{i}")

    upsamplers = getattr(block, "upsamplers", None)  # WanUpBlock keeps its one upsampler in a list
    upsampler = upsamplers[0] if upsamplers is not None else getattr(block, "upsampler", None)
    upsampler_name = f"{name}.upsamplers.0" if upsamplers is not None else f"{name}.upsampler"
    if upsampler is not None:
        x = upsample(upsampler, x, history, upsampler_name, first_chunk)

    shortcut = getattr(block, "avg_shortcut", None)
    if shortcut is not None:
        # DupUp3D drops the factor_t - 1 leading copies of frame 0 when it sees the first chunk
        x = x + shortcut(block_input, first_chunk=first_chunk)
    return x


def upsample(
    resample: nn.Module, x: torch.Tensor, history: CausalHistory, name: str, first_chunk: bool
) -> torch.Tensor:
    """`WanResample.forward` for the decoder's modes: temporal doubling (`upsample3d`), then per frame 2x."""
    if resample.mode == "upsample3d":
        x = double_frames(resample, x, history, name, first_chunk)
    elif resample.mode != "upsample2d":
        raise NotImplementedError(f"{name}: the decoder has no {resample.mode!r} resample")
    b, c, t, h, w = x.shape
    upsampler, conv = resample.resample
    frames = conv(upsample_2x(upsampler, x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w)))
    return frames.view(b, t, *frames.shape[1:]).permute(0, 2, 1, 3, 4)


def upsample_2x(upsampler: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`WanUpsample` (nearest-exact, 2x): each pixel copied into a 2x2 block, written as a broadcast.

    The module's `interpolate` does not suit XLA: torch_xla 2.9
    has no lowering for nearest-exact and runs it on the host, cutting the graph at every upsampler,
    and plain nearest makes the SPMD partitioner all-reduce the whole image when H/W are sharded.
    A broadcast and a reshape keep each device's rows and columns its own.
    """
    if upsampler.mode != "nearest-exact" or tuple(upsampler.scale_factor) != (2.0, 2.0):
        return upsampler(x)
    n, c, h, w = x.shape
    x = x.float().type_as(x)  # WanUpsample works in float32: the same rounding (none below float64)
    return x[:, :, :, None, :, None].expand(n, c, h, 2, w, 2).reshape(n, c, 2 * h, 2 * w)


def double_frames(
    resample: nn.Module, x: torch.Tensor, history: CausalHistory, name: str, first_chunk: bool
) -> torch.Tensor:
    """Frame 0 stays one frame; every later frame becomes two through `time_conv`.

    The streaming decode marks `time_conv`'s cache `"Rep"` on frame 0 and skips the conv, then runs
    frame 1 with zero padding: `time_conv` sees the frames after frame 0 as a causal sequence of its own.
    """
    if first_chunk:
        frame0, x = x[:, :, :1], x[:, :, 1:]
        if x.shape[2] == 0:  # frame 0 alone: time_conv has nothing to do, its history stays zeros
            history.remember(f"{name}.time_conv", x)
            return frame0
    b, c, t, h, w = x.shape
    y = history.conv(f"{name}.time_conv", resample.time_conv, x)
    # time_conv's 2c output channels are (first, second) of each doubled frame
    y = y.reshape(b, 2, c, t, h, w)
    x = torch.stack((y[:, 0], y[:, 1]), dim=3).reshape(b, c, 2 * t, h, w)
    return torch.cat([frame0, x], dim=2) if first_chunk else x
