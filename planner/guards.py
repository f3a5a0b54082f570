"""Symbolic token counts: the guards a plan records, and what to do when a resolution breaks them.

A plan made for symbolic tokens ``L`` (dynamo ``dynamic=True``, or `symbolize_tokens` on a captured
graph) records every divisibility it assumed — ``L % 8 == 0`` for tokens split 8 ways, ``L % 256 ==
0`` for 32-token tiles on 8 SP ranks — as `planner.placements.Guard`s. `check_guards` answers for a
new resolution: reuse the plan, pad the tokens up to the next multiple (masked keys; cheap when the
padding is small), or re-plan (padding would waste more than `max_pad` of the work).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import sympy

from planner.graph import Graph, TensorMeta
from planner.plan import Plan


def symbolize_tokens(graph: Graph, tokens: int, name: str = "L") -> Graph:
    """A copy of `graph` whose token dims (every dim equal to `tokens`) are the symbol `name`."""
    sym = sympy.Symbol(name, positive=True, integer=True)
    nodes = []
    for n in graph:
        outs = tuple(TensorMeta(tuple(sym if d == tokens else d for d in m.shape), m.dtype) for m in n.outputs)
        nodes.append(replace(n, outputs=outs))
    return Graph(nodes, model=graph.model, block_prefixes=graph.block_prefixes, families=graph.families)


@dataclass(frozen=True)
class GuardCheck:
    action: str  # reuse | pad | replan
    broken: tuple[str, ...]
    padded: dict

    def __str__(self) -> str:
        if self.action == "reuse":
            return "all guards hold: reuse the plan"
        return f"{self.action}: broken {', '.join(self.broken)}" + (
            f"; pad to {self.padded}" if self.action == "pad" else ""
        )


def check_guards(plan: Plan, values: dict[str, int], *, max_pad: float = 0.05) -> GuardCheck:
    broken = [g for g in plan.guards if not g.holds(values)]
    if not broken:
        return GuardCheck("reuse", (), {})
    padded = dict(values)
    for g in broken:
        syms = sorted(map(str, sympy.sympify(g.expr).free_symbols))
        if len(syms) != 1:
            return GuardCheck("replan", tuple(map(str, broken)), {})
        s = syms[0]
        padded[s] = math.lcm(g.divisor, 1) * math.ceil(padded[s] / g.divisor)
    if any(not g.holds(padded) for g in plan.guards):
        return GuardCheck("replan", tuple(map(str, broken)), {})
    waste = max((padded[k] - values[k]) / values[k] for k in values)
    return GuardCheck("pad" if waste <= max_pad else "replan", tuple(map(str, broken)), padded)
