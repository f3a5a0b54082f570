"""Full-size Wan through tt-mlir, without running it: ``wancompile tt-check --model M --blocks 2`` for the
configurations of issue 25 (each in its own process: the virtual device count is fixed per process).

Each row is the first 2 blocks at full width with the embedders and the output, bf16 as pipelines load the
model, planned for the whole model (all its blocks; A14B's two experts resident) with the system's profile
and compiled for that system (`wancompile.tt.fullsize`). Columns: compiled by tt-mlir; TTNN's collectives
against the plan's prediction (count per kind and chip-mesh axis; point-to-point transfers counted one by
one); the TTNN program's peak DRAM per chip (as allocated, 32x32 tiles and all; its data without the padding) and
the largest tensor at its peak; the planner's estimate for the same program (2 blocks, one weight set) and for
the whole model; the chip's DRAM; what it cost here (wall seconds, peak host memory of this process / of the
compiler). The VAE rows decode a whole 81-frame clip in one program (full-T), fp32 as Wan pipelines load it.

    PYTHONPATH=. python bench/bench_tt_full.py [--write]

(~7 min on 2 cores; up to 16 GiB of host memory for A14B at 720p on 8x4.)
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# (model, resolution, frames, mesh, system); a VAE (wan2.1, wan2.2) decodes the whole clip in one program
CONFIGS = [
    ("wan2.2-t2v-a14b", "480p", 81, "2x4", "wh-loudbox"),
    ("wan2.2-t2v-a14b", "480p", 81, "2x4", "bh-2x4"),
    ("wan2.2-t2v-a14b", "720p", 81, "8x4", "wh-galaxy"),
    ("wan2.2-t2v-a14b", "720p", 81, "8x4", "bh-galaxy"),
    ("wan2.2-ti2v-5b", "720p", 121, "8x4", "bh-galaxy"),
    ("wan2.1", "480p", 81, "2x4", "wh-loudbox"),
    ("wan2.1", "480p", 81, "2x4", "bh-2x4"),
]
VAES = ("wan2.1", "wan2.2")


def _run(model: str, resolution: str, frames: int, mesh: str, system: str) -> dict:
    from _tt_check import tt_check

    args = ["--model", model, "--resolution", resolution, "--frames", str(frames)]
    args += ["--component", "vae"] if model in VAES else ["--blocks", "2"]
    report = tt_check(mesh, [*args, "--system", system])
    if "failed" not in report:
        report["main"] = next(p for p in report["programs"] if ".fold" not in p["program"])
    return report


def _gib(b) -> str:
    return f"{b / 2**30:.2f}"


def main() -> None:
    from planner.hardware import get_profile
    from wancompile.tt.env import SYSTEM_PROFILES

    print(
        "| model | resolution (tokens) | system | compiled | TTNN collectives | TTNN peak DRAM per chip, GiB (at) "
        "| planner, GiB: the program / the whole model | chip DRAM, GiB | fits | here: s, host / compiler GiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for model, res, frames, mesh, system in CONFIGS:
        r = _run(model, res, frames, mesh, system)
        if "failed" in r:  # a plan error is the planner's answer (e.g. no full-T plan fits): said as such
            label = "**no plan**" if "no plan fits" in r["failed"] else "**failed**"
            print(f"| {model} | {res} | {system} ({mesh}) | {label}: {r['failed']} | | | | | | |")
            continue
        m = r["main"]
        chip = get_profile(SYSTEM_PROFILES[system]).dram_bytes.value
        if not m["compiled"]:
            print(f"| {model} | {res} ({r['tokens']}) | {system} ({mesh}) | **refused**: {m['error']} | | | | | | |")
            continue
        total = sum(c["ttnn_count"] for c in m["collectives"])
        same = (
            "== predicted"
            if m["as_predicted"]
            else "**differs**: "
            + ", ".join(
                f"{c['kind']} {'+'.join(c['axes'])} {c['ttnn_count']} / {c['predicted_count']}"
                for c in m["collectives"]
                if c["ttnn_count"] != c["predicted_count"]
            )
        )
        mem = m["memory"]
        fits = "yes" if mem["peak_bytes"] <= chip else f"no ({mem['peak_bytes'] / chip:.1f}x)"
        secs = sum(r["seconds"].values())
        print(
            f"| {model} | {res} ({r['tokens']}) | {system} ({mesh}) | yes | {total} ({same}) | "
            f"{_gib(mem['peak_bytes'])}, data {_gib(mem['peak_logical_bytes'])} ({mem['peak_op']}; largest "
            f"{mem['largest'][0][3]}) | "
            f"{_gib(mem['planned_bytes'])} / {_gib(r['planned_model_bytes'])} | {_gib(chip)} | {fits} | "
            f"{secs:.0f} s, {_gib(r['host_peak_bytes'])} / {_gib(r['compiler_peak_bytes'])} |"
        )


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "bench"))
    from _docs import main_writing

    main_writing(
        main,
        "tt-full-width.md",
        "Full-size Wan through tt-mlir, compiled without running",
        readme_block="tt-full-width",
    )
