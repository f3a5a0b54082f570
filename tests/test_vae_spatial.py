"""Experiment: the full-T decode sharded on H and W over a 2x2 mesh of virtual CPU devices (torch_xla SPMD).

Every conv output of the decoder is constrained to stay sharded on (H, W), as a spatial plan would;
the latent enters sharded the same way. The partitioned program must match the unsharded one and
exchange halos (collective-permutes) instead of gathering images. The child process owns its device
count, so this test runs it as a subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

MESH_SHAPE = (2, 2)
AXES = ("h", "w")
FRAMES, LATENT_HW = 3, (6, 10)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny-wan2.1", "tiny-wan2.2"])
def test_spatially_sharded_full_t_decode_matches_and_exchanges_halos(tmp_path, name):
    from wancompile.runtime import subprocess_env

    result_path = tmp_path / "result.json"
    env = subprocess_env(MESH_SHAPE[0] * MESH_SHAPE[1], tmp_path / "hlo")
    subprocess.run(
        [sys.executable, __file__, name, str(tmp_path / "hlo"), str(result_path)], env=env, check=True, timeout=600
    )
    result = json.loads(result_path.read_text())
    print(json.dumps(result, indent=1))

    assert result["pcc"] >= 0.99999
    assert result["sharded_programs"] == 1  # no host fallback cutting the decode apart
    counts = result["collectives"]
    # a 3x3 conv on a tile needs a halo row or column from each neighbour, on both sharded axes
    assert counts.get("collective-permute", 0) >= 4 * result["spatial_convs"]
    # beyond halos, only the mid-block attention (latent resolution, full H*W per frame) communicates
    assert all(c["bytes"] <= result["mid_block_qkv_bytes"] for c in result["non_halo"])


def _child(name: str, dump_dir: Path, result_path: Path) -> None:
    import numpy as np
    import torch
    import torch_xla
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d

    import wancompile.vae as wvae
    from planner.mesh import MeshSpec
    from wancompile.hlo import dumped_modules, main_module, parse_collectives
    from wancompile.vae.configs import build_vae

    xr.use_spmd()
    mesh = xs.Mesh(np.arange(xr.global_runtime_device_count()), MESH_SHAPE, AXES)
    spatial = {5: (None, None, None, *AXES), 4: (None, None, *AXES)}
    device = torch_xla.device()
    vae = wvae.enable_full_t(build_vae(name)).to(device)
    z = torch.randn(1, vae.config.z_dim, FRAMES, *LATENT_HW, generator=torch.Generator().manual_seed(0))
    convs = [m for m in vae.decoder.modules() if isinstance(m, (WanCausalConv3d, torch.nn.Conv2d))]

    def decode(latents):
        with torch.no_grad():
            out = vae.decode(latents).sample
        torch_xla.sync()
        return out.cpu()

    expected = decode(z.to(device))
    before = set(dumped_modules(dump_dir))

    def keep_spatial(module, args, output):
        xs.mark_sharding(output, mesh, spatial[output.dim()])

    hooks = [conv.register_forward_hook(keep_spatial) for conv in convs]
    latents = z.to(device)
    xs.mark_sharding(latents, mesh, spatial[5])
    out = decode(latents)
    for hook in hooks:
        hook.remove()

    programs = [p for p in dumped_modules(dump_dir) if p not in before and "SyncTensorsGraph" in p.name]
    collectives = parse_collectives(main_module(programs).read_text(), MeshSpec(MESH_SHAPE, AXES))
    counts: dict[str, int] = {}
    for c in collectives:
        counts[c.kind] = counts.get(c.kind, 0) + 1
    mid = vae.decoder.mid_block.resnets[0].out_dim
    result_path.write_text(
        json.dumps(
            {
                "pcc": float(np.corrcoef(expected.flatten().numpy(), out.flatten().numpy())[0, 1]),
                "max_abs": float((out - expected).abs().max()),
                "sharded_programs": len(programs),
                "spatial_convs": sum(conv.kernel_size[-1] > 1 for conv in convs),
                "collectives": counts,
                "by_axes": {
                    f"{c.kind} {','.join(c.axes)}": sum(1 for d in collectives if (d.kind, d.axes) == (c.kind, c.axes))
                    for c in collectives
                },
                "non_halo": [
                    {"kind": c.kind, "axes": c.axes, "shape": c.shape, "bytes": c.bytes}
                    for c in collectives
                    if c.kind != "collective-permute"
                ],
                "mid_block_qkv_bytes": 3 * mid * FRAMES * LATENT_HW[0] * LATENT_HW[1] * 4,
            }
        )
    )


if __name__ == "__main__":
    _child(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]))
