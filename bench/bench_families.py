"""Every Wan-family transformer diffusers ships, through the backend on 2x4 virtual CPU devices.

    PYTHONPATH=. python bench/bench_families.py [--json] [--families vace,skyreels-df] [--write]

Per family (`wancompile.models.FAMILIES`: tiny random-weight configs) and case (`wancompile.verify.FAMILY_CASES`):
the default budget; the tightest budget the planner names (the ``need_gb`` of the `MemoryBudgetError` a 1e-9 GB
budget raises); that with every rewrite (its own tightest budget: rewrites change what is resident). Each case
compiles through ``torch.compile(..., backend="wan_autoshard")`` (`wancompile.verify.check_family`) and reports the
fraction of parameter elements sharded, PCC and max-abs against eager fp32, and whether every (collective kind,
mesh axes) row of the prediction equals the partitioned HLO's count (bytes within 5 %). Printed as a markdown
table, or one JSON object with a ``rows`` list; ``--write`` also writes the table to docs/families.md with the
commit it was measured on.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

MESH = "2x4"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print one JSON object with a `rows` list")
    p.add_argument("--families", default=None, help="comma-separated family names (default: all)")
    p.add_argument("--write", action="store_true", help="write the table to docs/families.md")
    args = p.parse_args(argv)

    from wancompile import runtime

    runtime.configure(num_devices=8, dump_dir=Path(tempfile.mkdtemp(prefix="wancompile-families-hlo-")))
    from wancompile.models import FAMILIES
    from wancompile.verify import FAMILY_CASES, check_family

    names = args.families.split(",") if args.families else list(FAMILIES)
    rows = [check_family(n, c, MESH).to_json() for n in names for c in FAMILY_CASES]
    if args.json:
        print(json.dumps({"mesh": MESH, "rows": rows}))
        return 0
    table = [
        "| family | case | budget GB | params sharded | PCC vs eager fp32 | max-abs | predicted == compiled |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        budget = "default" if r["memory_gb"] is None else f"{r['memory_gb']:.6g}"
        table.append(
            f"| {r['family']} | {r['case']} | {budget} | {r['params_sharded']:.0%} | {r['pcc']:.7f} "
            f"| {r['max_abs']:.1e} | {'yes' if r['predicted_eq_compiled'] else 'NO'} ({r['collectives']}) |"
        )
    print("\n".join(table))
    if args.write:
        _write_doc(table)
    return 0


def _write_doc(table: list[str]) -> None:
    from _docs import write_doc

    write_doc(
        "families.md",
        "Every Wan-family model, through the backend on 2x4",
        "PYTHONPATH=. python bench/bench_families.py --write",
        "Measured on 8 virtual CPU devices (2 shared cores). Cases and columns: the bench's docstring; every row is also a test "
        "(`tests/test_family_*.py`).",
        table,
    )


if __name__ == "__main__":
    sys.exit(main())
