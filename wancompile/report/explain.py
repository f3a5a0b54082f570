"""``wancompile explain PLAN WHAT``: one decision, parameter, module or op of a plan, in plain words.

WHAT may be a decision (``attn1``, ``blocks.*.attn1``, ``blocks.7.ffn``,
``condition_embedder.time_embedder``), a parameter (``blocks.3.attn1.to_q.weight``), a module
(``blocks.0.attn1.to_k``) or an op location (``blocks.0.attn1:scaled_dot_product_attention#0``).
Block indices are interchangeable: blocks share their decisions. The answer says what was chosen,
what it costs (µs per call, collectives with bytes), and the alternatives with their costs.
"""

from __future__ import annotations

from planner.plan import MAIN_STACK, Decision, PlanError
from wancompile.report.model import (
    Report,
    decision_account,
    fsdp_range_text,
    human_bytes,
    ms,
    ring_text,
    us,
    weights_text,
)


def explain(rep: Report, what: str) -> str:
    """Text answer for `what`; raises PlanError (with near misses) when the plan has no such thing."""
    plan = rep.plan
    g = plan.generic(what.strip())
    block = plan.block_of(what.strip())
    n_blocks = (rep.num_blocks if block[0] == MAIN_STACK else plan.stacks[block[0]]) if block else 0
    if block and n_blocks and block[1] >= n_blocks:
        raise PlanError(
            f"no such block: plan {rep.source or ''} has blocks 0..{n_blocks - 1}, not {block[1]} "
            f"(blocks share decisions: try {block[0]}.0{block[2]})"
        )
    lines: list[str] = []

    if g.replace("_", "-") in ("cfg", "cfg-parallel") and plan.cfg_parallel is not None:
        return _explain_cfg(plan.cfg_parallel)
    d = rep.decision(g)
    if d is not None:
        return _explain_decision(rep, d)

    params = [p for p in plan.params if plan.generic(p) == g]
    if params:
        name = params[0]
        spec = plan.params[name]
        n = len(params) if plan.block_of(name) is not None else 1
        lines.append(f"parameter {g}" + (f" (same spec in all {rep.num_blocks} blocks)" if n > 1 else ""))
        known = (rep.trace or {}).get("params", {})
        info = next((known[p] for p in params if p in known), None)  # block 0 stands for all blocks
        sharded = any(e is not None for e in spec)
        lines.append(f"  spec: {rep.spec(spec)}" + ("  (replicated)" if not sharded else ""))
        if info:
            shape = info["shape"]
            local = [
                d // plan.mesh.entry_size(e) if isinstance(d, int) else f"{d}/{plan.mesh.entry_size(e)}"
                for d, e in zip(shape, spec)
            ]
            lines.append(f"  shape: {tuple(shape)} {info['dtype']}; per device {tuple(local)}")
        users = [r for r in rep.rows() if r["module"] == g.rsplit(".", 1)[0] and r["weights"]]
        for r in users:
            lines.append(
                f"  used by {r['loc']}: {rep.state(r['in'][0]) if r['in'] else ''} -> {rep.state(r['out'])}" + _coll(r)
            )
        d = rep.decision_for(g.rsplit(".", 1)[0])
        if d:
            lines.append(f"  decided by {d.node}: {d.strategy} (see `wancompile explain PLAN {d.macro}`)")
        return "\n".join(lines)

    rows = [r for r in rep.rows() if r["loc"] == g] or [r for r in rep.rows() if r["module"] == g]
    acts = [a for a in plan.activations if plan.generic(str(a.location)) == g or plan.generic(a.location.module) == g]
    if rows or acts:
        lines.append(f"{'op' if ':' in g else 'module'} {g}")
        for r in rows:
            lines.append(
                f"  {r['loc']}: {', '.join(dict.fromkeys(rep.state(x) for x in r['in'])) or '-'} -> {rep.state(r['out'])}"
                + (f"; weights {rep.weights(r)}" if r["weights"] else "")
                + f"; {us(r['compute_s'] + sum(c['seconds'] for c in r['collectives']))} µs"
                + _coll(r)
            )
        for a in acts[:1]:
            lines.append(
                f"  constraint at {plan.generic(str(a.location))}: {rep.spec(a.spec)}"
                + (f" ({len(acts)} sites)" if len(acts) > 1 else "")
                + (f" — {a.reason}" if a.reason else "")
            )
        d = rep.decision_for(rows[0]["module"] if rows else plan.generic(acts[0].location.module))
        if d:
            lines.append(f"  decided by {d.node}: {d.strategy} (see `wancompile explain PLAN {d.macro}`)")
        if not rows and rep.trace is None:
            lines.append("  (plan.json has no per-op trace; `wancompile plan` writes one)")
        return "\n".join(lines)

    near = sorted({d.macro for d in plan.decisions} | {plan.generic(p).rsplit(".", 1)[0] for p in plan.params})
    last = g.split(" ")[0].split(".")[-1]
    close = [x for x in near if last in x][:8] or near[:8]
    raise PlanError(
        f"no such decision, parameter, module or op: plan {rep.source or ''} has none named {what!r}; "
        f"try one of: {', '.join(close)}"
    )


