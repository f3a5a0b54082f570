"""An excerpt of the plan.md ``wancompile plan`` writes for Wan 2.2 T2V-A14B at 720p on a Wormhole Galaxy (8x4):
the summary line it prints last, then plan.md's header, the decisions, the first rows of one block op by op, and the "why" of the ffn's decision, as the
CLI renders them (docs/dumps.md and docs/usage.md show it; headings one level down).

    PYTHONPATH=. python bench/bench_plan_excerpt.py [--write]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

COMMAND = ["plan", "--model", "wan2.2-t2v-a14b", "--mesh", "8x4", "--resolution", "720p"]
OP_ROWS = 14  # rows of the op-by-op table kept


def _sections(text: str) -> dict[str, list[str]]:
    """plan.md's lines by the heading that opens them ("" for the lines before the first ``##``)."""
    sections: dict[str, list[str]] = {"": []}
    current = ""
    for line in text.splitlines():
        if line.startswith("## ") or line.startswith("### "):
            current = line
            sections[current] = []
        sections[current].append(line)
    return sections


def main() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with tempfile.TemporaryDirectory(prefix="wancompile-plan-excerpt-") as out:
        proc = subprocess.run(
            [sys.executable, "-m", "wancompile.cli", *COMMAND, "--out", out],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        sections = _sections((Path(out) / "plan.md").read_text())
    print(f"`wancompile {' '.join(COMMAND)}` ends with its summary line:\n")
    print("```\n" + proc.stdout.strip().splitlines()[-1] + "\n```\n")
    print("and writes plan.md (excerpt):\n")
    kept = []
    for heading, lines in sections.items():
        if heading == "" or heading.startswith("## Decisions"):
            kept += lines
        elif heading.startswith("## One block"):
            table = [i for i, line in enumerate(lines) if line.startswith("|")]
            cut = table[0] + 2 + OP_ROWS if table else len(lines)
            kept += lines[:cut] + ["| … |" + " |" * (lines[table[0]].count("|") - 2), ""]
        elif heading.startswith("### blocks.*.ffn"):
            kept += ["## Why (one decision of several)", ""] + lines
    for line in kept:
        print("#" + line if line.startswith("#") else line)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "bench"))
    from _docs import main_writing

    main_writing(main, "plan-excerpt.md", "What `wancompile plan` writes: an excerpt of plan.md")
