"""The DiT family's planning problem: one ILP group per macro with its priced options.

Owns `problem` (the options of every macro: its strategies, the padded-head and ring variants,
``sequence_parallel`` and ``only`` applied, each priced; the FSDP twins; the stream edges), the ring
options' pricing (`planner.ring`), the checks of ``fsdp_blocks``, and the presets: the solver's hint
(tt-xla's shape) and the ``tt-xla`` preset that keeps exactly that option per macro.

A mixin of `planner.dit_family.DitFamily`: its methods read the family's state (``self.g``, ``self.st``, ``self.mesh`` ...) and call its other parts by name.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner import engine, pricing
from planner.cost_model import to_ns
from planner.dit_state import DitState
from planner.ilp import Group, Option
from planner.macros import Macro, restrict
from planner.plan import (
    Exclusion,
    PlanError,
)
from planner.propagate import Evaluation
from planner.ring import RingPrice, ring_evaluation
from planner.strategies import Strategy, ring_variant

PRESETS = ("auto", "tt-xla")  # `plan_graph`'s presets: the solver decides, or the seed's hand plan


class DitProblem(DitState):
    """The DiT's `engine.Problem` (see the module docstring)."""

    def problem(self) -> engine.Problem:
        groups, tables, excluded, evals = [], {}, {}, {}
        first = self.st.block_macros[0].name
        for m in self.macros:
            opts, why = self._strategies(self.g, m)
            opts = [self.lift_strategy(s) for s in opts]
            padded, why_padded = self._padded_options(m)
            opts, why = opts + padded, why + why_padded
            if not self.sequence_parallel:
                opts = [s for s in opts if not s.sigma and not s.stream[0]]
            rings = self._ring_options(m, opts)
            if self.spec.ring_attention:
                opts = opts + [r for r, _ in rings]
            if m.name in self.only:  # none kept: `engine.check_options` says so
                pattern = self.only[m.name]
                opts, left = restrict(opts, [pattern], f"restricted by only={pattern!r}")
                why = why + left
            options = []
            priced_rings = self._price_rings(m, rings, opts, evals, first)
            for s in opts:
                if s.ring:
                    ring = next(r for r in priced_rings if r.strategy.name == s.name)
                    evals[m.name, s.name] = ring.evaluation
                    options.append(ring.option)
                    continue
                fam, mm = self._family_of(m, s)
                ev = evals[m.name, s.name] = fam.eval_macro(mm, s)
                cost = fam.eval_macro(mm, s, priced=True) if self.target is not None else ev
                options.append(pricing.option(s.name, s.stream, cost, fam.param_bytes(mm, s), self._once(m, s, first)))
            twins = _twins(opts) if self.reps(m) > 1 else ()
            groups.append(Group(m.name, tuple(options), self.reps(m), twins, self.fsdp_blocks.get(m.name)))
            tables[m.name], excluded[m.name] = opts, why
        edges = self.edges(tables)
        if self.preset == "tt-xla":
            self._keep_the_seed_plan(groups, tables, excluded)
        self._check_fsdp_blocks(groups)
        return engine.Problem(
            tuple(groups),
            tuple(edges),
            {k: tuple(v) for k, v in tables.items()},
            {k: tuple(v) for k, v in excluded.items()},
            evals,
            self.fixed_param_bytes(),
            self.hint(groups, tables),
        )

    def _once(self, m: Macro, s: Strategy, first: str) -> int:
        """Option `s` of `m`'s once-per-forward cost (ns): the ends for the first block macro, a further
        family's entries laid out for its first macro, else nothing."""
        if m.name in self.family_first:  # a further family's entry (the control tokens) laid out
            return to_ns(self.entries_seconds(self.family_first[m.name], s.stream))
        return to_ns(self.ends(s.stream, self.target is not None).seconds) if m.name == first else 0

    def _ring_options(self, m: Macro, opts: list[Strategy]) -> list[tuple[Strategy, Strategy]]:
        """(ring option, the K/V-gather option it is priced from) for each option of `m` that has one."""
        out = []
        for s in opts:
            r = ring_variant(self.g, m, s)
            if r is not None:
                out.append((self.lift_strategy(r), s))
        return out

    def _price_rings(self, m: Macro, rings, offered: list[Strategy], evals: dict, first: str) -> list["_RingOption"]:
        """Every ring option of `m` priced (`planner.ring`) from its K/V-gather option's evaluation, offered
        to the solver (in `offered`) or not (then why not); kept for the decisions (`_ring_decision`)."""
        target = self.spec
        names = {s.name for s in offered}
        out = []
        for r, gather in rings:
            ev = evals.get((m.name, gather.name)) or self.eval_macro(m, gather)
            cost = self.eval_macro(m, gather, priced=True) if self.target is not None else ev
            ring, priced = (ring_evaluation(self.g, m, gather, e, self.mesh, self.hw, self.vals) for e in (ev, cost))
            if isinstance(ring, str) or isinstance(priced, str):
                continue  # no K/V gather to replace: no ring counterpart (the lowering would have no place for it)
            why = (
                ""
                if r.name in names
                else (
                    f"restricted by only={self.only[m.name]!r}" if target.ring_attention else target.no_ring_attention
                )
            )
            option = pricing.option(r.name, r.stream, priced[0], self.param_bytes(m, r), self._once(m, r, first))
            out.append(_RingOption(r, option, ring[0], priced[1], why))
        self._rings[m.name] = out
        return out

    def _check_fsdp_blocks(self, groups: list[Group]) -> None:
        """`fsdp_blocks` names block macros that have FSDP twins, with 0 .. n - 1 blocks on the twin."""
        by_name = {g.name: g for g in groups}
        for name, k in self.fsdp_blocks.items():
            g = by_name.get(name)
            if g is None or g.count < 2:
                blocks = sorted(h.name for h in groups if h.count > 1)
                raise PlanError(f"fsdp_blocks names {name!r}, which is not a block macro of this model ({blocks})")
            if not 0 <= k < g.count:
                raise PlanError(
                    f"fsdp_blocks[{name!r}] = {k}: give 0 .. {g.count - 1} blocks on the FSDP twin (all {g.count} "
                    "blocks: choose the +FSDP strategy itself with only=)"
                )
            if k and not g.twins:
                raise PlanError(
                    f"fsdp_blocks[{name!r}] = {k}, but none of {name}'s options has an FSDP twin here (the preset, "
                    "only= or the mesh left none)"
                )

    def _keep_the_seed_plan(self, groups: list[Group], tables: dict, excluded: dict) -> None:
        """The tt-xla preset: the seed's shape is the solver's hint (`hint`); keep exactly that option
        per macro, the others recorded as excluded by the preset."""
        hint = self.hint(groups, tables)
        missing = [g.name for g in groups if g.name not in hint]
        if missing:
            raise PlanError(
                f"the tt-xla preset needs head-TP / Megatron on the last mesh axis with SP on the others, but "
                f"{', '.join(missing)} has no such legal option on mesh {self.mesh} (excluded: "
                + "; ".join(f"{x.option}: {x.reason}" for m in missing for x in excluded[m])
                + ")"
            )
        for k, g in enumerate(groups):
            i = hint[g.name]
            excluded[g.name] = list(excluded[g.name]) + [
                Exclusion(o.name, "not the tt-xla preset") for j, o in enumerate(g.options) if j != i
            ]
            groups[k] = Group(g.name, (g.options[i],), g.count)
            tables[g.name] = [tables[g.name][i]]

    def hint(self, groups, tables) -> dict[str, int]:
        """tt-xla's shape: head-TP/Megatron on the last axis, SP on the other axes, no FSDP."""
        axes = [a for a in self.mesh.axis_names if self.mesh.axis_size(a) > 1 and a not in self.batch_axes]
        tp = tuple(axes[-1:])
        sp = tuple(axes[:-1])
        out = {}
        block = {m.name for m in self.st.block_macros + self.st.family_macros}
        for g in groups:
            opts = tables[g.name]
            many = g.name in block
            for want in ((sp, tp), ((), tp), (sp, ()), ((), ())):
                i = next(
                    (
                        i
                        for i, s in enumerate(opts)
                        if (s.sigma if many else ()) == (want[0] if many else ())
                        and s.stream == (s.sigma, ())
                        and s.tp == want[1]
                        and not s.fsdp
                        and not s.ulysses
                        and not s.ring
                    ),
                    None,
                )
                if i is not None:
                    out[g.name] = i
                    break
        return out


@dataclass(frozen=True)
class _RingOption:
    """A ring option of a macro as `DitFamily.problem` priced it: the strategy, its ILP option (target
    terms), its evaluation in GSPMD's terms (what a plan with it records), its `RingPrice` (target
    terms), and why it was not offered to the solver ("" when it was)."""

    strategy: Strategy
    option: Option
    evaluation: Evaluation
    price: RingPrice
    why_not: str


def _twins(opts: list[Strategy]) -> tuple[tuple[int, int], ...]:
    """(option, its FSDP twin) index pairs: the twin is the same strategy (splits, stream, padding)
    with its weights also split over its SP axes (`planner.ilp`'s T_g)."""

    def same(s: Strategy) -> tuple:
        return (s.sigma, s.tp, s.ulysses, s.ring, s.stream, s.pad_heads)

    fsdp = {same(t): j for j, t in enumerate(opts) if t.fsdp}
    return tuple((i, fsdp[same(s)]) for i, s in enumerate(opts) if not s.fsdp and same(s) in fsdp)
