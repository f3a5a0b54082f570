"""Under torch.compile, full-T `vae.decode` is one graph and chunked-T one graph per chunk shape."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

import wancompile.vae as wvae
from wancompile.vae.configs import build_vae


class CountingBackend:
    """A dynamo backend that records each captured graph and runs it as is."""

    def __init__(self):
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward

    def symbolic_inputs(self) -> list[str]:
        return [
            node.name
            for gm in self.graphs
            for node in gm.graph.find_nodes(op="placeholder")
            if isinstance(node.meta.get("example_value"), torch.SymInt)
            or any(isinstance(d, torch.SymInt) for d in getattr(node.meta.get("example_value"), "shape", ()))
        ]


@pytest.fixture
def vae():
    torch._dynamo.reset()
    yield build_vae("tiny-wan2.2")
    torch._dynamo.reset()


def latents(frames, z_dim=48):
    return torch.randn(1, z_dim, frames, 6, 10, generator=torch.Generator().manual_seed(0))


def compiled_decode(vae, t_chunk, z, fullgraph=False):
    backend = CountingBackend()
    wvae.enable_full_t(vae, t_chunk)
    decode = torch.compile(vae.decode, backend=backend, fullgraph=fullgraph)
    with torch.no_grad():
        out = decode(z).sample
        again = decode(z).sample  # same shapes: no new graph
    wvae.disable_full_t(vae)
    torch.testing.assert_close(again, out, rtol=0, atol=0)
    return backend, out


def eager_decode(vae, z):
    with torch.no_grad():
        return vae.decode(z).sample


def test_full_t_decode_is_one_graph(vae):
    z = latents(5)
    backend, out = compiled_decode(vae, None, z, fullgraph=True)
    assert len(backend.graphs) == 1
    assert backend.symbolic_inputs() == []
    assert (out - eager_decode(vae, z)).abs().max().item() <= 1e-5


@pytest.mark.parametrize(
    ("frames", "t_chunk", "graphs"),
    [
        (5, 2, 2),  # frame 0, then two chunks of 2: one graph each for the first frame and the 2-frame chunk
        (5, 4, 2),  # frame 0, then one chunk of 4
        (7, 4, 3),  # frame 0, a chunk of 4, and a last chunk of 2 with its own static graph
    ],
)
def test_chunked_decode_is_one_graph_per_chunk_shape(vae, frames, t_chunk, graphs):
    z = latents(frames)
    backend, out = compiled_decode(vae, t_chunk, z)
    assert len(backend.graphs) == graphs
    assert backend.symbolic_inputs() == []
    assert (out - eager_decode(vae, z)).abs().max().item() <= 1e-5
