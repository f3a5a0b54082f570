"""The DiT family's decisions: one typed `Decision` per macro (`planner.explain`), with the stream
state, the further family, the head padding and what ring attention would cost beside the choice.

A mixin of `planner.dit_family.DitFamily`: its methods read the family's state (``self.g``, ``self.st``, ``self.mesh`` ...) and call its other parts by name.
"""

from __future__ import annotations

from dataclasses import replace as dc_replace
from typing import Optional

from planner import engine
from planner.dit_state import DitState
from planner.ilp import Group
from planner.plan import (
    Decision,
    RingAttention,
)
from planner.strategies import Strategy


class DitExplain(DitState):
    """`engine.Family.decisions` of the DiT (see the module docstring)."""

    def decisions(self, problem: engine.Problem, solution: engine.Solution) -> tuple[Decision, ...]:
        """One typed Decision per group (`planner.explain.explain_choices`): costs per forward, the
        stream each option reads and writes in the layout notation."""
        block = {m.name for m in self.st.block_macros + self.st.family_macros}
        family = {m.name: m.family for m in self.st.family_macros}

        def stream(g, key) -> str:
            return self.stream(key).show(self.mesh) if g.name in block else ""

        def in_block(g) -> bool:
            return g.name in block

        def fsdp(g, j) -> bool:
            return tables[g.name][j].fsdp

        tables, res = problem.tables, solution.result
        out = engine.explain(problem, solution, in_block=in_block, stream=stream, fsdp=fsdp)
        chosen = {g.name: tables[g.name][res.choice[g.name]] for g in problem.groups}
        return tuple(
            dc_replace(
                d,
                state=chosen[g.name].state,
                family=family.get(g.name, ""),
                pad_heads=self.pads[g.name] if chosen[g.name].pad_heads else None,
                ring=self._ring_decision(g, chosen[g.name], res.choice[g.name]),
            )
            if g.name in block
            else d
            for g, d in zip(problem.groups, out)
        )

    def _ring_decision(self, g: Group, chosen: Strategy, i: int) -> Optional[RingAttention]:
        """What ring attention costs beside the option chosen for group `g` (its option `i`): the ring
        option with the chosen axes where the chosen option splits the tokens, else the cheapest."""
        rings = self._rings.get(g.name)
        if not rings:
            return None

        def own(o) -> float:
            return (g.count * o.cost_ns + o.once_ns) / 1e9

        same = [
            r
            for r in rings
            if r.strategy.name == chosen.name
            or (
                chosen.sigma
                and (r.strategy.sigma, r.strategy.tp, r.strategy.fsdp, r.strategy.stream)
                == (chosen.sigma, chosen.tp, chosen.fsdp, chosen.stream)
            )
        ]
        r = same[0] if same else min(rings, key=lambda r: (own(r.option), r.strategy.name))
        return RingAttention(
            r.strategy.name,
            own(r.option),
            own(g.options[i]),
            offered=not r.why_not,
            why_not=r.why_not,
            chosen=r.strategy.name == chosen.name,
            steps=r.price.steps,
            step_compute_s=r.price.attention_s / r.price.steps,
            step_transfer_s=r.price.step_transfer_s,
            gather_s=r.price.gather_s,
        )
