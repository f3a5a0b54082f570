"""plan.md: the plan as a person reads it, in the spirit of the seed's hand-written design note.

Sections, in order: a header table (model, mesh, hardware, solver, predicted time with its
compute/comm split and roofline, memory, parallelism, the per-block collective bill); the decisions
with their best rejected alternative; one block op by op (weights, activation state in -> out,
constraint, collective, bytes, µs); what runs once per forward; the collectives; and a "why"
section per decision. Deterministic for the same plan.json (goldens: tests/test_report.py).
"""

from __future__ import annotations

from typing import Iterable, Sequence

from wancompile.report.model import (
    Report,
    blocks_text,
    decision_account,
    fsdp_range_text,
    human_bytes,
    human_flops,
    ms,
    ring_text,
    us,
    weights_text,
)


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |")
    return out


def header_rows(rep: Report) -> list[tuple[str, str]]:
    p, mesh = rep.plan, rep.plan.mesh
    hw = rep.hardware
    s, pr = p.solver, p.predicted
    rows = [
        (
            "model",
            p.model
            + (f" — {rep.num_blocks} blocks" if rep.num_blocks else "")
            + (f", {rep.trace['tokens']} tokens per forward" if rep.trace else ""),
        )
    ]
    rows.append(
        (
            "mesh",
            f"{mesh} = {mesh.size} devices; axes "
            + " × ".join(f"{a} ({n})" for a, n in zip(mesh.axis_names, mesh.shape)),
        )
    )
    rows.append(("hardware", (f"{hw.name}: {hw.description}" if hw else p.hardware or "—")))
    solver = f"{s.status}"
    if s.status not in ("hand-written", "none"):
        solver += f" in {s.seconds:.2f} s, gap {s.gap:.2%}, objective {s.objective * 1e3:.3f} ms, {s.variables} variables, {s.constraints} constraints"
    rows.append(("solver", solver))
    if pr.step_seconds:
        share = lambda x: f"{100 * x / pr.step_seconds:.0f} %"  # noqa: E731
        rows.append(
            (
                "predicted per forward",
                f"{ms(pr.step_seconds)} ms = compute {ms(pr.compute_seconds)} ms ({share(pr.compute_seconds)}) "
                f"+ comm {ms(pr.comm_seconds)} ms ({share(pr.comm_seconds)}), no overlap assumed",
            )
        )
        flops = rep.flops_per_forward()
        if hw is not None and flops:
            bound = flops / (float(hw.peak_flops) * float(hw.efficiency))
            rows.append(
                (
                    "roofline",
                    f"{human_flops(flops)} per device per forward; at {float(hw.peak_flops) / 1e12:.0f} TFLOP/s × "
                    f"{float(hw.efficiency):.0%} that is {(f'{bound * 1e3:.1f} ms' if bound >= 1e-3 else f'{bound * 1e6:.3g} µs')}, so compute is {pr.compute_seconds / bound:.1f}× its FLOP bound "
                    "(memory-bound ops and launch floors make up the rest)",
                )
            )
    if pr.memory_bytes_per_device:
        cap = (
            f" of {float(hw.dram_bytes) / 1e9:.0f} GB ({100 * pr.memory_bytes_per_device / float(hw.dram_bytes):.1f} %)"
            if hw
            else ""
        )
        rows.append(
            (
                "memory per device",
                f"{pr.memory_bytes_per_device / 1e9:.4g} GB{cap}: weights + 3× the largest live activation set",
            )
        )
    if p.weight_sets is not None:
        rows.append(
            (
                "weight sets",
                f"{p.weight_sets} resident per device (the memory budget holds {p.weight_sets}× the weights"
                + (", e.g. both Wan 2.2 experts)" if p.weight_sets > 1 else ")"),
            )
        )
    c = p.cfg_parallel
    if c is not None:
        how = (
            f": {c.axis!r} splits the batch, one branch per half of the mesh"
            if c.split
            else ": both branches on the whole mesh"
        )
        rows.append(
            ("CFG parallel", f"{c.chosen} ({c.mode}) for the batch-{c.batch} CFG pair on mesh {c.base_mesh}" + how)
        )
    rows.append(("parallelism", rep.parallelism()))
    bill = rep.bill()
    rows.append(("collectives per block", f"{bill.headline()} ({bill.breakdown()})" if bill.entries else "none"))
    sharded = len(p.sharded_params())
    rows.append(("parameters", f"{len(p.params)} ({sharded} sharded); {len(p.activations)} activation constraints"))
    return rows


