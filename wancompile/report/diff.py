"""``wancompile diff A B``: what changed between two plans and what it costs.

Sections: setting (model, mesh, hardware), parallelism (SP and TP axes, from the block-stack entry
constraint and the Q projection), predicted time/compute/comm/memory with deltas, decisions whose
strategy changed (cost A -> B), the per-block collective bill, collectives per (kind, axes) with
calls, bytes and predicted seconds per forward, and parameter specs that changed (block-shared
names folded to ``blocks.*``).
"""

from __future__ import annotations

from collections import defaultdict

from wancompile.report.model import Report, human_bytes


def _delta(a: float, b: float, scale: float = 1e3, unit: str = "ms") -> str:
    d = b - a
    pct = f", {100 * d / a:+.1f} %" if a else ""
    return f"{a * scale:.3f} -> {b * scale:.3f} {unit} ({d * scale:+.3f} {unit}{pct})"


def _per_kind(rep: Report) -> dict:
    out: dict = defaultdict(lambda: [0, 0, 0.0])
    for c in rep.plan.collectives:
        row = out[(c.kind, tuple(c.axes))]
        row[0] += c.count
        row[1] += c.bytes * c.count
        s = rep.collective_seconds(c)
        row[2] += (s or 0.0) * c.count
    return out


def diff(a: Report, b: Report) -> str:
    pa, pb = a.plan, b.plan
    lines = [f"A: {a.source or 'plan A'}", f"B: {b.source or 'plan B'}"]
    for name, x, y in (
        ("model", pa.model, pb.model),
        ("mesh", f"{pa.mesh} {pa.mesh.axis_names}", f"{pb.mesh} {pb.mesh.axis_names}"),
        ("hardware", pa.hardware, pb.hardware),
        ("solver", pa.solver.status, pb.solver.status),
    ):
        lines.append(f"{name:<10} {x}" + (f"  ->  {y}" if x != y else "  (same)"))
    lines.append("")
    lines.append("parallelism")
    lines.append(f"  A: {a.parallelism()}")
    lines.append(f"  B: {b.parallelism()}")
    if _axes(a, a.sp_axes()) != _axes(b, b.sp_axes()):
        lines.append(f"  SP changed: {_axes(a, a.sp_axes())} -> {_axes(b, b.sp_axes())}")
    if _axes(a, a.tp_axes()) != _axes(b, b.tp_axes()):
        lines.append(f"  TP changed: {_axes(a, a.tp_axes())} -> {_axes(b, b.tp_axes())}")
    qa, qb = pa.predicted, pb.predicted
    lines += [
        "",
        "predicted per forward (B - A)",
        f"  step     {_delta(qa.step_seconds, qb.step_seconds)}",
        f"  compute  {_delta(qa.compute_seconds, qb.compute_seconds)}",
        f"  comm     {_delta(qa.comm_seconds, qb.comm_seconds)}",
        f"  memory   {_delta(qa.memory_bytes_per_device, qb.memory_bytes_per_device, 1e-9, 'GB')} per device",
    ]
    ga = {d.scope: d for d in a.decisions()}
    gb = {d.scope: d for d in b.decisions()}
    keys = list(dict.fromkeys([*ga, *gb]))
    changed = [
        (k, ga.get(k), gb.get(k)) for k in keys if (ga.get(k) and ga[k].strategy) != (gb.get(k) and gb[k].strategy)
    ]
    lines += ["", f"decisions: {len(changed)} changed of {len(keys)}"]
    for k, x, y in changed:
        cost = (
            f" ({x.cost * 1e3:.3f} -> {y.cost * 1e3:.3f} ms per forward, {(y.cost - x.cost) * 1e3:+.3f})"
            if x and y
            else ""
        )
        lines.append(f"  {k}: {x.strategy if x else '-'} -> {y.strategy if y else '-'}{cost}")
    ba, bb = a.bill(), b.bill()
    lines += [
        "",
        f"collective bill per block: {ba.headline()} -> {bb.headline()}",
        f"  A: {ba.breakdown() or '-'}",
        f"  B: {bb.breakdown() or '-'}",
    ]
    ka, kb = _per_kind(a), _per_kind(b)
    lines += ["", "collectives per forward (calls, bytes, predicted seconds)"]
    for k in sorted(set(ka) | set(kb)):
        x, y = ka.get(k, [0, 0, 0.0]), kb.get(k, [0, 0, 0.0])
        lines.append(
            f"  {k[0]:<18} {'+'.join(k[1]):<12} calls {x[0]:>5} -> {y[0]:<5} bytes {human_bytes(x[1]):>10} -> {human_bytes(y[1]):<10} "
            f"time {x[2] * 1e3:.3f} -> {y[2] * 1e3:.3f} ms ({(y[2] - x[2]) * 1e3:+.3f})"
        )
    lines += ["", "parameter specs"]
    fold_a, fold_b = _fold(pa), _fold(pb)
    only_a = sorted(set(fold_a) - set(fold_b))
    only_b = sorted(set(fold_b) - set(fold_a))
    diffs = sorted(k for k in set(fold_a) & set(fold_b) if fold_a[k] != fold_b[k])
    if only_a or only_b:
        lines.append(
            f"  names differ: {len(only_a)} only in A (e.g. {', '.join(only_a[:3])}), {len(only_b)} only in B (e.g. {', '.join(only_b[:3])})"
        )
    lines.append(f"  {len(diffs)} changed of {len(set(fold_a) & set(fold_b))}")
    for k in diffs:
        lines.append(f"  {k}: {_specs(a, fold_a[k])} -> {_specs(b, fold_b[k])}")
    return "\n".join(lines)


def _axes(rep: Report, axes: tuple[str, ...]) -> str:
    if not axes:
        return "none"
    n = 1
    for x in axes:
        n *= rep.plan.mesh.axis_size(x)
    return f"{'×'.join(axes)} ({n}-way)"


def _fold(plan) -> dict[str, frozenset]:
    out: dict[str, set] = defaultdict(set)
    for name, spec in plan.params.items():
        out[plan.generic(name)].add(tuple(spec))
    return {k: frozenset(v) for k, v in out.items()}


def _specs(rep: Report, specs: frozenset) -> str:
    return " | ".join(sorted(rep.spec(s) for s in specs))