def _explain_cfg(c) -> str:
    base = c.base_mesh
    lines = [f"cfg-parallel: {c.chosen} (mode {c.mode}; batch {c.batch} on mesh {base} {base.axis_names})"]
    for o in c.options:
        mark = " *" if o.name == c.chosen else ""
        if o.step_seconds is not None:
            lines.append(
                f"  {o.name:<14} on {o.mesh} {o.mesh.axis_names}: {ms(o.step_seconds)} ms per step = compute "
                f"{ms(o.compute_seconds)} + comm {ms(o.comm_seconds)}; "
                f"{o.memory_bytes_per_device / 1e9:.4g} GB/device{mark}"
                + (f" — not taken: {o.reason}" if o.reason else "")
            )
        else:
            lines.append(f"  {o.name:<14} on {o.mesh} {o.mesh.axis_names}: no plan — {o.reason}{mark}")
    if c.split:
        lines.append(
            f"  the plan's mesh is {c.option(c.chosen).mesh}: {c.axis!r} splits dim 0 of every "
            "batch-carrying value, parameters are replicated over it"
        )
    return "\n".join(lines)


def _coll(r: dict) -> str:
    if not r["collectives"]:
        return ""
    return "; " + ", ".join(
        f"{c['kind']} on {'+'.join(c['axes'])} {human_bytes(c['bytes'])} ({us(c['seconds'])} µs)"
        for c in r["collectives"]
    )


def _explain_decision(rep: Report, d: Decision) -> str:
    unit = d.unit
    memory = weights_text(d)
    lines = [
        f"{d.node}: {d.strategy}",
        f"  cost: the best plan with it, {ms(d.cost)} ms per {unit}" + (f"; {memory}" if memory else ""),
    ]
    if d.stream:
        lines.append(f"  stream: {d.stream}" + (f" ({d.state})" if d.state else ""))
    if d.fsdp_blocks is not None:
        lines.append(f"  FSDP block range: {fsdp_range_text(d)}")
    rows = [r for r in rep.rows() if r["group"] == d.macro]
    colls = [(r, c) for r in rows for c in r["collectives"]]
    if colls:
        lines.append("  collectives per call:")
        lines += [
            f"    {c['kind']:<18} {'+'.join(c['axes']):<12} {human_bytes(c['bytes']):>10}  {us(c['seconds']):>8} µs  at {r['loc']}"
            for r, c in colls
        ]
    elif rows:
        lines.append("  collectives: none")
    if rows:
        comp = sum(r["compute_s"] for r in rows)
        comm = sum(c["seconds"] for _, c in colls)
        lines.append(f"  per call: compute {us(comp)} µs + collectives {us(comm)} µs")
    scopes = (d.scope, *d.members)
    seen = set()
    for a in rep.plan.activations:
        k = rep.plan.generic(str(a.location))
        module = rep.plan.generic(a.location.module)
        if a.location.module and any(module == s or module.startswith(s + ".") for s in scopes) and k not in seen:
            seen.add(k)
            lines.append(f"  constraint {k} -> {rep.spec(a.spec)}" + (f" ({a.reason})" if a.reason else ""))
    if d.rejected:
        lines.append(
            f"  best rejected: {d.rejected}, the best plan with it instead {ms(d.rejected_cost)} ms per {unit}"
            + (f" ({d.margin * 1e3:+.3f} ms)" if d.margin is not None else "")
        )
    if d.options:
        lines.append(
            f"  options priced (ms per {unit}): "
            + ", ".join(
                f"{o.name}={o.seconds_own * 1e3:.3f}" + (" *" if o.name == d.strategy else "") for o in d.options
            )
        )
    for x in d.excluded:
        lines.append(f"  excluded: {x.option}: {x.reason}")
    if d.ring is not None:
        lines.append(f"  {ring_text(d)}")
    for x in decision_account(d):
        lines.append(f"  note: {x}")
    return "\n".join(lines)