def render_markdown(rep: Report) -> str:
    p = rep.plan
    lines = [f"# Sharding plan: {p.model} on {p.mesh} ({', '.join(p.mesh.axis_names)})", ""]
    lines += _table(("plan", "value"), header_rows(rep))
    n = rep.num_blocks

    if p.cfg_parallel is not None:
        lines += ["", "## CFG parallel", ""] + cfg_lines(p.cfg_parallel)

    views = rep.decisions()
    if views:
        unit = views[-1].unit
        lines += ["", "## Decisions", ""]
        lines += _table(
            ("where", "chosen", f"plan with it, ms/{unit}", "best rejected", "best plan without it", "Δ"),
            (
                (
                    d.node,
                    f"**{d.strategy}**" + (f" (+FSDP on {blocks_text(*d.fsdp_blocks)})" if d.fsdp_blocks else ""),
                    ms(d.cost),
                    d.rejected or "—",
                    ms(d.rejected_cost),
                    f"{d.margin * 1e3:+.3f} ms" if d.margin is not None else "—",
                )
                for d in views
            ),
        )

    if rep.trace:
        lines += [
            "",
            f"## One block, op by op (`blocks.*`, ×{n})",
            "",
            "State = global shape and layout, one placement per mesh axis "
            f"({', '.join(p.mesh.axis_names)}): `S(d)` split on dim d, `R` replicated, `P(sum)` partial sums "
            "(`[d: a>b]`: dim d split over a then b, against the mesh order). µs = predicted compute + collectives "
            "of the op, per block.",
            "",
        ]
        lines += _op_table(rep, rep.table_rows("block"))
        seg = {s: (t, c, m) for s, t, c, m in rep.segment_costs()}
        t, c, m = seg["block"]
        lines += [
            "",
            f"Block total: {us(c + m)} µs (compute {us(c)} µs + comm {us(m)} µs) × {n} blocks = {ms((c + m) * n)} ms per forward.",
        ]
        bill = rep.bill()
        if bill.entries:
            lines += ["", f"**Collective bill per block: {bill.headline()}**", ""]
            lines += _table(
                ("collective", "axes", "bytes per call", "per block", "size", "where"),
                (
                    (
                        e.kind,
                        "+".join(e.axes),
                        human_bytes(e.bytes),
                        f"{e.per_block:g}",
                        "small" if e.small else "big",
                        e.where,
                    )
                    for e in bill.entries
                ),
            )
        for fam in rep.families():
            rows = [r for r in rep.rows("family") if r["family"] == fam["prefix"]]
            fc, fm = sum(r["compute_s"] for r in rows), sum(c["seconds"] for r in rows for c in r["collectives"])
            lines += ["", f"## One `{fam['prefix']}` block, op by op (`{fam['prefix']}.*`, ×{fam['blocks']})", ""]
            lines += _op_table(rep, [r for r in rows if r["kernel"] or r["collectives"] or r["constraint"]])
            lines += [
                "",
                f"Block total: {us(fc + fm)} µs (compute {us(fc)} µs + comm {us(fm)} µs) × {fam['blocks']} blocks "
                f"= {ms((fc + fm) * fam['blocks'])} ms per forward.",
            ]
        once = [r for r in rep.rows("prologue") + rep.rows("epilogue") if r["collectives"] or r["constraint"]]
        if once:
            lines += ["", "## Once per forward (before and after the block stack)", ""]
            lines += _op_table(rep, once)
            pc, pm = seg["prologue"][1:], seg["epilogue"][1:]
            lines += ["", f"Prologue {us(sum(pc))} µs, epilogue {us(sum(pm))} µs (compute + comm)."]

    if p.collectives:
        lines += ["", "## Predicted collectives per forward", ""]
        lines += _table(
            ("collective", "axes", "bytes per call", "calls", "µs per call", "where"),
            (
                (
                    c.kind,
                    "+".join(c.axes),
                    human_bytes(c.bytes),
                    str(c.count),
                    us(s) if (s := rep.collective_seconds(c)) is not None else "—",
                    c.where,
                )
                for c in p.collectives
            ),
        )

    if views:
        lines += ["", "## Why", ""]
        for v in views:
            lines += _why(rep, v)
    if p.solver.status == "hand-written":
        lines += [
            "",
            "## Why",
            "",
            "Hand-written plan: no alternatives were priced. Compare it with an auto plan with "
            "`wancompile diff HAND/plan.json AUTO/plan.json`.",
        ]

    extra = [
        *(f"- guard: `{g}`" for g in p.guards),
        *(f"- rewrite `{r.name}`: {r.count} site(s)" for r in p.rewrites if r.count),
        *(f"- {x}" for x in p.notes),
    ]
    if extra:
        lines += ["", "## Notes", ""] + extra
    text = "\n".join(lines).rstrip() + "\n"
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    return text


