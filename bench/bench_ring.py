"""Ring attention priced beside the planner's choice for full-size Wan 2.2 T2V-A14B's self-attention.

Per system and resolution: the first 2 blocks of A14B (bf16, 81 frames) captured on the meta device and
planned for all 40 blocks with both experts resident (``num_blocks=40, weight_copies=2``) on the system's 8x4
mesh, under its calibrated profile. Read from attn1's `Decision.ring` (`planner.decision.RingAttention`): the
chosen option and its time per forward (all 40 blocks), the ring counterpart's, what the ring would save (and
its share of the forward), and per call the ring's step compute, step transfer and the K/V all-gathers it
replaces. The ring is priced, not offered: no target here lowers it.

    PYTHONPATH=. python bench/bench_ring.py [--write]
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL, FRAMES, MESH = "wan2.2-t2v-a14b", 81, "8x4"
SYSTEMS = ("wh-galaxy", "bh-galaxy")
RESOLUTIONS = ("480p", "720p")


def _capture(resolution: str):
    import torch

    from wancompile.capture import capture_module
    from wancompile.models import build_transformer, transformer_inputs

    m = build_transformer(MODEL, device="meta", num_layers=2).to(torch.bfloat16)
    inp = transformer_inputs(MODEL, resolution, FRAMES, device="meta", dtype=torch.bfloat16)
    return capture_module(m, **inp, return_dict=False, model=MODEL)[0]


def main() -> None:
    from planner import plan_graph
    from planner.mesh import parse_mesh

    print(
        "| system | res | attn1 chosen | chosen, ms/forward | ring, ms/forward | ring saves | "
        "per call: step compute / step transfer / gathers replaced (ms) |"
    )
    print("|---|---|---|---|---|---|---|")
    for resolution in RESOLUTIONS:
        graph = _capture(resolution)
        for system in SYSTEMS:
            plan = plan_graph(graph, parse_mesh(MESH), system, num_blocks=40, weight_copies=2)
            d = next(x for x in plan.decisions if x.macro == "attn1")
            r = d.ring
            forward = plan.predicted.step_seconds
            print(
                f"| {system} | {resolution} | `{d.strategy}` | {r.chosen_seconds_own * 1e3:.1f} | "
                f"{r.seconds_own * 1e3:.1f} | {r.saves * 1e3:.1f} ms ({100 * r.saves / forward:.1f} % of "
                f"{forward * 1e3:.0f} ms/forward) | {r.step_compute_s * 1e3:.2f} / {r.step_transfer_s * 1e3:.2f} / "
                f"{r.gather_s * 1e3:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "bench"))
    from _docs import main_writing

    main_writing(main, "bench-ring.md", "Ring attention priced beside the choice: full-size A14B on the Galaxies")
