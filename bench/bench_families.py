"""Every Wan-family transformer diffusers ships, through the backend on 2x4 virtual CPU devices.

    PYTHONPATH=. python bench/bench_families.py [--json] [--families vace,skyreels-df]

Per family (`wancompile.models.FAMILIES`: tiny random-weight configs) and case:

- ``default``: the backend's default budget (the hardware profile's DRAM);
- ``tight``: the smallest budget the planner names (the ``need_gb`` of the `MemoryBudgetError` a 1e-9 GB
  budget raises);
- ``tight + rewrites all``: the same with every rewrite (its own smallest budget: rewrites change the weights).

Each case compiles through ``torch.compile(..., backend="wan_autoshard")`` and reports the fraction of
parameter elements sharded (any mesh axis in their spec), PCC and max-abs against eager fp32, and whether
every (collective kind, mesh axes) row of the prediction equals the partitioned HLO's count (bytes within 5 %).
Printed as a markdown table (the README's), or one JSON object with a ``rows`` list.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

MESH = "2x4"
CASES = ("default", "tight", "tight + rewrites all")


def run_case(name: str, case: str, dump_root: Path) -> dict:
    import torch

    import wancompile
    from wancompile.backend import last_program
    from wancompile.models import build_family
    from wancompile.verify import compare_collectives, numerics

    model, inputs = build_family(name)
    options: dict = {"mesh": MESH, "dump_dir": str(dump_root / f"{name}-{case.replace(' ', '')}")}
    if "rewrites" in case:
        options["rewrites"] = "all"

    def compile_and_call(opts):
        torch._dynamo.reset()
        with torch.no_grad():
            return torch.compile(model, backend="wan_autoshard", options=opts, fullgraph=True)(
                **inputs, return_dict=False
            )[0]

    need_gb = None
    if case != "default":
        try:
            compile_and_call({**options, "memory_gb": 1e-9})
            raise AssertionError(f"{name}: a 1e-9 GB budget planned")
        except wancompile.MemoryBudgetError as e:
            need_gb = e.need_gb
        options["memory_gb"] = need_gb
    out = compile_and_call(options)
    program = last_program()
    with torch.no_grad():
        eager = model(**inputs, return_dict=False)[0]
    vs_eager = numerics(out, eager)
    matches = compare_collectives(program.plan.collectives, program.collectives())
    sizes = {n: p.numel() for n, p in model.named_parameters()}
    sharded = sum(sizes.get(p, 0) for p, spec in program.plan.params.items() if any(a for a in spec))
    return {
        "family": name,
        "case": case,
        "mesh": MESH,
        "memory_gb": need_gb,
        "params_sharded": sharded / sum(sizes.values()),
        "pcc": vs_eager.pcc,
        "max_abs": vs_eager.max_abs,
        "predicted_eq_compiled": all(m.count_ok and m.bytes_ok() for m in matches),
        "collectives": sum(m.observed_count for m in matches),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print one JSON object with a `rows` list")
    p.add_argument("--families", default=None, help="comma-separated family names (default: all)")
    args = p.parse_args(argv)

    from wancompile import runtime

    runtime.configure(num_devices=8, dump_dir=Path(tempfile.mkdtemp(prefix="wancompile-families-hlo-")))
    from wancompile.models import FAMILIES

    names = args.families.split(",") if args.families else list(FAMILIES)
    dump_root = Path(tempfile.mkdtemp(prefix="wancompile-families-"))
    rows = [run_case(n, c, dump_root) for n in names for c in CASES]
    if args.json:
        print(json.dumps({"mesh": MESH, "rows": rows}))
        return 0
    print("| family | case | budget GB | params sharded | PCC vs eager fp32 | max-abs | predicted == compiled |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        budget = "default" if r["memory_gb"] is None else f"{r['memory_gb']:.6g}"
        print(
            f"| {r['family']} | {r['case']} | {budget} | {r['params_sharded']:.0%} | {r['pcc']:.7f} "
            f"| {r['max_abs']:.1e} | {'yes' if r['predicted_eq_compiled'] else 'NO'} ({r['collectives']}) |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