def cfg_lines(c) -> list[str]:
    """The CFG-parallel options of a batch-2 plan (planner.cfg), one row each, from the typed record."""

    def gb(o):
        return f"{o.memory_bytes_per_device / 1e9:.4g}" if o.memory_bytes_per_device is not None else "—"

    out = [
        f"Mode `{c.mode}`; per denoising step = one batch-{c.batch} forward (cond + uncond). `split(AXIS)`: "
        f"mesh axis AXIS halved, the major half named `{c.axis}` splits the batch; each half runs one branch's plan "
        "on its submesh.",
        "",
    ]
    out += _table(
        ("option", "mesh", "ms per step", "compute ms", "comm ms", "GB/device", "chosen", "why not / note"),
        (
            (
                f"`{o.name}`",
                f"{o.mesh} ({', '.join(o.mesh.axis_names)})",
                ms(o.step_seconds),
                ms(o.compute_seconds),
                ms(o.comm_seconds),
                gb(o),
                "**yes**" if o.name == c.chosen else "",
                o.reason or "—",
            )
            for o in c.options
        ),
    )
    return out


def _op_table(rep: Report, rows: list[dict]) -> list[str]:
    def coll(r: dict) -> str:
        return "<br>".join(f"{c['kind']} on {'+'.join(c['axes'])}" for c in r["collectives"]) or "—"

    def nbytes(r: dict) -> str:
        return "<br>".join(human_bytes(c["bytes"]) for c in r["collectives"]) or "—"

    def state_in(r: dict) -> str:
        return "<br>".join(dict.fromkeys(rep.state(x) for x in r["in"])) or "—"

    return _table(
        ("op", "weights", "state in", "state out", "constraint", "collective", "bytes", "µs"),
        (
            (
                f"`{r['loc']}`",
                rep.weights(r) or "—",
                state_in(r),
                rep.state(r["out"]),
                f"`{rep.spec(r['constraint'])}`" if r["constraint"] is not None else "—",
                coll(r),
                nbytes(r),
                us(r["compute_s"] + sum(c["seconds"] for c in r["collectives"])),
            )
            for r in rows
        ),
    )


def _why(rep: Report, d) -> list[str]:
    unit = d.unit
    out = [f"### {d.node}: {d.strategy}", ""]
    memory = weights_text(d)
    out.append(
        f"- **chosen** `{d.strategy}`"
        + (f" (stream `{d.stream}`" + (f", {d.state}" if d.state else "") + ")" if d.stream else "")
        + f": the best plan with it costs {ms(d.cost)} ms per {unit}"
        + (f"; {memory}" if memory else "")
    )
    if d.fsdp_blocks is not None:
        out.append(f"- **FSDP block range**: {fsdp_range_text(d)}")
    if d.pad_heads is not None:
        p = d.pad_heads
        out.append(
            f"- **padded heads** {p.heads} -> {p.padded} at `{p.module}`: {p.padded - p.heads} zero heads "
            f"(exact; rewrites/pad_heads.py), priced at {p.padded}/{p.heads} of the attention's work, the padded "
            "weights held beside the model's"
        )
    if d.rejected:
        line = f"- **best rejected** `{d.rejected}`: the best plan with it instead costs {ms(d.rejected_cost)} ms per {unit}"
        if d.margin is not None:
            line += f" ({d.margin * 1e3:+.3f} ms)"
        out.append(line)
    rest = [o for o in d.options if o.name not in (d.strategy, d.rejected)]
    if rest:
        out.append("- other options priced: " + ", ".join(f"`{o.name}` {o.seconds_own * 1e3:.3f} ms" for o in rest))
    if d.excluded:
        out.append("- excluded: " + "; ".join(f"{x.option}: {x.reason}" for x in d.excluded))
    if d.ring is not None:
        out.append(f"- {ring_text(d)}")
    for x in decision_account(d):
        out.append(f"- {x}")
    rows = [r for r in rep.rows() if r["group"] == d.macro and r["collectives"]]
    if rows:
        out.append(
            "- collectives it implies (per call): "
            + ", ".join(
                f"{c['kind']} on {'+'.join(c['axes'])} {human_bytes(c['bytes'])} at `{r['loc']}`"
                for r in rows
                for c in r["collectives"]
            )
        )
    out.append("")
    return out
