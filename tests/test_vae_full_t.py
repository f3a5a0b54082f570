"""enable_full_t: full-T and chunked-T `vae.decode` equal diffusers' frame-by-frame decode."""

from __future__ import annotations

import pytest
import torch

import wancompile.vae as wvae
from wancompile.vae.configs import build_vae

CONFIGS = ["tiny-wan2.1", "tiny-wan2.2"]
LATENT_HW = (6, 10)  # odd latent size: 6x10 (3x5 after the Wan 2.2 patch)


@pytest.fixture(scope="module")
def vaes():
    return {name: build_vae(name) for name in CONFIGS}


@pytest.fixture(scope="module")
def streaming(vaes):
    """diffusers' own decode of seeded latents, computed once per (config, frames, batch, dtype)."""
    cache = {}

    def decode(name, frames, batch=1, dtype=torch.float32):
        key = (name, frames, batch, dtype)
        if key not in cache:
            vae = vaes[name].to(dtype)
            z = latents(vae, frames, batch).to(dtype)
            with torch.no_grad():
                cache[key] = (z, vae.decode(z).sample)
            vae.float()
        return cache[key]

    return decode


def latents(vae, frames, batch=1, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, vae.config.z_dim, frames, *LATENT_HW, generator=generator)


def decode_with(vae, z, t_chunk, **kwargs):
    wvae.enable_full_t(vae, t_chunk)
    try:
        with torch.no_grad():
            return vae.decode(z, **kwargs)
    finally:
        wvae.disable_full_t(vae)


@pytest.mark.parametrize("t_chunk", [None, 1, 2, 4], ids=lambda k: "full-T" if k is None else f"k={k}")
@pytest.mark.parametrize("frames", [1, 2, 5, 9])
@pytest.mark.parametrize("name", CONFIGS)
def test_decode_equals_streaming_decode(vaes, streaming, name, frames, t_chunk):
    z, expected = streaming(name, frames)
    out = decode_with(vaes[name], z, t_chunk).sample
    scale = vaes[name].config.scale_factor_spatial
    assert out.shape == expected.shape == (1, 3, 1 + 4 * (frames - 1), LATENT_HW[0] * scale, LATENT_HW[1] * scale)
    assert (out - expected).abs().max().item() <= 1e-5


@pytest.mark.parametrize("t_chunk", [None, 2], ids=["full-T", "k=2"])
@pytest.mark.parametrize("name", CONFIGS)
def test_float64_decode_equals_streaming_to_rounding(vaes, streaming, name, t_chunk):
    # fp32 differences come from convs summing in another order over longer clips; in fp64 the
    # frame rules alone decide, and a wrong one would show as an O(0.1) error. The bound is fp64
    # rounding through ~30 convs in another summation order: 2.4e-11 seen on Wan 2.2 chunked-T with
    # this torch build (the CPU conv picks its algorithm by shape, and chunks have other shapes).
    z, expected = streaming(name, 5, dtype=torch.float64)
    vae = vaes[name].double()
    try:
        out = decode_with(vae, z, t_chunk).sample
    finally:
        vae.float()
    assert (out - expected).abs().max().item() <= 1e-10


@pytest.mark.parametrize("t_chunk", [None, 2], ids=["full-T", "k=2"])
def test_batch_of_two_decodes_each_video_independently(vaes, streaming, t_chunk):
    z, expected = streaming("tiny-wan2.2", 2, batch=2)
    out = decode_with(vaes["tiny-wan2.2"], z, t_chunk).sample
    assert (out - expected).abs().max().item() <= 1e-5


def test_slicing_and_tuple_output_follow_diffusers(vaes, streaming):
    vae = vaes["tiny-wan2.1"]
    z, expected = streaming("tiny-wan2.1", 2, batch=2)
    vae.enable_slicing()
    try:
        (out,) = decode_with(vae, z, None, return_dict=False)
    finally:
        vae.disable_slicing()
    assert (out - expected).abs().max().item() <= 1e-5


def test_enable_changes_only_that_instance(vaes):
    vae, other = vaes["tiny-wan2.1"], build_vae("tiny-wan2.1")
    class_decode = type(vae).decode
    wvae.enable_full_t(vae, 2)
    try:
        assert wvae.is_full_t_enabled(vae) and wvae.installed_t_chunk(vae) == 2
        assert not wvae.is_full_t_enabled(other)
        assert other.decode.__func__ is class_decode and type(vae).decode is class_decode
    finally:
        wvae.disable_full_t(vae)
    assert vae.decode.__func__ is class_decode
    assert not wvae.is_full_t_enabled(vae)


def test_enable_twice_replaces_the_chunk_size_and_one_disable_undoes_it(vaes):
    vae = vaes["tiny-wan2.1"]
    wvae.enable_full_t(vae, 1)
    wvae.enable_full_t(vae, None)
    assert wvae.installed_t_chunk(vae) is None
    wvae.disable_full_t(vae)
    assert not wvae.is_full_t_enabled(vae) and vae.decode.__func__ is type(vae).decode


def test_latents_with_the_wrong_channel_count_are_rejected(vaes):
    vae = vaes["tiny-wan2.2"]
    with pytest.raises(ValueError, match=r"\(batch, 48, frames, height, width\).*z_dim=48.*\(1, 16, 2, 6, 10\)"):
        decode_with(vae, torch.randn(1, 16, 2, 6, 10), None)
    with pytest.raises(ValueError, match="z_dim=48"):
        decode_with(vae, torch.randn(48, 2, 6, 10), 2)


@pytest.mark.parametrize("t_chunk", [0, -1, 2.0, True, "4"])
def test_chunk_size_must_be_a_positive_int(vaes, t_chunk):
    with pytest.raises(ValueError, match="t_chunk must be a positive int .* or None"):
        wvae.enable_full_t(vaes["tiny-wan2.1"], t_chunk)
    assert not wvae.is_full_t_enabled(vaes["tiny-wan2.1"])


def test_spatial_tiling_is_refused_with_the_fix(vaes):
    vae = vaes["tiny-wan2.1"]
    vae.enable_tiling(tile_sample_min_height=32, tile_sample_min_width=32)
    try:
        with pytest.raises(ValueError, match=r"vae\.disable_tiling\(\)"):
            decode_with(vae, torch.randn(1, 16, 2, 6, 10), None)
    finally:
        vae.use_tiling = False


def test_only_wan_vaes_are_accepted():
    with pytest.raises(TypeError, match="AutoencoderKLWan"):
        wvae.enable_full_t(torch.nn.Conv3d(16, 16, 1))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_upsampling_copies_the_same_pixels_as_the_module(dtype):
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanUpsample

    from wancompile.vae.frames import upsample_2x

    upsampler = WanUpsample(scale_factor=(2.0, 2.0), mode="nearest-exact")
    x = torch.randn(3, 4, 5, 7, dtype=dtype)
    assert torch.equal(upsample_2x(upsampler, x), upsampler(x))
