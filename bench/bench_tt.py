"""The ÷16 A14B of `bench/bench_score.py` through Tenstorrent's compiler: auto vs ``plan="tt-xla"``.

    PYTHONPATH=. python bench/bench_tt.py                 # 40 blocks, bh-galaxy (8x4, 32 chips)
    PYTHONPATH=. python bench/bench_tt.py --blocks 4      # quicker; counts are for that many blocks

The same model, plans and 32 virtual CPU devices as bench_score: (a) the full-size A14B auto plan
(720p, both experts, wh-galaxy) transferred to the ÷16 model, and (b) the tt-xla hand plan. Here both are
compiled with ``target="tt-mlir"``: pinned (`planner.pins`), traced once on CPU (not run), written in
Shardy form (`wancompile.tt.export`) and compiled compile-only by tt-mlir for a Blackhole Galaxy
(`wancompile.tt`). Per plan it prints TTNN's collectives per forward (kind, mesh axis, count) beside the
plan's prediction for tt-mlir, and scores them with the project's cost model (`planner.cost_model`,
wh-galaxy links; bytes × 16² for the full-size model, at bf16 as bench_score scores them). The score is
communication only: TTNN's own metrics carry no time on a multi-chip mesh (docs/tenstorrent.md).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.bench_score import (  # noqa: E402  (after the path)
    BASE_MODEL,
    BYTES_SCALE,
    DEVICES,
    FULL_BLOCKS,
    HARDWARE,
    MESH,
    SCORED_ELEMENT_BYTES,
    make_plans,
    small_inputs,
    small_model,
)

SYSTEM = "bh-galaxy"


def child(blocks: int, work: Path, plan_path: str) -> None:
    """In a 32-device process: capture once, lower both plans for tt-mlir, write their Shardy modules."""
    from wancompile import runtime

    runtime.configure(num_devices=DEVICES, dump_dir=work / "hlo")
    import torch
    import torch.utils._pytree as pytree

    from wancompile.backend import wan_autoshard
    from wancompile.capture import capture_fx
    from wancompile.verify import placeholder_args

    t0 = time.perf_counter()
    model = small_model(blocks)
    inputs = small_inputs()
    gm = capture_fx(model, **inputs, return_dict=False)
    out = {"capture_s": round(time.perf_counter() - t0, 1)}
    with torch.no_grad():
        for which in ("a", "b"):
            t = time.perf_counter()
            options = {
                "mesh": MESH,
                "hardware": HARDWARE,
                "target": "tt-mlir",
                "dump_dir": str(work / which),
                "plan": plan_path if which == "a" else "tt-xla",
            }
            program = wan_autoshard(gm, [], options=options)
            args = program.program_args(placeholder_args(program.graph, model, inputs))
            lazy = program.lowered(*args)
            outs = [x for x in pytree.tree_leaves(lazy) if isinstance(x, torch.Tensor)]
            program.stablehlo_sink("main", outs, program.named_arguments(args))
            plan = program.plan
            out[which] = {
                "module": str(program.stablehlo_sink.written["main"]),
                "predicted": [c.to_json() for c in plan.predicted_by_partitioner()["tt-mlir"]],
                "constraints": len(plan.activations),
                "lower_s": round(time.perf_counter() - t, 1),
            }
            print(f"lowered ({which}) in {out[which]['lower_s']} s", file=sys.stderr, flush=True)
    (work / "child.json").write_text(json.dumps(out))


def comm_seconds(collectives, mesh) -> float:
    """The project's cost model over compiled collectives, full-size bytes at bf16."""
    from planner.cost_model import collective_seconds
    from planner.hardware import get_profile

    hw = get_profile(HARDWARE)
    kind_of = {"collective-permute": "collective-permute"}
    total = 0.0
    for c in collectives:
        nbytes = c.bytes * BYTES_SCALE * SCORED_ELEMENT_BYTES / 4  # the ÷16 program is f32
        total += c.count * collective_seconds(kind_of.get(c.kind, c.kind), nbytes, c.axes, mesh, hw)
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=FULL_BLOCKS)
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--plan-path", default="", help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="wancompile-bench-tt-"))
    if args.child:
        child(args.blocks, work, args.plan_path)
        return

    from planner.collective import Collective
    from planner.mesh import parse_mesh
    from wancompile.runtime import subprocess_env
    from wancompile.tt.check import check_programs

    plans = make_plans(work, [args.blocks], target="tt-mlir")  # the auto plan as the planner makes it for Tenstorrent
    env = subprocess_env(DEVICES)
    env["PYTHONPATH"] = str(ROOT)
    cmd = [sys.executable, __file__, "--child", "--blocks", str(args.blocks), "--work", str(work)]
    cmd += ["--plan-path", str(plans.small_plan[args.blocks])]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=5400)
    if proc.returncode != 0:
        raise SystemExit(f"bench_tt child failed:\n{proc.stderr[-4000:]}")
    lowered = json.loads((work / "child.json").read_text())
    mesh = parse_mesh(MESH)
    rows = {}
    for which, name in (("a", "auto"), ("b", "tt-xla")):
        info = lowered[which]
        predicted = [Collective.from_json(c) for c in info["predicted"]]
        (check,) = check_programs({name: Path(info["module"])}, {name: predicted}, SYSTEM, mesh, work / which)
        from wancompile.tt import ttnn

        compiled = ttnn.parse_collectives(Path(check.ttnn_ir).read_text(), mesh) if check.compiled else []
        rows[name] = {
            "compiled": check.compiled,
            "error": check.error,
            "as_predicted": check.as_predicted,
            "tt_compile_s": check.seconds,
            "constraints": info["constraints"],
            "collectives": {
                f"{k} {'+'.join(a)}": n for (k, a), n in sorted(Counter((c.kind, c.axes) for c in compiled).items())
            },
            "predicted": {
                f"{k} {'+'.join(a)}": n
                for (k, a), n in sorted(Counter((c.kind, c.axes) for c in predicted for _ in range(c.count)).items())
            },
            "comm_s_full_size": round(comm_seconds(compiled, mesh), 3),
            "cost_model_step_s": round(plans.predicted[which][0], 3),
        }
    result = {
        "blocks": args.blocks,
        "system": SYSTEM,
        "capture_s": lowered["capture_s"],
        "plans": rows,
        "work": str(work),
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"÷16 {BASE_MODEL}, {args.blocks} blocks, mesh {MESH}, compiled by tt-mlir for {SYSTEM} (compile-only)")
    for name, r in rows.items():
        status = (
            "as predicted" if r["as_predicted"] else ("compiled, NOT as predicted" if r["compiled"] else r["error"])
        )
        print(f"  {name:7} {status}; {r['constraints']} constraints; tt-mlir {r['tt_compile_s']:.1f} s")
        for k, n in r["collectives"].items():
            print(f"    {k:28} TTNN {n:6}   predicted {r['predicted'].get(k, 0):6}")
        print(f"    comm per forward (cost model, full-size bytes): {r['comm_s_full_size']:.3f} s")
    a, b = rows["auto"]["comm_s_full_size"], rows["tt-xla"]["comm_s_full_size"]
    if a and b:
        print(f"  auto / tt-xla communication: {a / b:.2f}")


if __name__ == "__main__":
    from _docs import main_writing

    main_writing(main, "bench-tt.md", "Plans through tt-mlir: predicted vs the TTNN IR")
