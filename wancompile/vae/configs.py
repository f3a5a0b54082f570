"""Wan VAE configs as data: the public full-size ones and tiny random-weight stand-ins for tests and benches.

The tiny configs keep the structure that matters for decoding (temporal upsampling twice, the mid-block
attention, Wan 2.2's residual up blocks with `DupUp3D` and patch size 2) at a few channels.
"""

from __future__ import annotations

from typing import Any

import torch

VAE_CONFIGS: dict[str, dict[str, Any]] = {
    # Wan 2.1 VAE, used by Wan 2.2 T2V/I2V-A14B (diffusers' AutoencoderKLWan defaults)
    "wan2.1": dict(
        base_dim=96, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, temperal_downsample=[False, True, True]
    ),
    # Wan 2.2 VAE of TI2V-5B: 16x spatial, residual up/down blocks, patch size 2
    "wan2.2": dict(
        base_dim=160,
        decoder_base_dim=256,
        z_dim=48,
        dim_mult=[1, 2, 4, 4],
        num_res_blocks=2,
        temperal_downsample=[False, True, True],
        is_residual=True,
        patch_size=2,
        in_channels=12,
        out_channels=12,
        scale_factor_temporal=4,
        scale_factor_spatial=16,
    ),
}
# the tiny stand-ins: the full-size configs at a few channels, one residual block per stage
VAE_CONFIGS["tiny-wan2.1"] = dict(VAE_CONFIGS["wan2.1"], base_dim=8, dim_mult=[1, 2, 2, 2], num_res_blocks=1)
# decoder at 8 channels (base_dim only sizes the encoder, which decoding never runs)
VAE_CONFIGS["tiny-wan2.2"] = dict(VAE_CONFIGS["wan2.2"], base_dim=4, decoder_base_dim=8, num_res_blocks=1)


def build_vae(name: str, *, device: str | torch.device = "cpu", seed: int = 0, dtype: torch.dtype = torch.float32):
    """An `AutoencoderKLWan` for a registered config, in eval mode: diffusers' default init under `seed`
    on CPU, or weightless on `device="meta"`."""
    from diffusers import AutoencoderKLWan

    if name not in VAE_CONFIGS:
        raise ValueError(f"unknown VAE config {name!r}; choose one of {sorted(VAE_CONFIGS)}")
    torch.manual_seed(seed)
    with torch.device(device):
        vae = AutoencoderKLWan(**VAE_CONFIGS[name])
    if dtype != torch.float32:
        vae = vae.to(dtype)
    return vae.eval()
