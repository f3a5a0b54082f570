"""FX op counts before/after each rewrite, on the tiny DiT and VAE and on full-size Wan 2.2 T2V-A14B.

    PYTHONPATH=. python bench/bench_rewrites.py [--layers 40] [--resolution 480p] [--sp-multiple 256]

The A14B transformer is built and captured on the meta device (no weights, no accelerator); 40 layers
take about 10 s to capture on 2 cores, ``--layers 2`` is enough to see the per-block effect. An op is
an FX node that computes (call_function / call_method / call_module); "compute" counts the linears,
convs, norms and attentions among them. Prints one table: ops before, then each pass's change.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.fx as fx

from rewrites import PASS_NAMES, RewriteContext, apply_rewrites


def capture(fn, *args) -> list[fx.GraphModule]:
    from wancompile.capture import record_graphs

    return record_graphs(fn, *args)


def fresh(gm: fx.GraphModule) -> fx.GraphModule:
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    return fx.GraphModule(gm, graph)


COMPUTE = {
    torch._C._nn.linear,
    torch.conv1d,
    torch.conv2d,
    torch.conv3d,
    torch.nn.functional.normalize,
    torch.nn.functional.rms_norm,
    torch.rms_norm,
    torch.nn.functional.layer_norm,
    torch._C._nn.scaled_dot_product_attention,
}


def ops(graphs: list[fx.GraphModule]) -> int:
    return sum(n.op.startswith("call") for gm in graphs for n in gm.graph.nodes)


def compute_ops(graphs: list[fx.GraphModule]) -> int:
    """Linears, convs, norms and attentions: the ops a kernel launch is spent on."""
    return sum(n.op == "call_function" and n.target in COMPUTE for gm in graphs for n in gm.graph.nodes)


def tiny_dit() -> list[fx.GraphModule]:
    from wancompile.models import build_transformer

    model = build_transformer("tiny")
    x = torch.randn(1, 4, 5, 6, 6)  # 45 tokens
    return capture(lambda *a: model(*a, return_dict=False), x, torch.tensor([500]), torch.randn(1, 7, 32))


def tiny_vae() -> list[fx.GraphModule]:
    from diffusers import AutoencoderKLWan

    vae = AutoencoderKLWan(
        base_dim=8,
        z_dim=4,
        dim_mult=[1, 2],
        num_res_blocks=1,
        temperal_downsample=[True],
        latents_mean=[0.0] * 4,
        latents_std=[1.0] * 4,
    ).eval()
    return capture(lambda z: vae.decode(z, return_dict=False), torch.randn(1, 4, 2, 4, 4))


def a14b(layers: int, resolution: str) -> list[fx.GraphModule]:
    from wancompile.models import build_transformer, transformer_inputs

    model = build_transformer("wan2.2-t2v-a14b", device="meta", num_layers=layers)
    inputs = transformer_inputs("wan2.2-t2v-a14b", resolution, 81, device="meta")
    x, t, prompt = inputs["hidden_states"], inputs["timestep"], inputs["encoder_hidden_states"]
    return capture(lambda *a: model(*a, return_dict=False), x, t, prompt)


def measure(graphs: list[fx.GraphModule], context: RewriteContext) -> dict[str, tuple[int, int, int, float]]:
    """pass → (ops after, compute ops after, sites rewritten, seconds), plus "none" (before) and "all"."""
    rows = {"none": (ops(graphs), compute_ops(graphs), 0, 0.0)}
    for name in (*PASS_NAMES, "all"):
        copies = [fresh(gm) for gm in graphs]
        start = time.perf_counter()
        sites = sum(r.count for gm in copies for r in apply_rewrites(gm, [name] if name != "all" else name, context)[1])
        rows[name] = (ops(copies), compute_ops(copies), sites, time.perf_counter() - start)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=40, help="A14B blocks to build (40 is the real model)")
    parser.add_argument("--resolution", choices=("480p", "720p"), default="480p")
    parser.add_argument("--sp-multiple", type=int, default=8 * 32, help="sp_pad multiple (SP degree × tile)")
    args = parser.parse_args()
    context = RewriteContext(sp_multiple=args.sp_multiple)
    tiny_context = RewriteContext(sp_multiple=4)

    columns = []
    for title, build, ctx in (
        ("tiny DiT (2 blocks, 45 tokens, sp×4)", tiny_dit, tiny_context),
        ("tiny VAE decode (2 latent frames)", tiny_vae, tiny_context),
        (
            f"A14B meta ({args.layers} blocks, {args.resolution}, sp×{args.sp_multiple})",
            lambda: a14b(args.layers, args.resolution),
            context,
        ),
    ):
        start = time.perf_counter()
        graphs = build()
        print(f"captured {title}: {len(graphs)} graph(s), {ops(graphs)} ops in {time.perf_counter() - start:.1f} s")
        columns.append((title, measure(graphs, ctx)))

    print()
    print("| pass | " + " | ".join(title for title, _ in columns) + " |")
    print("|---|" + "---|" * len(columns))
    for name in ("none", *PASS_NAMES, "all"):
        cells = []
        for _, rows in columns:
            after, compute, sites, seconds = rows[name]
            before, compute_before = rows["none"][:2]
            cells.append(
                f"{after} ops, {compute} compute"
                if name == "none"
                else f"{after - before:+d} ops, {compute - compute_before:+d} compute, {sites} sites, {seconds:.2f} s"
            )
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    from _docs import main_writing

    main_writing(main, "bench-rewrites.md", "Rewrites on full-size A14B: what each changes in the plan")
