"""Auto plan vs the tt-xla hand plan under the same cost model, and planner speed.

    PYTHONPATH=. python bench/bench_planner.py [--json] [--write] [--no-spread]

Prints markdown tables: A14B with both experts and with one expert resident (the profile's DRAM as
the budget) at 480p and 720p on wh-loudbox 2x4, wh-galaxy 8x4, bh-galaxy 8x4 and 1x4 (Wormhole
LoudBox chips): the auto plan, the auto plan restricted to STATE A (the stream whole on the hidden
dim between macros, as every seed plan keeps it), and the tt-xla hand plan, all under the same cost
model, with the stream layout the auto plan's block macros use; then the wall time to plan full A14B
and solve time vs number of blocks. "ideal roofline" is the model's total FLOPs / (devices x peak)
vs its bytes / (devices x DRAM bandwidth), whatever the plan; "hand fits?" compares the hand plan's
memory with the DRAM. Every Tenstorrent profile carries the calibrated factors (docs/calibration.md);
each auto and hand figure is also given as its range under the leave-one-out refits of those factors
(`planner.calibration.held_out_fits`): the spread the published rows allow. ``--write`` writes the
tables to docs/planner-bench.md with the commit.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

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


def spread_factors(dits, vaes):
    """The tt-xla factors of every leave-one-out refit of the calibration (`planner.calibration`) on its graphs
    (`bench_calibration.graphs`): the range of factors the published rows allow."""
    from planner import calibration as C
    from planner.hardware import CALIBRATED_STACK

    return [f.factors[CALIBRATED_STACK] for f in C.held_out_fits(C.price_all(dits, vaes))]


def ttnn_factors(dits, vaes):
    """(explanation, the tt-xla factors fitted under it) for each explanation of the data movement under the
    TTNN-kernel pricing (`planner.calibration.move_rates`: moves at DRAM bandwidth, at the audit's rates)."""
    from planner import calibration as C
    from planner.hardware import CALIBRATED_STACK

    priced = C.price_all(dits, vaes, "ttnn")
    return [
        (name, C.fit(priced, move_efficiency=e).factors[CALIBRATED_STACK]) for name, e in C.move_rates(priced).items()
    ]


def ttnn_terms(g, plan, hw):
    """One forward of `plan` priced by what TTNN runs (`planner.calibration.forward_terms`, "ttnn"), as the terms
    every explanation's factors scale."""
    from planner import calibration as C

    return C.forward_terms(g, plan, hw, C.STACKS["tt-xla"], C.Scheme("tt-xla", None, 1), 40, "ttnn")


def run(spread: bool = True) -> dict:
    from bench_calibration import graphs

    from planner import plan_graph
    from planner.autoplan import price_plan
    from planner.calibration import calibrated
    from planner.hand_plans import tt_xla_plan
    from planner.hardware import get_profile
    from planner.mesh import parse_mesh
    from planner.plan import PlanError

    dits, vaes = graphs() if spread else ({}, {})
    factor_sets = spread_factors(dits, vaes) if spread else []
    explanations = ttnn_factors(dits, vaes) if spread else []
    rows = []
    for res in ("480p", "720p"):
        g = dits[res] if res in dits else capture(res)  # the calibration's capture where it made one
        for mesh_s, hw_name in CASES:
            mesh, hw = parse_mesh(mesh_s), get_profile(hw_name)
            roof = ideal_roofline(g, mesh, hw, 40)
            hand_plan = tt_xla_plan(g, mesh, hw)  # the tt-xla preset, priced again under each spread below
            for experts in (2, 1):
                row = {
                    "resolution": res,
                    "mesh": mesh_s,
                    "hardware": hw_name,
                    "experts": experts,
                    "roofline_ms": roof * 1e3,
                }
                hand_experts = tt_xla_plan(g, mesh, hw, num_blocks=40, weight_sets=experts)
                hand = hand_experts.predicted
                row["hand"] = {
                    "ms": hand.step_seconds * 1e3,
                    "comm_ms": hand.comm_seconds * 1e3,
                    "gb": hand.memory_bytes_per_device / 1e9,
                    "fits": hand.memory_bytes_per_device <= float(hw.dram_bytes),
                }
                try:
                    state_a = plan_graph(g, mesh, hw, num_blocks=40, weight_sets=experts, stream_layouts=False)
                    row["state_a_ms"] = state_a.predicted.step_seconds * 1e3
                except PlanError:
                    row["state_a_ms"] = None
                try:
                    auto = plan_graph(g, mesh, hw, num_blocks=40, weight_sets=experts)
                except PlanError as e:
                    row["auto"] = {"error": str(e)}
                    rows.append(row)
                    continue
                ap = auto.predicted
                row["auto"] = {
                    "ms": ap.step_seconds * 1e3,
                    "comm_ms": ap.comm_seconds * 1e3,
                    "gb": ap.memory_bytes_per_device / 1e9,
                    "stream": stream_layout(auto),
                    "strategies": "; ".join(f"{d.macro}={d.strategy}" for d in auto.decisions if d.in_block),
                }
                row["hand_over_auto"] = hand.step_seconds / ap.step_seconds
                # the same two plans (not re-planned) priced by what TTNN runs, under each explanation's fit
                if explanations:
                    th, ta = ttnn_terms(g, hand_experts, hw), ttnn_terms(g, auto, hw)
                    row["ttnn"] = {name: th.seconds(f) / ta.seconds(f) for name, f in explanations}
                ratios, auto_ms = [], []
                for f in factor_sets:  # the same comparison under every held-out refit of the factors
                    hw_f = calibrated(hw, f, "leave-one-out refit")
                    try:
                        a = plan_graph(g, mesh, hw_f, num_blocks=40, weight_sets=experts).predicted.step_seconds
                    except PlanError:
                        continue
                    h = price_plan(g, hand_plan, hw_f, num_blocks=40, weight_copies=experts).step_seconds
                    ratios.append(h / a)
                    auto_ms.append(a * 1e3)
                if ratios:
                    row["spread"] = {
                        "hand_over_auto": [min(ratios), max(ratios)],
                        "auto_ms": [min(auto_ms), max(auto_ms)],
                    }
                rows.append(row)
    return {"rows": rows, "factor_sets": len(factor_sets)}


def table(out: dict) -> list[str]:
    lines = [
        "| res | mesh | hardware | experts | auto ms/fwd (LOO range) | auto comm ms | auto GB/dev | auto stream layout "
        "| auto, STATE A only: ms | hand (STATE A) ms/fwd | hand comm ms | hand GB/dev | hand fits? | hand/auto (LOO range) "
        "| hand/auto, TTNN kernels (moves at DRAM bandwidth; audit, fixed program; audit profile) | ideal roofline ms | auto strategies |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in out["rows"]:
        h = r["hand"]
        fit_s = "yes" if h["fits"] else f"no ({h['gb']:.1f} > DRAM)"
        hand_s = f"{h['ms']:.0f} | {h['comm_ms']:.0f} | {h['gb']:.1f} | {fit_s}"
        a_s = "no plan fits" if r["state_a_ms"] is None else f"{r['state_a_ms']:.0f}"
        head = f"| {r['resolution']} | {r['mesh']} | {r['hardware']} | {r['experts']}"
        if "error" in r["auto"]:
            lines.append(
                f"{head} | no plan fits: {r['auto']['error'][:60]}… | | | | {a_s} | {hand_s} | – | – | {r['roofline_ms']:.0f} | |"
            )
            continue
        a = r["auto"]
        sp = r.get("spread")
        auto_ms = f"{a['ms']:.0f}" + (f" ({sp['auto_ms'][0]:.0f}–{sp['auto_ms'][1]:.0f})" if sp else "")
        ratio = f"{r['hand_over_auto']:.2f}" + (
            f" ({sp['hand_over_auto'][0]:.2f}–{sp['hand_over_auto'][1]:.2f})" if sp else ""
        )
        if not h["fits"]:
            ratio += " (hand does not fit)"
        ttnn = "; ".join(f"{x:.2f}" for x in r.get("ttnn", {}).values()) or "–"
        lines.append(
            f"{head} | {auto_ms} | {a['comm_ms']:.0f} | {a['gb']:.1f} | {a['stream']} | {a_s} | {hand_s} | {ratio} "
            f"| {ttnn} | {r['roofline_ms']:.0f} | {a['strategies']} |"
        )
    return lines


def timing() -> list[str]:
    from planner import plan_graph
    from planner.mesh import parse_mesh

    t0 = time.perf_counter()
    g = capture("720p")
    t1 = time.perf_counter()
    plan = plan_graph(g, parse_mesh("8x4"), "wh-galaxy", num_blocks=40, weight_sets=2)
    t2 = time.perf_counter()
    lines = [
        "| step (full A14B, 720p, wh-galaxy 8x4) | seconds |",
        "|---|---|",
        f"| capture 2 blocks on meta (dynamo) | {t1 - t0:.2f} |",
        f"| build tables + solve + decisions + assemble | {t2 - t1:.2f} |",
        f"| of which CP-SAT main solve | {plan.solver.seconds:.3f} |",
        f"| total | {t2 - t0:.2f} |",
        "",
        "| blocks | solve s | variables | constraints |",
        "|---|---|---|---|",
    ]
    for n in (10, 20, 40):
        p = plan_graph(g, parse_mesh("8x4"), "wh-galaxy", num_blocks=n, weight_sets=2)
        lines.append(f"| {n} | {p.solver.seconds:.4f} | {p.solver.variables} | {p.solver.constraints} |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write", action="store_true", help="write the tables to docs/planner-bench.md")
    ap.add_argument("--no-spread", action="store_true", help="skip the leave-one-out refits (faster)")
    args = ap.parse_args()
    out = run(spread=not args.no_spread)
    lines = table(out) + [""] + timing()
    print(json.dumps(out, indent=1) if args.json else "\n".join(lines))
    if args.write:
        from _docs import write_doc

        write_doc(
            "planner-bench.md",
            "Auto plan vs the tt-xla hand plan under the calibrated cost model",
            "PYTHONPATH=. python bench/bench_planner.py --write",
            f"Wan 2.2 T2V-A14B (2 blocks captured on meta, planned for 40), both experts and one expert resident, the "
            f"profile's DRAM as the budget, every Tenstorrent profile carrying the factors fitted in docs/calibration.md. "
            f"The ranges are the same numbers under each of the {out['factor_sets']} leave-one-out refits of those "
            f"factors (a refit re-plans the auto plan and re-prices the hand plan). The TTNN-kernel column re-prices the "
            f'same two plans by what TTNN runs (`planner.calibration` pricing "ttnn"), under the factors fitted for each '
            f"explanation of data movement in docs/calibration.md.",
            lines,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
