"""`explain_choices`: the typed `Decision` of every ILP group, shared by the DiT and the VAE planner.

After the solve, for each group g with chosen option i:

- ``cost`` is the solved plan's objective; every option is priced on its own (`OptionCost`:
  count × per-call cost + once-per-forward cost, its weights and activation estimate, its stream);
- the best rejected option is found by re-solving with i forbidden; its objective is
  ``rejected_cost`` and the difference is split into this group, the stream-layout edges and the
  other groups (`CostSplit`, with the groups whose choice moved);
- if an option is cheaper on its own than i (and is not the runner-up), the best plan that must use
  it is solved too (`Alternative`): why the cheap option lost;
- the exclusions the strategy enumerators gave (`Exclusion`) are kept, deduplicated;
- a group whose chosen option runs its FSDP twin on some of its blocks (`planner.ilp`, (e)) says
  which (``fsdp_blocks``, the range `planner.ilp.twin_range` names, and ``fsdp_strategy``); its own
  cost and weights are those of the mix.

The two planners differ only in what they pass: which groups are block macros, the stream of an
option's key in the layout notation (`planner.placements`), which options shard weights for memory,
the macros a group stands for, and the unit of the costs.
"""

from __future__ import annotations

from typing import Callable, Hashable, Mapping, Sequence

from planner.ilp import KIB, Edge, Group, Infeasible, SolveResult, solve, twin_range
from planner.plan import Alternative, CostSplit, Decision, Exclusion, Move, OptionCost

RESOLVE_S = 2.0  # time limit of each re-solve (forbid the choice / force the cheap option)


def own_seconds(g: Group, j: int, k: int = 0) -> float:
    """What option j of group g costs per forward on its own (all repetitions, k of them on its FSDP
    twin, plus once-costs)."""
    return g.cost_ns(j, k) / 1e9


def explain_choices(
    groups: Sequence[Group],
    edges: Sequence[Edge],
    res: SolveResult,
    memory_kib: int,
    excluded: Mapping[str, Sequence[Exclusion]],
    unit: str = "forward",
    *,
    in_block: Callable[[Group], bool] = lambda g: False,
    stream: Callable[[Group, Hashable], str] = lambda g, key: "",
    fsdp: Callable[[Group, int], bool] = lambda g, j: False,
    members: Mapping[str, Sequence[str]] = {},
) -> tuple[Decision, ...]:
    """One `Decision` per group of a solved ILP (see the module docstring)."""
    by_name = {g.name: g for g in groups}

    def edge_s(choice: Mapping[str, int]) -> float:
        return (
            sum(
                e.count
                * e.cost_ns.get(
                    (by_name[e.src].options[choice[e.src]].key, by_name[e.dst].options[choice[e.dst]].key), 0
                )
                for e in edges
            )
            / 1e9
        )

    def own(g: Group, r: SolveResult) -> float:
        return own_seconds(g, r.choice[g.name], r.blocks_on_twin(g.name))

    def others(g: Group, r: SolveResult) -> float:
        return sum(own(h, r) for h in groups if h.name != g.name)

    def memory(choice: Mapping[str, int], twins: Mapping[str, int]) -> int:  # the left side of the ILP's (d)
        picked = [(h, choice[h.name], twins.get(h.name, 0)) for h in groups]
        return sum(h.param_kib(j, k) for h, j, k in picked) + max((h.act_kib(j, k) for h, j, k in picked), default=0)

    def split(g: Group, alt: SolveResult) -> CostSplit:
        moved = tuple(
            Move(h.name, h.options[alt.choice[h.name]].name)
            for h in groups
            if h.name != g.name and alt.choice[h.name] != res.choice[h.name]
        )
        # the others moved to fit the memory budget if the alternative alone, with them as chosen, does not
        alone = {**res.choice, g.name: alt.choice[g.name]}
        twins = {**res.twin_blocks, g.name: alt.blocks_on_twin(g.name)}
        return CostSplit(
            own(g, alt) - own(g, res),
            edge_s(alt.choice) - edge_s(res.choice),
            others(g, alt) - others(g, res),
            moved,
            for_memory=bool(moved) and memory(alone, twins) > memory_kib,
        )

    out = []
    cost = res.objective_ns / 1e9
    for g in groups:
        i, k = res.choice[g.name], res.blocks_on_twin(g.name)
        o = g.options[i]
        rejected, rcost, rsplit, alt_j = "", None, None, None
        if len(g.options) > 1:
            try:
                alt = solve(groups, edges, memory_kib=memory_kib, forbid={g.name: i}, time_limit_s=RESOLVE_S)
                alt_j = alt.choice[g.name]
                rejected, rcost, rsplit = g.options[alt_j].name, alt.objective_ns / 1e9, split(g, alt)
            except Infeasible:
                pass  # every alternative breaks the memory budget
        cheaper = None
        cheapest = min(range(len(g.options)), key=lambda j: (own_seconds(g, j), j))
        if own_seconds(g, cheapest) < own(g, res) and cheapest not in (alt_j, i):
            try:
                forced = solve(groups, edges, memory_kib=memory_kib, only={g.name: cheapest}, time_limit_s=RESOLVE_S)
                cheaper = Alternative(
                    g.options[cheapest].name,
                    own_seconds(g, cheapest),
                    forced.objective_ns / 1e9,
                    split(g, forced),
                )
            except Infeasible:
                cheaper = Alternative(g.options[cheapest].name, own_seconds(g, cheapest))
        options = tuple(
            sorted(
                (
                    OptionCost(p.name, own_seconds(g, j), p.param_kib * KIB, p.act_kib * KIB, stream(g, p.key))
                    for j, p in enumerate(g.options)
                ),
                key=lambda c: (c.seconds_own, c.name),
            )
        )
        out.append(
            Decision(
                macro=g.name,
                strategy=o.name,
                cost=cost,
                count=g.count,
                in_block=in_block(g),
                members=tuple(members.get(g.name, ())),
                rejected=rejected,
                rejected_cost=rcost,
                rejected_split=rsplit,
                cheaper_alone=cheaper,
                options=options,
                excluded=tuple(dict.fromkeys(excluded.get(g.name, ()))),
                weight_bytes_per_device=g.param_kib(i, k) * KIB,
                fsdp=fsdp(g, i) or k > 0,
                fsdp_blocks=twin_range(g.count, k) if k else None,
                fsdp_strategy=g.options[g.twin(i)].name if k else "",
                stream=stream(g, o.key),
                unit=unit,
            )
        )
    return tuple(out)
