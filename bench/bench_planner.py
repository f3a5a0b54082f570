"""Auto plan vs the tt-xla hand plan under the same cost model, and planner speed.

    PYTHONPATH=. python bench/bench_planner.py

Prints markdown tables: A14B (both experts resident) at 480p and 720p on wh-loudbox 2x4, wh-galaxy
8x4, bh-galaxy 8x4 and 1x4 (Wormhole LoudBox chips); wall time to plan full A14B; solve time vs
number of blocks. "ideal roofline" is the model's total FLOPs / (devices x peak) vs its bytes /
(devices x DRAM bandwidth), whatever the plan; where the hand plan does not fit memory with both
experts resident, the table says so and also compares auto with hand at one expert, memory ample.
"""

from __future__ import annotations

import time

import torch

CASES = (("2x4", "wh-loudbox"), ("8x4", "wh-galaxy"), ("8x4", "bh-galaxy"), ("1x4", "wh-loudbox"))


def capture(resolution: str, layers: int = 2):
    from wancompile.capture import capture_module
    from wancompile.models import build_transformer, transformer_inputs

    m = build_transformer("wan2.2-t2v-a14b", device="meta", num_layers=layers).to(torch.bfloat16)
    inp = transformer_inputs("wan2.2-t2v-a14b", resolution, 81, device="meta", dtype=torch.bfloat16)
    return capture_module(m, **inp, return_dict=False, model="wan2.2-t2v-a14b")[0]


def ideal_roofline(g, mesh, hw, num_blocks: int) -> float:
    """The ideal compute roofline of one forward: the model's total FLOPs and bytes (every op run
    once, unsharded) spread perfectly over all devices, max(FLOPs / (D * peak), bytes / (D * DRAM bw)),
    at the profile's peak (no efficiency factor, no launch floors, no communication)."""
    from planner.mesh import MeshSpec
    from planner.propagate import evaluate

    one = MeshSpec((1,), ("model",))
    nodes = [n for n in g if n.op not in ("placeholder", "output")]
    whole = evaluate(g, nodes, one, hw, boundary={})
    captured = len(g.blocks())
    block0 = evaluate(g, [n for n in nodes if n.block == g.blocks()[0]], one, hw, boundary={})
    flops = whole.flops + (num_blocks - captured) * block0.flops
    nbytes = whole.bytes + (num_blocks - captured) * block0.bytes
    d = mesh.size
    return max(flops / (d * float(hw.peak_flops)), nbytes / (d * float(hw.dram_bw)))


def main() -> None:
    from planner import plan_graph
    from planner.autoplan import price_plan
    from planner.hand_plans import tt_xla_plan
    from planner.hardware import get_profile
    from planner.mesh import parse_mesh
    from planner.plan import PlanError

    print(
        "| res | mesh | hardware | auto ms/fwd | auto comm ms | auto GB/dev | hand ms/fwd | hand comm ms | hand GB/dev | hand fits? "
        "| ideal roofline ms | hand/auto | 1 expert, memory ample: auto / hand ms | auto strategies |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for res in ("480p", "720p"):
        g = capture(res)
        for mesh_s, hw_name in CASES:
            mesh, hw = parse_mesh(mesh_s), get_profile(hw_name)
            hand = price_plan(g, tt_xla_plan(g, mesh), hw, num_blocks=40, weight_copies=2)
            try:
                auto = plan_graph(g, mesh, hw, num_blocks=40, weight_copies=2)
                ap, strat = (
                    auto.predicted,
                    "; ".join(f"{d.scope}={d.strategy}" for d in auto.decisions[:3]),
                )
            except PlanError as e:
                auto, ap, strat = None, None, f"no plan fits: {str(e)[:80]}"
            fits = hand.memory_bytes_per_device <= float(hw.dram_bytes)
            roof = ideal_roofline(g, mesh, hw, 40)
            # One expert resident, memory ample: the hand plan always fits, and auto (hinted with it) must not be worse.
            auto1 = plan_graph(g, mesh, hw, num_blocks=40, weight_copies=1, memory_gb=1e3).predicted
            hand1 = price_plan(g, tt_xla_plan(g, mesh), hw, num_blocks=40, weight_copies=1)
            ample = f"{auto1.step_seconds * 1e3:.0f} / {hand1.step_seconds * 1e3:.0f}" + (
                "" if auto1.step_seconds <= hand1.step_seconds * 1.0001 else " AUTO WORSE"
            )
            fit_s = (
                "yes"
                if fits
                else f"no ({hand.memory_bytes_per_device / 1e9:.1f} > {float(hw.dram_bytes) / 1e9:.0f} GB)"
            )
            if ap is None:
                print(
                    f"| {res} | {mesh_s} | {hw_name} | – | – | – | {hand.step_seconds * 1e3:.0f} | {hand.comm_seconds * 1e3:.0f} | {hand.memory_bytes_per_device / 1e9:.1f} | {fit_s} | {roof * 1e3:.0f} | – | {ample} | {strat} |"
                )
                continue
            ratio = f"{hand.step_seconds / ap.step_seconds:.2f}" + ("" if fits else " (hand does not fit)")
            print(
                f"| {res} | {mesh_s} | {hw_name} | {ap.step_seconds * 1e3:.0f} | {ap.comm_seconds * 1e3:.0f} | {ap.memory_bytes_per_device / 1e9:.1f} | "
                f"{hand.step_seconds * 1e3:.0f} | {hand.comm_seconds * 1e3:.0f} | {hand.memory_bytes_per_device / 1e9:.1f} | {fit_s} | {roof * 1e3:.0f} | "
                f"{ratio} | {ample} | {strat} |"
            )

    print("\n| step (full A14B, 720p, wh-galaxy 8x4) | seconds |\n|---|---|")
    t0 = time.perf_counter()
    g = capture("720p")
    t1 = time.perf_counter()
    plan = plan_graph(g, parse_mesh("8x4"), "wh-galaxy", num_blocks=40, weight_copies=2)
    t2 = time.perf_counter()
    print(
        f"| capture 2 blocks on meta (dynamo) | {t1 - t0:.2f} |\n| build tables + solve + decisions + assemble | {t2 - t1:.2f} |"
        f"\n| of which CP-SAT main solve | {plan.solver.seconds:.3f} |\n| total | {t2 - t0:.2f} |"
    )

    print("\n| blocks | solve s | variables | constraints |\n|---|---|---|---|")
    for n in (10, 20, 40):
        p = plan_graph(g, parse_mesh("8x4"), "wh-galaxy", num_blocks=n, weight_copies=2)
        print(f"| {n} | {p.solver.seconds:.4f} | {p.solver.variables} | {p.solver.constraints} |")


if __name__ == "__main__":
    main()
