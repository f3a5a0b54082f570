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
from typing import Mapping, Optional

from planner.graph import Graph
from planner.plan import Plan
from wancompile.report.model import Report

log = logging.getLogger("wancompile.report")

__all__ = ["Report", "write_dumps", "build_report"]


def build_report(
    plan: Plan, graph: Optional[Graph] = None, hardware: Optional[str] = None, num_blocks: Optional[int] = None
) -> Report:
    """A `Report` of `plan`, with the per-op trace when the captured graph is given."""
    trace = None
    if graph is not None:
        from wancompile.report.trace import trace_plan

        try:
            trace = trace_plan(graph, plan, hardware, num_blocks=num_blocks)
        except Exception as e:  # a graph the structure finder does not know: dump without the op table
            log.info(
                "plan report: no per-op trace (%s: %s); plan.md/html show the plan without the block table",
                type(e).__name__,
                e,
            )
    return Report(plan, trace)


def write_dumps(
    plan: Plan,
    out_dir: str | Path,
    *,
    graph: Optional[Graph] = None,
    hardware: Optional[str] = None,
    num_blocks: Optional[int] = None,
    report: Optional[Report] = None,
    extra: Optional[Mapping[str, str]] = None,
) -> dict[str, Path]:
    """Write plan.json (validated against the published schema), plan.md and plan.html (and the
    `extra` files, name -> text) into `out_dir` as one set (`planner.files.write_set`: whenever
    plan.json exists, the files beside it are from the same write)."""
    import json

    from planner.files import write_set
    from wancompile.report.html import render_html
    from wancompile.report.markdown import render_markdown
    from wancompile.report.schema import validate

    rep = report or build_report(plan, graph, hardware, num_blocks)
    data = rep.to_json()
    validate(data)
    files = {
        "plan.md": render_markdown(rep),
        "plan.html": render_html(rep),
        **dict(extra or {}),
        "plan.json": json.dumps(data, indent=1) + "\n",
    }
    written = write_set(out_dir, files, commit="plan.json")
    for p in written.values():
        log.debug("wrote %s", p)
    return {
        "json": written["plan.json"],
        "md": written["plan.md"],
        "html": written["plan.html"],
        **{name: written[name] for name in (extra or {})},
    }
