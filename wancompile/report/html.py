"""plan.html: one self-contained page (no scripts, fonts, images or links fetched from anywhere).

- a dataflow diagram (inline SVG) of one block: every kernel and every op that moves data or
  carries a constraint, top to bottom in program order, filled with the colour of its output's
  sharding state (legend: the layout in the one notation, `planner.placements`; the block-entry
  stream state is named),
  with each collective as a badge beside the op (kind, axes, bytes; big ones dark);
- cost bars (inline SVG): compute vs communication per sub-layer of a block, and per segment of the
  forward (prologue, N × block, epilogue);
- the tables and "why" sections of plan.md, converted from the same Markdown (so the two never
  disagree), and the full per-op trace of one block in a collapsed section.
"""

from __future__ import annotations

import html
import re

from planner.plan import MAIN_STACK
from wancompile.report.markdown import render_markdown
from wancompile.report.model import SMALL_RATIO, Report, human_bytes, us

PALETTE = ["#cfe8ff", "#ffe1b3", "#d9f2d0", "#f3d1f4", "#fff3a8", "#d5d5f7", "#ffd0d0", "#c8f0ec", "#e6e6e6"]
COMPUTE, COMM = "#4a7fd0", "#d0604a"

_CSS = """
body { font: 14px/1.45 -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; margin: 24px auto; max-width: 1320px; color: #1d1d1f; }
h1 { font-size: 22px; } h2 { font-size: 18px; border-bottom: 1px solid #ddd; padding-bottom: 4px; margin-top: 28px; }
h3 { font-size: 15px; margin-bottom: 4px; }
table { border-collapse: collapse; margin: 8px 0; font-size: 12.5px; }
th, td { border: 1px solid #d8d8d8; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #f4f4f6; } tr:nth-child(even) td { background: #fafafa; }
code { font: 12px ui-monospace, Menlo, Consolas, monospace; background: #f2f2f4; padding: 0 3px; border-radius: 3px; }
.figs { display: flex; gap: 28px; align-items: flex-start; flex-wrap: wrap; }
.fig { border: 1px solid #e2e2e2; border-radius: 6px; padding: 10px; background: #fff; }
.caption { font-size: 12px; color: #555; max-width: 700px; }
svg text { font-family: ui-monospace, Menlo, Consolas, monospace; }
details { margin: 12px 0; } summary { cursor: pointer; font-weight: 600; }
"""


def _esc(s: object) -> str:
    return html.escape(str(s), quote=True)


