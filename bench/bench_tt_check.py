"""Tiny models through tt-mlir: ``wancompile tt-check`` for the plans docs/tenstorrent.md describes, one row a
configuration and system (each configuration in its own process: the virtual device count is fixed per process).

Each configuration compiles the tiny model's call on CPU with ``target="tt-mlir"`` (numerics against eager
fp32), then compiles its main program compile-only with tt-mlir for each system descriptor and reads the
TTNN IR (`wancompile.tt.check`). Columns: the configuration and its ``tt-check`` flags; the system; TTNN's
collectives per kind and chip-mesh axis (point-to-point transfers counted one by one), each with the plan's
prediction where it differs; whether every (kind, axis) is as predicted; the PCC of the CPU run against
eager fp32.

    PYTHONPATH=. python bench/bench_tt_check.py [--write]

(a few minutes on 2 cores: about 20 s a configuration.)
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# (what it is, mesh, systems, further tt-check flags); the DiT is `--model tiny`, the VAE `--component vae`
CONFIGS = [
    ("DiT, tt-xla plan", "2x4", ("bh-2x4", "wh-loudbox"), ["--plan", "tt-xla"]),
    ("DiT, tt-xla plan", "8x4", ("bh-galaxy",), ["--plan", "tt-xla"]),
    ("DiT, tt-xla plan, all rewrites", "2x4", ("bh-2x4",), ["--plan", "tt-xla", "--rewrites", "all"]),
    ("DiT, auto at its smallest budget", "2x4", ("bh-2x4", "wh-loudbox"), ["--memory-gb", "0.00025"]),
    ("DiT, auto at its smallest budget", "8x4", ("bh-galaxy",), ["--memory-gb", "0.0002"]),
    ("DiT, auto, all rewrites", "2x4", ("bh-2x4", "wh-loudbox"), ["--memory-gb", "0.000256", "--rewrites", "all"]),
    ("DiT, CFG pair as one batch-2 forward", "2x4", ("bh-2x4",), ["--batch", "2", "--cfg-parallel", "on"]),
    (
        "DiT, CFG pair as one batch-2 forward, tight",
        "2x4",
        ("bh-2x4",),
        ["--batch", "2", "--cfg-parallel", "on", "--memory-gb", "0.0004"],
    ),
    ("DiT, CFG pair as one batch-2 forward", "8x4", ("bh-galaxy",), ["--batch", "2"]),
    ("VAE decode full-T, auto (Wan 2.1)", "2x4", ("bh-2x4",), ["--component", "vae", "--model", "tiny-wan2.1"]),
    ("VAE decode full-T, auto (Wan 2.2)", "8x4", ("bh-galaxy",), ["--component", "vae", "--model", "tiny-wan2.2"]),
    (
        "VAE decode full-T, auto, tight",
        "2x4",
        ("bh-2x4",),
        ["--component", "vae", "--model", "tiny-wan2.1", "--memory-gb", "0.0143"],
    ),
    (
        "VAE decode chunked-T, 1 frame",
        "2x4",
        ("bh-2x4",),
        ["--component", "vae", "--model", "tiny-wan2.1", "--t-chunk", "1"],
    ),
]

SHORT = {"all-gather": "AG", "all-reduce": "AR", "reduce-scatter": "RS"}


def _run(mesh: str, systems: tuple[str, ...], flags: list[str]) -> dict:
    from _tt_check import tt_check

    return tt_check(mesh, [*flags, *(a for system in systems for a in ("--system", system))])


def _collectives(program: dict) -> str:
    cells = []
    for c in program["collectives"]:
        name = SHORT.get(c["kind"], c["kind"])
        cell = f"{c['ttnn_count']} {name} `{'+'.join(c['axes']) or '-'}`"
        if c["ttnn_count"] != c["predicted_count"]:
            cell += f" (predicted {c['predicted_count']})"
        cells.append(cell)
    return ", ".join(cells) or "none"


def main() -> None:
    print("| configuration | mesh | `tt-check` flags | system | TTNN collectives (main program) | as predicted | PCC |")
    print("|---|---|---|---|---|---|---|")
    for what, mesh, systems, flags in CONFIGS:
        r = _run(mesh, systems, flags)
        head = f"| {what} | {mesh} | `{' '.join(flags)}` |"
        if "failed" in r:
            print(f"{head} {', '.join(systems)} | **failed**: {r['failed']} | | |")
            continue
        for p in r["programs"]:
            if p["program"].endswith(".fold"):
                continue
            if not p["compiled"]:
                print(f"{head} {p['system']} | **refused**: {p['error']} | no | {r['pcc']:.7f} |")
                continue
            ok = "yes" if p["as_predicted"] else "**no**"
            print(f"{head} {p['system']} | {p['program']}: {_collectives(p)} | {ok} | {r['pcc']:.7f} |", flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "bench"))
    from _docs import main_writing

    main_writing(main, "tt-check.md", "Tiny models through tt-mlir: TTNN's collectives against the prediction")
