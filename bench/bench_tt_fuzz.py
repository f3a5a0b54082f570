"""The tt-mlir fuzz over every drawn case (tests/tt_fuzz_cases.py): one row per case, one subprocess per
device count (the count is fixed per process), and a closing line with the totals.

Columns: the case (its id spells out the config, mesh and budget), the plan's strategies for the block's
macros, the Tenstorrent system tt-mlir compiled it for, the TTNN collectives (all kinds, point-to-point
transfers counted one by one) and whether they equal the plan's prediction per kind and chip-mesh axis,
the TTNN program's peak DRAM per chip (as allocated, 32x32 tiles and all) beside the planner's estimate,
PCC against eager fp32 (bf16 cases: eager bf16's own in brackets; they are compiled with every rewrite, as a
pipeline would be for tt-mlir), and what is wrong (tt_fuzz_cases.judge).

    PYTHONPATH=. python bench/bench_tt_fuzz.py [--seed N] [--write]

(~20 min for the 45 cases of the default seed on 2 cores.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))


def _rows(seed: int) -> list[dict]:
    from wancompile.runtime import subprocess_env

    import tt_fuzz_cases as T

    cases = T.make_cases(seed) + (list(T.HIDDEN) if seed == T.SEED else [])
    rows = []
    for n in sorted({T.devices(c) for c in cases}, reverse=True):
        ids = [c.id for c in cases if T.devices(c) == n]
        args = ["--seed", str(seed)] if seed != T.SEED else ids
        env = subprocess_env(n)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
        proc = subprocess.run(
            [sys.executable, "tests/tt_fuzz_cases.py", *args], cwd=ROOT, env=env, capture_output=True, text=True
        )
        got = [json.loads(x[len("FUZZ ") :]) for x in proc.stdout.splitlines() if x.startswith("FUZZ ")]
        if len(got) != len(ids):
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise SystemExit(f"{n}-device cases: {len(got)} of {len(ids)} rows came back: {tail}")
        rows += got
    return rows


def _cell(row: dict) -> tuple[str, str, str]:
    main = next((t for t in row.get("tt", []) if not t["program"].endswith(".fold")), None)
    if main is None:
        return "-", "-", "-"
    if not main["compiled"]:
        return main["system"], "refused", "-"
    total = sum(m["ttnn_count"] for m in main["collectives"])
    same = all(m["predicted_count"] == m["ttnn_count"] for m in main["collectives"])
    mem = main.get("memory") or {}
    dram = (
        f"{mem['peak_bytes'] / 2**20:.2f} / {mem['planned_bytes'] / 2**20:.2f} MiB" if mem.get("planned_bytes") else "-"
    )
    return main["system"], f"{total} ({'== predicted' if same else '!= predicted'})", dram


def main() -> None:
    import tt_fuzz_cases as T

    seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else T.SEED
    rows = _rows(seed)
    print(f"Seed {seed}: {len(rows)} cases.\n")
    print("| case | strategies | system | TTNN collectives | peak DRAM / planned | PCC vs fp32 | problems |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        system, ccl, dram = _cell(r)
        strategies = "; ".join(f"{k.split('.')[-1]}: {v}" for k, v in r.get("strategies", {}).items() if "blocks" in k)
        pcc = f"{r['pcc']:.6f}" + (f" ({r['eager_pcc']:.6f})" if "eager_pcc" in r else "") if "pcc" in r else "-"
        problems = "; ".join(p.split(": ", 1)[-1][:160] for p in r["problems"]) or "none"
        print(
            f"| `{r['id']}` | {strategies or r.get('message', '')[:120]} | {system} | {ccl} | {dram} | {pcc} | {problems} |"
        )
    failed = [r for r in rows if r["problems"]]
    refused = sum(1 for r in rows for t in r.get("tt", []) if not t["compiled"])
    print(
        f"\n{len(rows) - len(failed)} passed, {len(failed)} failed: {refused} programs refused by tt-mlir, "
        f"{sum(1 for r in failed if r.get('tt') and all(t['compiled'] for t in r['tt']))} cases compiled "
        "but not as predicted or off in numerics."
    )


if __name__ == "__main__":
    from _docs import main_writing

    main_writing(main, "tt-fuzz.md", "The tt-mlir fuzz: every drawn case compiled by Tenstorrent's compiler")
