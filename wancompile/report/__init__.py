"""Decision dumps: plan.json (+ its per-op trace), plan.md, plan.html; explain, diff and export.

    from wancompile.report import write_dumps
    write_dumps(plan, "out/", graph=graph)      # out/plan.json, out/plan.md, out/plan.html

One module per view: `trace` (per-op states and costs, computed from the captured graph), `model`
(what the views share), `markdown`, `html`, `explain`, `diff`, `export` (a plain-torch_xla Python
module), `schema` (plan.schema.json and a validator).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

from planner.graph import Graph
from planner.plan import Plan
from wancompile.report.model import Report

log = logging.getLogger("wancompile.report")

__all__ = ["Report", "write_dumps", "build_report"]


def build_report(plan: Plan, graph: Optional[Graph] = None, hardware: Optional[str] = None,
                 num_blocks: Optional[int] = None) -> Report:
    """A `Report` of `plan`, with the per-op trace when the captured graph is given."""
    trace = None
    if graph is not None:
        from wancompile.report.trace import trace_plan

        try:
            trace = trace_plan(graph, plan, hardware, num_blocks=num_blocks)
        except Exception as e:  # a graph the structure finder does not know: dump without the op table
            log.info("plan report: no per-op trace (%s: %s); plan.md/html show the plan without the block table", type(e).__name__, e)
    return Report(plan, trace)


def write_dumps(plan: Plan, out_dir: str | Path, *, graph: Optional[Graph] = None, hardware: Optional[str] = None,
                num_blocks: Optional[int] = None, report: Optional[Report] = None) -> dict[str, Path]:
    """Write plan.json (validated against the published schema), plan.md and plan.html into `out_dir`."""
    import json

    from wancompile.report.html import render_html
    from wancompile.report.markdown import render_markdown
    from wancompile.report.schema import validate

    rep = report or build_report(plan, graph, hardware, num_blocks)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = rep.to_json()
    validate(data)
    paths = {"json": out / "plan.json", "md": out / "plan.md", "html": out / "plan.html"}
    paths["json"].write_text(json.dumps(data, indent=1) + "\n")
    paths["md"].write_text(render_markdown(rep))
    paths["html"].write_text(render_html(rep))
    for p in paths.values():
        log.debug("wrote %s", p)
    return paths
