"""What the VAE decode's memory estimate (`wancompile.vae.budget`) says for the full-size configs.

Per VAE, video and spatial split: the latent each device holds (a tile: ceil(H/h) x ceil(W/w) latents), the
estimate's three terms per device (`decode_memory`: activations per latent frame, the temporal convs'
history carried between chunks, the decoded output held twice) and the full-T total, then the chunk size
`choose_t_chunk` picks under a 12, 32 and 96 GiB budget per device ("full-T" where the whole clip fits,
"no fit" where one latent frame does not). bf16, batch 1, 81 frames (21 latent frames). Pure arithmetic on
the configs: no model is built.

    PYTHONPATH=. python bench/bench_vae_budget.py [--write]
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FRAMES = 21  # latent frames of an 81-frame clip
BUDGETS_GIB = (12, 32, 96)
# (VAE, video, latent (H, W), spatial split (h, w))
ROWS = [
    ("wan2.1", "480p", (60, 104), (1, 1)),
    ("wan2.1", "480p", (60, 104), (2, 2)),
    ("wan2.1", "720p", (90, 160), (1, 1)),
    ("wan2.1", "720p", (90, 160), (2, 2)),
    ("wan2.1", "720p", (90, 160), (4, 8)),
    ("wan2.2", "720p", (44, 80), (1, 1)),
    ("wan2.2", "720p", (44, 80), (2, 2)),
]


def _gib(b: float) -> str:
    return f"{b / 2**30:.2f}"


def main() -> None:
    from wancompile.vae.budget import choose_t_chunk, decode_memory
    from wancompile.vae.configs import VAE_CONFIGS

    print(
        "| VAE | video | devices (H×W split) | latent per device | per frame GiB | history GiB | output GiB "
        "| full-T GiB | " + " | ".join(f"t_chunk at {b} GiB" for b in BUDGETS_GIB) + " |"
    )
    print("|---|---|---|---|---|---|---|---|" + "---|" * len(BUDGETS_GIB))
    for name, video, (height, width), (h, w) in ROWS:
        config = VAE_CONFIGS[name]
        shape = (1, config["z_dim"], FRAMES, height, width)
        memory = decode_memory(config, shape, element_bytes=2, split=(h, w))
        chunks = []
        for budget in BUDGETS_GIB:
            try:
                k = choose_t_chunk(config, shape, budget * 2**30, element_bytes=2, split=(h, w))
            except ValueError:
                k = "no fit"
            chunks.append("full-T" if k is None else str(k))
        devices = f"{h * w} ({h}×{w})" if h * w > 1 else "1"
        print(
            f"| {name} | {video} | {devices} | {math.ceil(height / h)}×{math.ceil(width / w)} | "
            f"{_gib(memory.per_frame)} | {_gib(memory.history)} | {_gib(memory.output)} | "
            f"{_gib(memory.peak(None))} | " + " | ".join(chunks) + " |"
        )


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "bench"))
    from _docs import main_writing

    main_writing(main, "vae-budget.md", "The VAE decode's memory estimate for the full-size configs")
