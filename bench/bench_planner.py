"""Auto plan vs the tt-xla hand plan under the same cost model, and planner speed.

    PYTHONPATH=. python bench/bench_planner.py

Prints markdown tables: A14B with both experts and with one expert resident (the profile's DRAM as
the budget) at 480p and 720p on wh-loudbox 2x4, wh-galaxy 8x4, bh-galaxy 8x4 and 1x4 (Wormhole
LoudBox chips): the auto plan, the auto plan restricted to STATE A (the stream whole on the hidden
dim between macros, as every seed plan keeps it), and the tt-xla hand plan, all under the same cost
model, with the stream layout the auto plan's block macros use; then the wall time to plan full A14B
and solve time vs number of blocks. "ideal roofline" is the model's total FLOPs / (devices x peak)
vs its bytes / (devices x DRAM bandwidth), whatever the plan; "hand fits?" compares the hand plan's
memory with the DRAM.
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


def stream_layout(plan) -> str:
    """The stream layouts the plan's block macros use (`Decision.state`), e.g. ``STATE B`` or
    ``attn1 SP-Megatron, attn2/ffn STATE A``."""
    by_state: dict[str, list[str]] = {}
    for d in plan.decisions:
        if d.in_block:
            by_state.setdefault(d.state, []).append(d.macro)
    if len(by_state) == 1:
        return next(iter(by_state))
    return ", ".join(f"{'/'.join(ms)} {state}" for state, ms in by_state.items())


def main() -> None:
    from planner import plan_graph
    from planner.autoplan import price_plan
    from planner.hand_plans import tt_xla_plan
    from planner.hardware import get_profile
    from planner.mesh import parse_mesh
    from planner.plan import PlanError

    print(
        "| res | mesh | hardware | experts | auto ms/fwd | auto comm ms | auto GB/dev | auto stream layout "
        "| auto, STATE A only: ms | hand (STATE A) ms/fwd | hand comm ms | hand GB/dev | hand fits? | hand/auto "
        "| ideal roofline ms | auto strategies |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for res in ("480p", "720p"):
        g = capture(res)
        for mesh_s, hw_name in CASES:
            mesh, hw = parse_mesh(mesh_s), get_profile(hw_name)
            roof = ideal_roofline(g, mesh, hw, 40)
            for experts in (2, 1):
                hand = price_plan(g, tt_xla_plan(g, mesh), hw, num_blocks=40, weight_copies=experts)
                fits = hand.memory_bytes_per_device <= float(hw.dram_bytes)
                fit_s = (
                    "yes"
                    if fits
                    else f"no ({hand.memory_bytes_per_device / 1e9:.1f} > {float(hw.dram_bytes) / 1e9:.0f} GB)"
                )
                hand_s = (
                    f"{hand.step_seconds * 1e3:.0f} | {hand.comm_seconds * 1e3:.0f} | "
                    f"{hand.memory_bytes_per_device / 1e9:.1f} | {fit_s}"
                )
                try:
                    state_a = plan_graph(g, mesh, hw, num_blocks=40, weight_copies=experts, stream_layouts=False)
                    a_s = f"{state_a.predicted.step_seconds * 1e3:.0f}"
                except PlanError:
                    a_s = "no plan fits"
                try:
                    auto = plan_graph(g, mesh, hw, num_blocks=40, weight_copies=experts)
                except PlanError as e:
                    print(
                        f"| {res} | {mesh_s} | {hw_name} | {experts} | no plan fits: {str(e)[:60]}… | | | | {a_s} | "
                        f"{hand_s} | – | {roof * 1e3:.0f} | |"
                    )
                    continue
                ap = auto.predicted
                ratio = f"{hand.step_seconds / ap.step_seconds:.2f}" + ("" if fits else " (hand does not fit)")
                print(
                    f"| {res} | {mesh_s} | {hw_name} | {experts} | {ap.step_seconds * 1e3:.0f} | {ap.comm_seconds * 1e3:.0f} | "
                    f"{ap.memory_bytes_per_device / 1e9:.1f} | {stream_layout(auto)} | {a_s} | {hand_s} | {ratio} | "
                    f"{roof * 1e3:.0f} | {'; '.join(f'{d.macro}={d.strategy}' for d in auto.decisions if d.in_block)} |"
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
