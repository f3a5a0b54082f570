"""Full-size VAE decode plans on the meta device: auto vs the seed's channel Megatron vs replicated,
full-T vs chunked-T, under one cost model.

    python bench/bench_vae_plan.py [--config wan2.1] [--video 720p] [--frames 81]

The Wan 2.1 VAE (A14B's) is built on the meta device (no weights), `enable_full_t`, captured by
dynamo in bf16 and planned for each mesh/profile. Full-T plans the 21-latent-frame decode graph.
Chunked-T (t_chunk from `choose_t_chunk` under the device DRAM, latent H/W divided by the plan's
spatial split) is priced from full-T graphs planned with the same preset: frame 0 alone is the
1-frame graph P(1) (one pixel frame), and a chunk of k later frames is P(k + 1) - P(1) (the k + 1
frame graph decodes 1 + 4k pixel frames). The real chunk graph differs by its carried history (2
frames concatenated in front of every temporal conv, about 2/k more conv input), so chunked-T time
is slightly under-estimated. Memory per device is the plan's (parameters + 3 x the largest per-op
live set); for chunked-T that of the k + 1 frame graph (an over-estimate of one chunk).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VIDEOS = {"720p": (720, 1280), "480p": (480, 832)}
MESHES = (("wh-galaxy", "8x4"), ("wh-loudbox", "2x4"))
PLANS = (("auto", "auto"), ("channel-megatron (seed)", "channel-megatron"), ("replicated", "replicated"))


def capture(config: str, latent: tuple):
    import torch

    import wancompile.vae as wvae
    from wancompile.capture import annotate, capture_fx
    from wancompile.vae.configs import build_vae
    from wancompile.vae.legalize import fold_conv_padding

    vae = wvae.enable_full_t(build_vae(config, device="meta", dtype=torch.bfloat16))
    z = torch.empty(latent, device="meta", dtype=torch.bfloat16)
    return vae, annotate(fold_conv_padding(capture_fx(vae.decode, z))[0], model=f"{config}-vae")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="wan2.1")
    ap.add_argument("--video", default="720p", choices=sorted(VIDEOS))
    ap.add_argument("--frames", type=int, default=81)
    args = ap.parse_args()

    from planner.hardware import get_profile
    from planner.mesh import parse_mesh
    from planner.vae_plan import plan_vae
    from wancompile.vae import choose_t_chunk
    from wancompile.vae.configs import VAE_CONFIGS

    config = VAE_CONFIGS[args.config]
    h, w = VIDEOS[args.video]
    scale = config.get("scale_factor_spatial", 8)
    latent_t = (args.frames - 1) // 4 + 1
    latent = (1, config["z_dim"], latent_t, h // scale, w // scale)
    graphs = {}
    t0 = time.perf_counter()
    _, graphs[latent_t] = capture(args.config, latent)
    print(
        f"{args.config} VAE decode {args.video} x {args.frames} frames, latent {latent}: captured full-T on meta in "
        f"{time.perf_counter() - t0:.1f} s ({len(graphs[latent_t])} nodes)"
    )

    rows = []
    for profile, mesh_name in MESHES:
        hw = get_profile(profile)
        mesh = parse_mesh(mesh_name)
        dram = float(hw.dram_bytes)
        for label, preset in PLANS:
            t0 = time.perf_counter()
            # priced without a memory limit so every plan has a number; "fits" says whether it fits the device
            plan = plan_vae(graphs[latent_t], mesh, hw, preset=preset, memory_gb=1e6)
            solve_s = time.perf_counter() - t0
            p = plan.predicted
            split = _split(plan)
            rows.append(
                (
                    profile,
                    mesh_name,
                    label,
                    "full-T",
                    p.step_seconds,
                    p.comm_seconds,
                    p.memory_bytes_per_device,
                    p.memory_bytes_per_device <= dram,
                    split,
                    solve_s,
                )
            )
            per_device = (1, latent[1], latent_t, math.ceil(latent[3] / split[0]), math.ceil(latent[4] / split[1]))
            try:
                k = choose_t_chunk(config, per_device, int(dram), element_bytes=2)
            except ValueError:
                k = 1
            if k is None:
                rows.append((profile, mesh_name, label, "chunked-T: full-T fits", None, None, None, None, split, 0.0))
                continue
            chunks = [min(k, latent_t - 1 - i) for i in range(0, latent_t - 1, k)]
            priced = {}
            for frames in {1, *(c + 1 for c in chunks)}:
                if frames not in graphs:
                    _, graphs[frames] = capture(args.config, latent[:2] + (frames,) + latent[3:])
                priced[frames] = plan_vae(graphs[frames], mesh, hw, preset=preset, memory_gb=1e6).predicted
            first = priced[1]
            total = first.step_seconds + sum(priced[c + 1].step_seconds - first.step_seconds for c in chunks)
            comm = first.comm_seconds + sum(priced[c + 1].comm_seconds - first.comm_seconds for c in chunks)
            memory = max(priced[c + 1].memory_bytes_per_device for c in chunks)
            rows.append(
                (profile, mesh_name, label, f"chunked-T k={k}", total, comm, memory, memory <= dram, split, 0.0)
            )

    print()
    print(
        "| profile | mesh | plan | decode | predicted s | comm s | memory GiB/device | fits DRAM | H x W split | solve s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for profile, mesh, label, mode, step, comm, mem, fits, split, solve_s in rows:
        if step is None:
            print(f"| {profile} | {mesh} | {label} | {mode} | | | | | | |")
            continue
        print(
            f"| {profile} | {mesh} | {label} | {mode} | {step:.3f} | {comm:.3f} | {mem / 2**30:.2f} | {'yes' if fits else 'no'} | "
            f"{split[0]} x {split[1]} | {solve_s:.1f} |"
        )


def _split(plan) -> tuple[int, int]:
    """H and W shard counts of the plan's residual blocks (1 x 1 if none is spatial)."""
    import re

    best = (1, 1)
    for d in plan.decisions:
        m = re.match(r"spatial\(H:([^,]*),W:([^)]*)\)", d.strategy)
        if m:
            n = [math.prod(plan.mesh.axis_size(a) for a in g.split("+")) if g != "-" else 1 for g in m.groups()]
            best = max(best, tuple(n), key=lambda t: t[0] * t[1])
    return best


if __name__ == "__main__":
    from _docs import main_writing

    main_writing(main, "bench-vae-plan.md", "Full-size VAE decode plans under one cost model")