def dataflow_svg(rep: Report) -> str:
    rows = rep.table_rows("block")
    if not rows:
        return ""
    first = next((r for r in rows if r["op"] == "layer_norm" and r["in"]), rows[0])  # norm1 reads the block's input
    stream = rep.layout(first["in"][0]) if first["in"] else "—"
    states: list[str] = []
    for r in rows:
        p = rep.layout(r["out"]) or "—"
        if p not in states:
            states.append(p)
    if stream in states:
        states.remove(stream)
        states.insert(0, stream)
    color = {p: PALETTE[i % len(PALETTE)] for i, p in enumerate(states)}
    biggest = max((c["bytes"] for r in rows for c in r["collectives"]), default=0)
    box_x, box_w, box_h, gap, top = 110, 400, 30, 12, 56
    badge_x = box_x + box_w + 28
    height = top + len(rows) * (box_h + gap) + 30 + 22 * len(states)
    out = [
        f'<svg role="img" aria-label="dataflow of one block" width="980" height="{height}" viewBox="0 0 980 {height}">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto">'
        '<path d="M0,0 L10,5 L0,10 z" fill="#888"/></marker></defs>',
        f'<text x="{box_x}" y="20" font-size="13" font-weight="bold">one block ({_esc(rep.trace.get("block_module", "blocks.0") if rep.trace else "")} '
        f"stands for all {rep.num_blocks}); entry state {_esc(stream)}</text>",
        f'<text x="{badge_x}" y="44" font-size="12" fill="#555">collectives (per call)</text>',
    ]
    prev_group = None
    group_start = top
    y = top
    spans: list[tuple[str, int, int]] = []
    for i, r in enumerate(rows):
        if r["group"] != prev_group:
            if prev_group is not None:
                spans.append((prev_group, group_start, y - gap))
            prev_group, group_start = r["group"], y
        fill = color[rep.layout(r["out"]) or "—"]
        stroke = "#222" if r["constraint"] is not None else "#999"
        dash = "" if r["constraint"] else ""
        out.append(
            f'<rect x="{box_x}" y="{y}" width="{box_w}" height="{box_h}" rx="5" fill="{fill}" stroke="{stroke}" '
            f'stroke-width="{2 if r["constraint"] is not None else 1}"{dash}><title>{_esc(r["loc"])}: {_esc(rep.state(r["out"]))}</title></rect>'
        )
        label = r["loc"].removeprefix(f"{MAIN_STACK}.*").removeprefix(".").replace(":", " : ")
        out.append(f'<text x="{box_x + 8}" y="{y + 13}" font-size="11.5">{_esc(label)}</text>')
        out.append(
            f'<text x="{box_x + 8}" y="{y + 25}" font-size="10.5" fill="#444">→ {_esc(rep.state(r["out"]))}'
            + (f"  ⟂ {_esc(rep.spec(r['constraint']))}" if r["constraint"] is not None else "")
            + "</text>"
        )
        if i + 1 < len(rows):
            out.append(
                f'<line x1="{box_x + box_w / 2}" y1="{y + box_h}" x2="{box_x + box_w / 2}" y2="{y + box_h + gap - 1}" '
                'stroke="#888" marker-end="url(#arrow)"/>'
            )
        bx = badge_x
        for c in r["collectives"]:
            small = c["bytes"] * SMALL_RATIO < biggest
            text = f"{c['kind']} {'+'.join(c['axes'])} {human_bytes(c['bytes'])}"
            w = 7 * len(text) + 14
            out.append(
                f'<rect x="{bx}" y="{y + 4}" width="{w}" height="{box_h - 8}" rx="10" fill="{"#f6c9a8" if small else "#c0392b"}"/>'
            )
            out.append(
                f'<text x="{bx + 7}" y="{y + 19}" font-size="11" fill="{"#5a2d0c" if small else "#fff"}">{_esc(text)}</text>'
            )
            out.append(
                f'<line x1="{box_x + box_w}" y1="{y + box_h / 2}" x2="{bx}" y2="{y + box_h / 2}" stroke="#c0392b" stroke-dasharray="3,3"/>'
            )
            bx += w + 8
        y += box_h + gap
    spans.append((prev_group, group_start, y - gap))
    for name, y0, y1 in spans:
        out.append(
            f'<path d="M{box_x - 12},{y0} L{box_x - 18},{y0} L{box_x - 18},{y1} L{box_x - 12},{y1}" fill="none" stroke="#666"/>'
        )
        out.append(
            f'<text x="{box_x - 24}" y="{(y0 + y1) / 2 + 4}" font-size="12" font-weight="bold" text-anchor="end">{_esc(name)}</text>'
        )
    y += 8
    out.append(
        f'<text x="{box_x}" y="{y + 4}" font-size="12" font-weight="bold">layout of the op output, one placement per mesh axis ({_esc(", ".join(rep.plan.mesh.axis_names))}); thick border = activation constraint</text>'
    )
    for p in states:
        y += 22
        out.append(f'<rect x="{box_x}" y="{y - 8}" width="26" height="16" rx="3" fill="{color[p]}" stroke="#999"/>')
        out.append(
            f'<text x="{box_x + 34}" y="{y + 4}" font-size="11.5">{_esc(p)}{"  = the stream between macros (block entry)" if p == stream else ""}</text>'
        )
    out.append("</svg>")
    return "\n".join(out)


def cost_bars_svg(rep: Report) -> str:
    groups = rep.group_costs()
    segs = rep.segment_costs()
    if not groups:
        return ""
    bars = (
        [(f"{g}", c, m) for g, c, m in groups]
        + [("", 0.0, 0.0)]
        + [(f"{s}" + (f" ×{t}" if t > 1 else ""), c * t, m * t) for s, t, c, m in segs]
    )
    scale_block = max(c + m for _, c, m in bars[: len(groups)]) or 1.0
    scale_fwd = max(c + m for _, c, m in bars[len(groups) + 1 :]) or 1.0
    width, left, bar_w, h = 560, 130, 300, 20
    height = 60 + len(bars) * (h + 8) + 30
    out = [
        f'<svg role="img" aria-label="cost bars" width="{width}" height="{height}" viewBox="0 0 {width} {height}">',
        '<text x="10" y="18" font-size="13" font-weight="bold">predicted time: compute vs collectives</text>',
        f'<rect x="10" y="28" width="12" height="12" fill="{COMPUTE}"/><text x="28" y="38" font-size="11">compute</text>',
        f'<rect x="100" y="28" width="12" height="12" fill="{COMM}"/><text x="118" y="38" font-size="11">collectives</text>',
    ]
    y = 56
    out.append(f'<text x="10" y="{y}" font-size="11.5" fill="#555">one block, per sub-layer (µs)</text>')
    y += 8
    for i, (name, c, m) in enumerate(bars):
        if not name:
            y += 6
            out.append(f'<text x="10" y="{y + 10}" font-size="11.5" fill="#555">one forward, per segment (ms)</text>')
            y += 18
            continue
        per_fwd = i > len(groups)
        scale = scale_fwd if per_fwd else scale_block
        wc, wm = bar_w * c / scale, bar_w * m / scale
        val = f"{(c + m) * 1e3:.3f} ms" if per_fwd else f"{us(c + m)} µs"
        out.append(f'<text x="{left - 8}" y="{y + 14}" font-size="11.5" text-anchor="end">{_esc(name)}</text>')
        out.append(
            f'<rect x="{left}" y="{y}" width="{wc:.1f}" height="{h}" fill="{COMPUTE}"><title>compute {us(c)} µs</title></rect>'
        )
        out.append(
            f'<rect x="{left + wc:.1f}" y="{y}" width="{wm:.1f}" height="{h}" fill="{COMM}"><title>collectives {us(m)} µs</title></rect>'
        )
        out.append(f'<text x="{left + wc + wm + 6:.1f}" y="{y + 14}" font-size="11">{val}</text>')
        y += h + 8
    out.append("</svg>")
    return "\n".join(out)


