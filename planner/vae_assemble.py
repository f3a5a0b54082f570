"""The VAE decode's plan from a solved problem: `assemble`.

Owns the plan's bill (each macro's chosen option, its evaluation read from the problem: the one the
solver priced, on its group's representative, with its places renamed to the macro's own; the stream
layout changes between macros), the parameter specs, the activation constraints (each option's pins,
the graph inputs entering in the plan's layout, a macro reading its stream in its own layout) and the
memory prediction.
"""

from __future__ import annotations

from collections import Counter

from planner import engine, pricing
from planner.macros import Macro, crossing
from planner.placements import as_number, numel
from planner.plan import ActivationConstraint, Plan, Predicted
from planner.reshard import redistribute
from planner.vae_macros import key_name, stream_layout
from planner.vae_strategies import VaeStrategy


def assemble(fam, problem: engine.Problem, solution: engine.Solution, decisions) -> Plan:
    """`engine.Family.assemble` of `planner.vae_plan.VaeFamily`."""
    g, mesh, chosen = fam.g, fam.mesh, solution.chosen
    events: Counter = Counter()
    compute = 0.0
    warnings: list[str] = []
    acts: list[ActivationConstraint] = []
    params = {n.param: (None,) * len(n.out.shape) for n in g.params()}
    key_of: dict[str, tuple] = {}
    peak = 0.0
    param_bytes = 0.0
    for m in fam.macros:
        gname = fam.group_of[m.name]
        ev = problem.evals[gname, chosen[gname].name]
        names = _correspondence(g, fam.by_name[gname], m)
        s = _renamed(chosen[gname], names)
        places = {str(g[a].location): str(g[b].location) for a, b in names.items()}
        key_of[m.name] = s.key
        compute += ev.compute_seconds
        peak = max(peak, ev.peak_bytes)
        param_bytes += fam.param_bytes(m, s)
        warnings += ev.warnings  # in the representative's words
        for e in ev.events:
            events[(e.kind, e.axes, e.bytes, places.get(e.where, e.where))] += 1
        for p, lay in s.params.items():
            params[g[p].param] = lay.to_spec()
        for name, lay in s.forced.items():
            acts.append(
                ActivationConstraint(
                    g[name].location, lay.to_spec(), g[name].out.shape, reason=f"{m.kind} {s.name}: {g[name].op} output"
                )
            )
        for x in fam.crossing(m):
            src = g[x]
            if src.op == "placeholder":  # graph input (latents, chunk history): enters in this layout
                spec = stream_layout(s.key, src.out).to_spec()
                if any(e is not None for e in spec) and all(a.location != src.location for a in acts):
                    acts.append(
                        ActivationConstraint(
                            src.location, spec, src.out.shape, reason="graph input enters in the plan's layout"
                        )
                    )
    for m in fam.macros:
        for x in fam.crossing(m):
            src_macro = fam.macro_of.get(x)
            if src_macro is None or key_of[src_macro] == key_of[m.name]:
                continue
            meta = g[x].out
            have, want = stream_layout(key_of[src_macro], meta), stream_layout(key_of[m.name], meta)
            for kind, axes, shape in redistribute(meta, have, want, mesh):
                nbytes = int(as_number(numel(shape), fam.vals) * meta.itemsize)
                events[(kind, axes, nbytes, f"{g[x].location} -> {m.name}")] += 1
            if have != want:  # the macro was priced reading its stream in its own layout: so it reads it
                for reader in m.nodes:
                    for i, inp in enumerate(g[reader].inputs):
                        if inp == x:
                            acts.append(
                                ActivationConstraint(
                                    g[reader].location,
                                    want.to_spec(),
                                    meta.shape,
                                    reason=f"{m.name} reads {g[x].location} as {key_name(key_of[m.name])}",
                                    input=i,
                                )
                            )
    collectives, comm = pricing.bill(events, mesh, fam.hw)
    memory = int(param_bytes + pricing.ACTIVATION_FACTOR * peak)
    notes = [
        "VAE plan: one strategy per macro (residual block, attention, upsampler, head, tail); identical residual "
        "blocks share one ILP variable",
        "predicted time = compute + comm, no overlap; memory = parameters + 3 x the largest per-op live set",
    ]
    notes += [f"warning: {w}" for w in dict.fromkeys(warnings)]
    return Plan(
        model=fam.model,
        mesh=mesh,
        params=params,
        activations=tuple(acts),
        hardware=fam.hw.name,
        collectives=collectives,
        predicted=Predicted(compute + comm, compute, comm, memory),
        solver=engine.solver_info(solution),
        decisions=tuple(decisions),
        notes=tuple(notes),
        weight_sets=1,
    )


def _correspondence(graph, rep: Macro, m: Macro) -> dict[str, str]:
    """Node names of `rep`, the group's representative, -> `m`'s (same signature: the same ops in the
    same order): its ops, the values it reads, its parameters."""
    pairs = zip(
        rep.nodes + tuple(crossing(graph, rep)) + rep.params,
        m.nodes + tuple(crossing(graph, m)) + m.params,
        strict=True,
    )
    return dict(pairs)


def _renamed(s: VaeStrategy, names: dict[str, str]) -> VaeStrategy:
    """Option `s` of a group's representative as the option of the member whose names `names` gives."""
    return VaeStrategy(
        s.name,
        s.key,
        {names[p]: lay for p, lay in s.params.items()},
        {names[x]: lay for x, lay in s.forced.items()},
    )
