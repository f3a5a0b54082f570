"""CFG parallel, costed: the planner's choice for full-size Wan 2.2 T2V-A14B (both experts resident).

    PYTHONPATH=. python bench/bench_cfg.py

One denoising step = cond + uncond. Per resolution and mesh, the batch-2 graph (the CFG pair as one
forward, captured on the meta device: 2 blocks, planned for 40) is planned by `planner.cfg.plan_dit`,
which prices every option: ``off`` (the batch-2 plan on the whole mesh) and ``split(AXIS)`` (AXIS
halved: one branch per half, the batch-1 plan on the submesh). For reference the table also gives two
sequential batch-1 forwards on the whole mesh (what WanPipeline runs without CFG batching). Printed as
a markdown table: predicted ms per step, GB per device, the option chosen under ``auto``, and why an
option has no plan (memory).
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


def _ms(o) -> str:
    return f"{o.step_seconds * 1e3:.0f}" if o.feasible else "no plan"


def _gb(o) -> str:
    return f"{o.memory_bytes_per_device / 1e9:.1f}" if o.feasible else "–"


def main() -> None:
    from planner import plan_graph
    from planner.cfg import CfgInfeasible, plan_dit
    from planner.hardware import get_profile
    from planner.mesh import parse_mesh
    from planner.plan import PlanError

    print("| res | mesh | hardware | 2× batch-1 fwd ms | off: ms/step | off GB/dev | split | split: ms/step | split comm ms "
          "| split GB/dev | chosen (auto) | off / split | why an option has no plan |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for res in ("480p", "720p"):
        g1, g2 = capture(res, 1), capture(res, 2)
        for mesh_s, hw_name in CASES:
            mesh, hw = parse_mesh(mesh_s), get_profile(hw_name)
            try:
                two = f"{2 * plan_graph(g1, mesh, hw, num_blocks=40, weight_copies=2).predicted.step_seconds * 1e3:.0f}"
            except PlanError:
                two = "no plan"
            try:
                options, chosen = None, None
                plan = plan_dit(g2, mesh, hw, cfg_parallel="auto", num_blocks=40, weight_copies=2)
                options, chosen = plan.cfg_parallel.options, plan.cfg_parallel.chosen
            except CfgInfeasible as e:  # no option fits memory: the table says what each needs
                options, chosen = e.options, "none fits"
            off = next(o for o in options if o.name == "off")
            splits = [o for o in options if o.split_axis is not None]
            best = min((o for o in splits if o.feasible), key=lambda o: o.step_seconds, default=splits[0])
            ratio = f"{off.step_seconds / best.step_seconds:.2f}" if off.feasible and best.feasible else "–"
            why = "; ".join(f"{o.name}: needs ≥ {o.memory_needed_bytes / 1e9:.1f} GB/device > {float(hw.dram_bytes) / 1e9:.0f} GB"
                            if o.memory_needed_bytes is not None else f"{o.name}: {o.reason}"
                            for o in options if not o.feasible) or "–"
            comm = f"{best.comm_seconds * 1e3:.0f}" if best.feasible else "–"
            print(f"| {res} | {mesh_s} | {hw_name} | {two} | {_ms(off)} | {_gb(off)} | {best.name} on {best.mesh} | {_ms(best)} | "
                  f"{comm} | {_gb(best)} | **{chosen}** | {ratio} | {why} |")


if __name__ == "__main__":
    main()
