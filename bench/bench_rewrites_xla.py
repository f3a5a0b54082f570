"""XLA CPU time of one tiny DiT block, each rewrite on vs off, side by side in one run.

    python bench/bench_rewrites_xla.py [--repeats 30] [--tokens-frames 9]

One process, one XLA CPU device (mesh 1x1, so no collectives): every variant is compiled once through
backend="wan_autoshard" and then run `repeats` times, interleaved round-robin so machine noise hits
all variants alike. Reports the median of XLA's own execute-time metric per call (device work) and
the median wall time per call (which adds the lowering's per-call lazy tracing), and each variant's
ratio to the unrewritten graph. Parameter-only subgraphs are constant-folded by the lowering
(wancompile/fold.py); the "qkv, packed in-graph" row turns that off to show what it saves.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--frames", type=int, default=17, help="video frames (4k+1): 17 -> 5 latent frames, 80 tokens")
    args = p.parse_args()

    os.environ.setdefault("PJRT_DEVICE", "CPU")
    os.environ["CPU_NUM_DEVICES"] = "1"
    import torch
    import torch_xla.debug.metrics as met

    from wancompile.models import build_transformer, transformer_inputs

    model = build_transformer("tiny", num_layers=1)
    inputs = transformer_inputs("tiny", "tiny", args.frames)
    # "qkv, packed in-graph": the lowering's constant folding off (wancompile/fold.py), so the packed
    # weight is rebuilt on every call, as before folding existed.
    variants = {
        "none": "none",
        "qkv": ["qkv"],
        "qkv, packed in-graph": ["qkv"],
        "rope": ["rope"],
        "patch_embed": ["patch_embed"],
        "all": "all",
    }
    compiled = {}
    for name, rewrites in variants.items():
        torch._dynamo.reset()
        fn = torch.compile(
            model,
            backend="wan_autoshard",
            options={
                "mesh": "1x1",
                "plan": "tt-xla",
                "rewrites": rewrites,
                "fold_parameters": name != "qkv, packed in-graph",
            },
            fullgraph=True,
        )
        with torch.no_grad():
            fn(**inputs, return_dict=False)  # compile (and fold)
        compiled[name] = fn

    wall: dict[str, list[float]] = {n: [] for n in variants}
    device: dict[str, list[float]] = {n: [] for n in variants}
    for _ in range(args.repeats):
        for name, fn in compiled.items():
            before = _execute_ns(met)
            start = time.perf_counter()
            with torch.no_grad():
                fn(**inputs, return_dict=False)
            wall[name].append(time.perf_counter() - start)
            device[name].append((_execute_ns(met) - before) / 1e9)

    base_dev, base_wall = statistics.median(device["none"]), statistics.median(wall["none"])
    print(f"tiny DiT, 1 block, {args.frames} frames, XLA CPU, {args.repeats} interleaved runs per variant\n")
    print("| rewrites | XLA execute (median) | ratio | wall per call (median) | ratio |")
    print("|---|---|---|---|---|")
    for name in variants:
        d, w = statistics.median(device[name]), statistics.median(wall[name])
        print(f"| {name} | {d * 1e6:.0f} µs | {d / base_dev:.2f} | {w * 1e3:.2f} ms | {w / base_wall:.2f} |")


def _execute_ns(met) -> float:
    """Total ns XLA spent executing programs (SPMD programs count as ExecuteReplicatedTime)."""
    total = 0.0
    for name in ("ExecuteTime", "ExecuteReplicatedTime"):
        data = met.metric_data(name)
        total += float(data[1]) if data else 0.0  # (count, total ns, samples)
    return total


if __name__ == "__main__":
    from _docs import main_writing

    main_writing(main, "bench-rewrites-xla.md", "Rewrites measured through XLA on virtual CPU devices")
