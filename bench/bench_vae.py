"""Full-T and chunked-T vs diffusers' streaming VAE decode, side by side on CPU.

For each decode mode of one tiny random-weight VAE: how dynamo captures `vae.decode` (graphs, FX nodes,
of which ops), eager wall time, and the max-abs difference to the streaming decode. Timing runs the
modes round-robin, --repeats rounds after a warm-up, and reports the fastest and the median round:
on a shared machine the fastest is the better estimate of the work itself.

    python bench/bench_vae.py [--config tiny-wan2.1] [--frames 9] [--latent 6x10] [--chunks 1,4] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch._dynamo

import wancompile.vae as wvae
from wancompile.vae.configs import VAE_CONFIGS, build_vae


class Mode:
    """One way to decode: diffusers' streaming decode (`t_chunk="streaming"`), full-T (None) or chunked-T (k)."""

    def __init__(self, t_chunk):
        self.t_chunk = t_chunk
        self.name = {"streaming": "streaming (diffusers)", None: "full-T"}.get(t_chunk, f"chunked k={t_chunk}")

    def decode(self, vae, z) -> torch.Tensor:
        self._install(vae)
        try:
            with torch.no_grad():
                return vae.decode(z).sample
        finally:
            wvae.disable_full_t(vae)

    def graphs(self, vae, z) -> list[torch.fx.GraphModule]:
        captured = []

        def record(gm, example_inputs):
            captured.append(gm)
            return gm.forward

        self._install(vae)
        torch._dynamo.reset()
        try:
            with torch.no_grad():
                torch.compile(vae.decode, backend=record)(z)
        finally:
            wvae.disable_full_t(vae)
            torch._dynamo.reset()
        return captured

    def _install(self, vae):
        if self.t_chunk != "streaming":
            wvae.enable_full_t(vae, self.t_chunk)


def timings(modes: list[Mode], vae, z, repeats: int) -> dict[str, list[float]]:
    seconds = {mode.name: [] for mode in modes}
    for mode in modes:
        mode.decode(vae, z)  # warm-up
    for _ in range(repeats):
        for mode in modes:
            start = time.perf_counter()
            mode.decode(vae, z)
            seconds[mode.name].append(time.perf_counter() - start)
    return seconds


def measure(vae, z, modes: list[Mode], repeats: int) -> list[dict]:
    reference = modes[0].decode(vae, z)
    seconds = timings(modes, vae, z, repeats)
    rows = []
    for mode in modes:
        graphs = mode.graphs(vae, z)
        nodes = [node for gm in graphs for node in gm.graph.nodes]
        rows.append(
            {
                "mode": mode.name,
                "graphs": len(graphs),
                "fx_nodes": len(nodes),
                "fx_ops": sum(node.op.startswith("call_") for node in nodes),
                "eager_s_min": min(seconds[mode.name]),
                "eager_s_median": statistics.median(seconds[mode.name]),
                "max_abs_vs_streaming": (mode.decode(vae, z) - reference).abs().max().item(),
            }
        )
    return rows


def print_table(title: str, rows: list[dict]) -> None:
    print(title)
    header = (
        f"{'mode':<22} {'graphs':>6} {'FX nodes':>9} {'FX ops':>7} {'eager s (min)':>14} {'(median)':>9} "
        f"{'max|Δ| vs streaming':>20}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['mode']:<22} {r['graphs']:>6} {r['fx_nodes']:>9} {r['fx_ops']:>7} {r['eager_s_min']:>14.3f} "
            f"{r['eager_s_median']:>9.3f} {r['max_abs_vs_streaming']:>20.2e}"
        )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="tiny-wan2.1", choices=[n for n in VAE_CONFIGS if n.startswith("tiny")])
    parser.add_argument("--frames", type=int, default=9, help="latent frames")
    parser.add_argument("--latent", default="6x10", help="latent HxW")
    parser.add_argument("--chunks", default="1,4", help="chunk sizes for the chunked-T rows, comma-separated")
    parser.add_argument("--repeats", type=int, default=5, help="timing rounds")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    args = parser.parse_args(argv)

    vae = build_vae(args.config)
    height, width = (int(v) for v in args.latent.split("x"))
    z = torch.randn(1, vae.config.z_dim, args.frames, height, width, generator=torch.Generator().manual_seed(0))
    modes = [Mode("streaming"), Mode(None), *(Mode(int(k)) for k in args.chunks.split(",") if k)]
    rows = measure(vae, z, modes, args.repeats)

    if args.json:
        print(json.dumps({"config": args.config, "latent": list(z.shape), "rows": rows}, indent=2))
    else:
        print_table(
            f"{args.config}, latent {tuple(z.shape)}, torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads, {args.repeats} rounds",
            rows,
        )


if __name__ == "__main__":
    from _docs import main_writing

    main_writing(main, "bench-vae.md", "VAE decode on virtual CPU devices")