def _inline(text: str) -> str:
    s = _esc(text).replace("&lt;br&gt;", "<br>")
    s = re.sub(r"`([^`]+)`", r"<code>\1</code>", s)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", s)


def markdown_to_html(md: str) -> str:
    """The Markdown subset plan.md uses: headings, pipe tables, bullet lists, paragraphs."""
    out: list[str] = []
    lines = md.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            text = line[level:].strip()
            anchor = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
            out.append(f'<h{level} id="{_esc(anchor)}">{_inline(text)}</h{level}>')
        elif line.startswith("|"):
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(lines[i])
                i += 1
            i -= 1
            cells = [re.split(r"(?<!\\)\|", r.strip()[1:-1]) for r in rows]
            head, body = cells[0], cells[2:]
            out.append(
                "<table><thead><tr>" + "".join(f"<th>{_inline(c.strip())}</th>" for c in head) + "</tr></thead><tbody>"
            )
            for r in body:
                out.append(
                    "<tr>" + "".join(f"<td>{_inline(c.strip().replace(chr(92) + '|', '|'))}</td>" for c in r) + "</tr>"
                )
            out.append("</tbody></table>")
        elif line.startswith("- "):
            out.append("<ul>")
            while i < len(lines) and lines[i].startswith("- "):
                out.append(f"<li>{_inline(lines[i][2:])}</li>")
                i += 1
            i -= 1
            out.append("</ul>")
        elif line.strip():
            out.append(f"<p>{_inline(line)}</p>")
        i += 1
    return "\n".join(out)


def _trace_table(rep: Report) -> str:
    rows = rep.rows("block")
    if not rows:
        return ""
    out = [
        "<details><summary>Every op of one block (" + str(len(rows)) + " ops)</summary>",
        "<table><thead><tr><th>op</th><th>weights</th><th>state in</th><th>state out</th><th>constraint</th>"
        "<th>collectives</th><th>µs</th></tr></thead><tbody>",
    ]
    for r in rows:
        coll = "<br>".join(
            _esc(f"{c['kind']} on {'+'.join(c['axes'])} {human_bytes(c['bytes'])}") for c in r["collectives"]
        )
        t = r["compute_s"] + sum(c["seconds"] for c in r["collectives"])
        constraint = rep.spec(r["constraint"]) if r["constraint"] is not None else ""
        out.append(
            f"<tr><td><code>{_esc(r['loc'])}</code></td><td>{_esc(rep.weights(r))}</td>"
            f"<td>{'<br>'.join(_esc(rep.state(x)) for x in r['in'])}</td>"
            f"<td>{_esc(rep.state(r['out']))}</td><td>{_esc(constraint)}</td><td>{coll}</td><td>{us(t)}</td></tr>"
        )
    out.append("</tbody></table></details>")
    return "\n".join(out)


def render_html(rep: Report) -> str:
    body = markdown_to_html(render_markdown(rep))
    title, _, rest = body.partition("\n")
    figs = [f for f in (dataflow_svg(rep), cost_bars_svg(rep)) if f]
    fig_html = ""
    if figs:
        fig_html = (
            '<h2 id="figures">One block and where the time goes</h2>\n<div class="figs">'
            + "".join(f'<div class="fig">{f}</div>' for f in figs)
            + "</div>\n"
            '<p class="caption">Boxes: the block\'s kernels and every op that moves data or carries a constraint, in program '
            "order, coloured by the sharding state of their output. Badges: the collectives the op implies, bytes per device "
            "per call (dark: big, light: under 1/16 of the block's largest). Bars: predicted compute and collective time.</p>"
        )
    # figures go right after the header table (before the decisions)
    head_end = rest.find("<h2")
    head_end = len(rest) if head_end < 0 else head_end
    page = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        f"<title>{_esc(re.sub('<[^>]+>', '', title))}</title>",
        f"<style>{_CSS}</style>",
        "</head>",
        "<body>",
        title,
        rest[:head_end],
        fig_html,
        rest[head_end:],
        _trace_table(rep),
        "</body>",
        "</html>",
    ]
    return "\n".join(p for p in page if p) + "\n"
