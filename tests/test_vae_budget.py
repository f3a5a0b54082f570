"""choose_t_chunk: the activation estimate bounds what a decode really holds, and the chunk size fits the budget."""

from __future__ import annotations

import math
import subprocess
import sys
import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import wancompile.vae as wvae
from wancompile.vae.configs import VAE_CONFIGS, build_vae

GiB = 2**30


class PeakLiveBytes(TorchDispatchMode):
    """Peak bytes of the storages that ops created under this mode and that are still referenced."""

    def __init__(self):
        super().__init__()
        self.refs: dict[int, list[int]] = {}  # storage pointer -> [bytes, live tensors on it]
        self.now = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                self._track(tensor)
        return out

    def _track(self, tensor):
        storage = tensor.untyped_storage()
        entry = self.refs.setdefault(storage.data_ptr(), [storage.nbytes(), 0])
        if entry[1] == 0:
            self.now += entry[0]
            self.peak = max(self.peak, self.now)
        entry[1] += 1
        weakref.finalize(tensor, self._release, storage.data_ptr())

    def _release(self, pointer):
        entry = self.refs[pointer]
        entry[1] -= 1
        if entry[1] == 0:
            self.now -= entry[0]
            del self.refs[pointer]


@pytest.mark.parametrize("t_chunk", [None, 1, 4], ids=lambda k: "full-T" if k is None else f"k={k}")
@pytest.mark.parametrize("frames", [5, 9])
@pytest.mark.parametrize("name", ["tiny-wan2.1", "tiny-wan2.2"])
def test_estimate_bounds_the_measured_peak_within_2_5x(name, frames, t_chunk):
    vae = build_vae(name)
    z = torch.randn(1, vae.config.z_dim, frames, 6, 10)
    wvae.enable_full_t(vae, t_chunk)
    with torch.no_grad(), PeakLiveBytes() as measured:
        vae.decode(z)
    estimate = wvae.decode_memory(vae.config, z.shape).peak(t_chunk)
    assert measured.peak <= estimate <= 2.5 * measured.peak


def test_chunking_bounds_memory_as_the_clip_grows():
    memory = [wvae.decode_memory(VAE_CONFIGS["wan2.1"], (1, 16, t, 90, 160)) for t in (21, 41)]
    assert memory[1].peak(None) > 1.8 * memory[0].peak(None)
    # with chunks only the decoded clip grows
    assert memory[1].peak(4) - memory[0].peak(4) == memory[1].output - memory[0].output


@pytest.mark.parametrize("name", ["wan2.1", "wan2.2"])
@pytest.mark.parametrize("budget_gib", [8, 12, 24, 48, 96, 1024])
def test_chosen_chunk_fits_and_no_fewer_chunks_would(name, budget_gib):
    config, shape = VAE_CONFIGS[name], (1, VAE_CONFIGS[name]["z_dim"], 21, 45, 80)
    memory = wvae.decode_memory(config, shape, element_bytes=2)
    budget = budget_gib * GiB
    try:
        t_chunk = wvae.choose_t_chunk(config, shape, budget, element_bytes=2)
    except ValueError as error:
        assert memory.peak(1) > budget and "shard the decode spatially" in str(error)
        return
    if t_chunk is None:
        assert memory.peak(None) <= budget
        return
    chunks = math.ceil(20 / t_chunk)
    assert memory.peak(t_chunk) <= budget < memory.peak(None)
    assert chunks == 1 or memory.peak(math.ceil(20 / (chunks - 1))) > budget


def test_a_budget_below_one_frame_names_the_fix():
    with pytest.raises(ValueError, match="shard the decode spatially .* raise the memory budget"):
        wvae.choose_t_chunk(VAE_CONFIGS["wan2.1"], (1, 16, 21, 90, 160), 1 * GiB)


def test_importing_wancompile_vae_loads_neither_torch_xla_nor_diffusers():
    code = "import sys, wancompile.vae; print(sorted({'torch_xla', 'diffusers'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("frames, t_chunk", [(5, None), (9, 4)], ids=["full-T", "k=4"])
@pytest.mark.parametrize("name", ["tiny-wan2.1", "tiny-wan2.2"])
def test_split_estimate_bounds_one_tile_s_measured_peak_within_2_5x(name, frames, t_chunk):
    """With ``split=(2, 4)`` the estimate is one device's share: the decode of one tile of the latent
    (ceil(8/2) x ceil(12/4)), which it bounds with the tiles' halos counted."""
    vae = build_vae(name)
    shape, split = (1, vae.config.z_dim, frames, 8, 12), (2, 4)
    tile = torch.randn(*shape[:3], math.ceil(8 / split[0]), math.ceil(12 / split[1]))
    wvae.enable_full_t(vae, t_chunk)
    with torch.no_grad(), PeakLiveBytes() as measured:
        vae.decode(tile)
    estimate = wvae.decode_memory(vae.config, shape, split=split).peak(t_chunk)
    assert measured.peak <= estimate <= 2.5 * measured.peak
    assert estimate < wvae.decode_memory(vae.config, shape).peak(t_chunk) / 2


def test_a_spatially_split_plan_gets_larger_chunks_that_still_fit():
    """`vae="auto"` sizes the chunk for the tile a spatial VAE plan leaves on each device
    (`wancompile.pipeline.spatial_split`), so the chunk grows with the split and still fits the budget."""
    from planner.mesh import parse_mesh
    from planner.vae_plan import plan_vae
    from wancompile.capture import annotate, capture_fx
    from wancompile.pipeline import spatial_split
    from wancompile.vae.legalize import fold_conv_padding

    vae = wvae.enable_full_t(build_vae("tiny-wan2.1"))
    gm = fold_conv_padding(capture_fx(vae.decode, torch.randn(1, vae.config.z_dim, 3, 8, 8)))[0]
    graph = annotate(gm, model="tiny-wan2.1")
    split = spatial_split(plan_vae(graph, parse_mesh("2x4"), "wh-loudbox", preset="spatial"))
    assert split[0] * split[1] == 8
    assert spatial_split(plan_vae(graph, parse_mesh("2x4"), "wh-loudbox", preset="replicated")) == (1, 1)

    config, shape = VAE_CONFIGS["wan2.1"], (1, 16, 21, 90, 160)
    for budget_gib in (12, 24, 48):
        budget = budget_gib * GiB
        whole = wvae.choose_t_chunk(config, shape, budget, element_bytes=2)
        tiled = wvae.choose_t_chunk(config, shape, budget, element_bytes=2, split=split)
        assert whole is not None and (tiled is None or tiled > whole), (budget_gib, whole, tiled)
        assert wvae.decode_memory(config, shape, element_bytes=2, split=split).peak(tiled) <= budget
