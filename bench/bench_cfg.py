"""CFG parallel, costed: the planner's choice for full-size Wan 2.2 T2V-A14B (both experts resident).

    PYTHONPATH=. python bench/bench_cfg.py

One denoising step = cond + uncond. Per resolution and mesh, the batch-2 graph (the CFG pair as one
forward, captured on the meta device: 2 blocks, planned for 40) is planned by `planner.cfg.plan_dit`,
which prices every option: ``off`` (the batch-2 plan on the whole mesh), ``split(AXIS)`` (AXIS
halved: one branch per half, the batch-1 plan on the submesh; by default only the major-most axis, here
``batch``; ``split(model)`` — cfg between the two axes — is priced with ``cfg_axes=("model",)`` and is
not what GSPMD compiles exactly, see planner/cfg.py) and ``sequential`` (two batch-1 forwards on the whole
mesh, what WanPipeline runs without CFG batching; offered as compile_pipeline's CFG wrapper offers it,
``cfg_pair_splittable=True``). For reference the table also gives two batch-1 forwards planned on the batch-1
graph (`plan_graph`, x2). Printed as
a markdown table: predicted ms per step (compute + comm), GB per device, the option chosen under
``auto``, and where an option has no plan, the budget and the smallest budget that plans it (solved).
Rows for both experts resident (the A14B pipeline) and for one.
"""

from __future__ import annotations

import torch

CASES = (("2x4", "wh-loudbox"), ("8x4", "wh-galaxy"))
MODEL = "wan2.2-t2v-a14b"


def capture(resolution: str, batch: int, layers: int = 2):
    from wancompile.capture import capture_module
    from wancompile.models import build_transformer, transformer_inputs

    m = build_transformer(MODEL, device="meta", num_layers=layers).to(torch.bfloat16)
    inp = transformer_inputs(MODEL, resolution, 81, device="meta", dtype=torch.bfloat16, batch=batch)
    return capture_module(m, **inp, return_dict=False, model=MODEL)[0]


def _cell(o, hw) -> str:
    if o.feasible:
        return (
            f"{o.step_seconds * 1e3:.0f} = {o.compute_seconds * 1e3:.0f} + {o.comm_seconds * 1e3:.0f} "
            f"({o.memory_bytes_per_device / 1e9:.1f} GB)"
        )
    if o.memory_needed_bytes is not None:
        return f"no plan fits {float(hw.dram_bytes) / 1e9:.0f} GB (needs {o.memory_needed_bytes / 1e9:.1f})"
    return f"no plan: {o.reason}"


def main() -> None:
    from planner import plan_graph
    from planner.cfg import CfgInfeasible, plan_dit
    from planner.hardware import get_profile
    from planner.mesh import parse_mesh
    from planner.plan import PlanError

    print("ms per denoising step = compute + comm (GB per device)\n")
    print(
        "| res | mesh | hardware | experts resident | 2× batch-1 fwd ms | off | split(batch) | split(model), on request "
        "| sequential | chosen (auto) | 2× batch-1 / chosen |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for res in ("480p", "720p"):
        g1, g2 = capture(res, 1), capture(res, 2)
        for mesh_s, hw_name in CASES:
            mesh, hw = parse_mesh(mesh_s), get_profile(hw_name)
            for experts in (2, 1):
                two_s = None
                try:
                    single = plan_graph(g1, mesh, hw, num_blocks=40, weight_sets=experts)
                    two_s = 2 * single.predicted.step_seconds
                    two = f"{two_s * 1e3:.0f}"
                except PlanError:
                    two = "no plan fits"
                try:
                    plan = plan_dit(
                        g2, mesh, hw, cfg_parallel="auto", cfg_pair_splittable=True, num_blocks=40, weight_sets=experts
                    )
                    options, chosen = plan.cfg_parallel.options, plan.cfg_parallel.chosen  # "sequential" too
                except CfgInfeasible as e:  # no option fits memory: the row says what each needs
                    options, chosen = e.options, "none fits"
                by = {o.name: o for o in options}
                try:  # cfg between batch and model: priced on request only (planner/cfg.py, not HLO-exact)
                    extra = plan_dit(
                        g2, mesh, hw, cfg_parallel="on", cfg_axes=("model",), num_blocks=40, weight_sets=experts
                    ).cfg_parallel.options
                except CfgInfeasible as e:
                    extra = e.options
                by.update({o.name: o for o in extra if o.name not in by})
                win = by.get(chosen)
                ratio = f"{two_s / win.step_seconds:.2f}" if win is not None and two_s else "–"
                names = ("off", "split(batch)", "split(model)", "sequential")
                cells = [_cell(by[n], hw) if n in by else "–" for n in names]
                print(
                    f"| {res} | {mesh_s} | {hw_name} | {experts} | {two} | "
                    + " | ".join(cells)
                    + f" | **{chosen}** | {ratio} |"
                )


if __name__ == "__main__":
    from _docs import main_writing

    main_writing(main, "bench-cfg.md", "CFG parallel, costed: A14B per denoising step")
