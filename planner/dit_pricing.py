"""The DiT family's prices: what one option of a macro costs, and a stream edge.

Owns the layouts the pricing starts from (the prologue's, the batch-split inputs', the values that
carry the batch), the (B, L, D) stream layout of a stream key, which values cross into a macro, each
option's evaluation by the op rules (`planner.pricing.evaluate_option`) and parameter bytes, the
prologue + epilogue around the block stack (`ends`), and the stream edges between macros with the
values that cross them (the main stack's and the further block families', VACE's).

A mixin of `planner.dit_family.DitFamily`: its methods read the family's state (``self.g``, ``self.st``, ``self.mesh`` ...) and call its other parts by name.
"""

from __future__ import annotations

from dataclasses import replace as dc_replace

from planner import pricing
from planner.cost_model import to_ns
from planner.dit_state import DitState
from planner.ilp import Edge
from planner.macros import Macro, crossing, stream_edges
from planner.padding import padded_copy_bytes
from planner.placements import Layout, as_number
from planner.plan import (
    PlanError,
)
from planner.propagate import Evaluation, evaluate
from planner.strategies import Strategy


class DitPricing(DitState, pricing.MacroPricing):
    """Pricing of the DiT's options and stream edges (see the module docstring)."""

    def _base_layouts(self) -> dict:
        ev = evaluate(
            self.g, [self.g[x] for x in self.st.prologue], self.mesh, self.hw, boundary=self.inputs, values=self.vals
        )
        return ev.layouts

    def _batch_inputs(self) -> dict:
        """Layouts of the model inputs: with batch axes, every non-parameter input whose dim 0 is the
        batch (the stream's dim 0) is split on it; without, none (replicated)."""
        if not self.batch_axes:
            return {}
        batch = self.g[self.st.entry].out.shape[0]
        out = {}
        for x in self.g:
            if x.op == "placeholder" and not x.is_param and x.outputs and x.out.shape and x.out.shape[0] == batch:
                out[x.name] = (Layout((self.batch_axes,) + ((),) * (len(x.out.shape) - 1)),)
        if not out:
            raise PlanError(f"batch_axes {self.batch_axes}: no model input has the stream's batch {batch} on dim 0")
        return out

    def _batch_carrying(self) -> frozenset:
        """Nodes whose dim 0 carries the split batch: propagate the split inputs through the whole
        graph (parameters replicated, nothing forced) and keep the values that still hold it on dim 0."""
        if not self.batch_axes:
            return frozenset()
        ev = evaluate(self.g, list(self.g), self.mesh, self.hw, boundary=self.inputs, values=self.vals)
        k = len(self.batch_axes)
        out = frozenset(
            name
            for name, lays in ev.layouts.items()
            if lays and lays[0] is not None and lays[0].ndim and lays[0].dims[0][:k] == self.batch_axes
        )
        for name in (self.st.entry, self.st.block_output, self.st.exit):
            if name not in out:
                raise PlanError(
                    f"the batch split over {self.batch_axes} does not reach {self.g[name].location} on "
                    "dim 0 (an op without a batch-preserving rule on the way); this graph cannot be "
                    "planned batch-split"
                )
        return out

    def lift(self, name: str, lay: Layout) -> Layout:
        """`lay` with the batch axes put major on dim 0 if node `name` carries the batch."""
        if (
            not self.batch_axes
            or name not in self.batch_nodes
            or lay.dims[0][: len(self.batch_axes)] == self.batch_axes
        ):
            return lay
        return lay.with_dim(0, self.batch_axes + lay.dims[0])

    def lift_strategy(self, s: Strategy) -> Strategy:
        if not self.batch_axes:
            return s
        return dc_replace(s, forced={k: self.lift(k, v) for k, v in s.forced.items()})

    def stream(self, key) -> Layout:
        """The (B, L, D) stream's layout under a stream key (token axes, hidden axes)."""
        tokens, hidden = key
        return Layout((self.batch_axes, tuple(tokens), tuple(hidden)))

    def reps(self, m: Macro) -> int:
        """How many times a macro's priced ops run per forward: the main stack's block count for its
        macros (priced on the representative block), once for the rest (a further family's macro
        spans all its blocks)."""
        return self.n if m.in_block and not m.family else 1

    def crossing(self, m: Macro) -> list[str]:
        """The stream values `m` reads (`planner.macros.crossing`): (B, L, D) values of the blocks, the
        stack's entry or a further family's entries."""
        shape = self.g[self.st.entry].out.shape
        entries = {self.st.entry} | self.family_entries()
        return crossing(
            self.g, m, lambda src: src.out.shape == shape and (src.name in entries or src.block is not None)
        )

    def eval_macro(self, m: Macro, s: Strategy, priced: bool = False) -> Evaluation:
        """The option's evaluation: in GSPMD's collectives (what the plan records), or with `priced` in
        the target's (what the solver weighs)."""
        stream = {x: self.stream(s.stream) for x in self.crossing(m)} if m.in_block else {}
        forced = dict(s.forced)
        for x in [x for x in stream if x in {e for f in self.st.families for e in f.entries}]:
            readers = self._entry_projections(x)
            if any(stream[x].dims) and readers:  # as `_family_entries` pins it: whole, split by its projection
                forced.update({u.name: stream[x] for u in readers if u.name in m.nodes})
                stream[x] = self.lift(x, Layout.replicated(len(self.g[x].out.shape)))
        target = self.target if priced else None
        return self.evaluate_macro(m, params=s.params, stream=stream, forced=forced, base=self.base, target=target)

    def param_bytes(self, m: Macro, s: Strategy) -> float:
        """Per-device bytes of the macro's parameters under `s`, for all its repetitions; with padded
        heads also the padded copies the fold program keeps beside them."""
        one = self.macro_param_bytes(m, s.params)
        one += padded_copy_bytes(self.g, m, s, self.mesh, self.vals)
        return one * self.reps(m) * self.copies

    def fixed_param_bytes(self) -> float:
        owned = {p for m in self.macros for p in m.params}
        total = 0.0
        for node in self.g.params():
            if node.name in owned or node.block not in (None,):
                continue
            total += as_number(node.out.nbytes, self.vals)
        return total * self.copies

    def ends(self, key, priced: bool = False) -> Evaluation:
        """Prologue + epilogue with the block stack entered and left in stream layout `key` (`priced`:
        as `eval_macro`)."""
        if (key, priced) not in self._ends:
            self._ends[key, priced] = self._evaluate_ends(key, self.target if priced else None)
        return self._ends[key, priced]

    def _evaluate_ends(self, key, target) -> Evaluation:
        entry = {self.st.entry: self.stream(key)}
        rest = [self.g[x] for x in self.st.prologue if not any(x in r.nodes for r in self.st.root_macros)]
        pro = evaluate(
            self.g, rest, self.mesh, self.hw, boundary=self.inputs, forced=entry, values=self.vals, target=target
        )
        boundary = dict(self.base)
        tail = self.st.glue + self.st.epilogue  # the glue between blocks (VACE's hint adds) reads the stream too
        for x in tail:
            for i in self.g[x].inputs:
                if (
                    self.g[i].block is not None
                    and self.g[i].outputs
                    and self.g[i].out.shape == self.g[self.st.entry].out.shape
                ):
                    boundary[i] = (self.stream(key),)
        exit_ = self.g[self.st.exit]
        epi = evaluate(
            self.g,
            [self.g[x] for x in tail],
            self.mesh,
            self.hw,
            boundary=boundary,
            forced={exit_.name: self.lift(exit_.name, Layout.replicated(len(exit_.out.shape)))},
            values=self.vals,
            target=target,
        )
        pro.layouts.update(epi.layouts)
        pro.required.update(epi.required)
        pro.events.extend(epi.events)
        pro.compute_seconds += epi.compute_seconds
        pro.guards.extend(epi.guards)
        pro.warnings.extend(epi.warnings)
        return pro

    def reshard_seconds(self, tensor: str, k, l) -> float:
        """A stream edge's price, with the reshards the target compiles."""
        return pricing.reshard_seconds(
            self.g[tensor].out, self.stream(k), self.stream(l), self.mesh, self.hw, self.vals, self.target
        )

    def edges(self, tables) -> list[Edge]:
        macros = self.st.block_macros
        first, last = macros[0].name, macros[-1].name
        crossings: dict[tuple[str, str], list[str]] = {}
        for m in macros:
            for x in self.crossing(m):
                src = first if x == self.st.entry else self.macro_of.get(x, first)
                if src != m.name:
                    crossings.setdefault((src, m.name), []).append(x)
        crossings.setdefault((last, first), []).append(self.st.block_output)
        keys = {m.name: {s.stream for s in tables[m.name]} for m in macros + self.st.family_macros}

        def price(tensors, k, l) -> int:
            return to_ns(sum(self.reshard_seconds(t, k, l) for t in tensors))

        # the main stack's edges run once per block, the further families' once per forward
        return stream_edges(crossings, keys, price, self.n) + stream_edges(self.family_crossings(), keys, price)

    def family_crossings(self) -> dict[tuple[str, str], list[str]]:
        """Stream values crossing into, out of or within the further families, each once per forward:
        (producing macro, reading macro) -> values. The main stack's entry read by a family comes from
        the main first macro; a family value the glue reads (a VACE hint) goes to the main first
        macro's layout (the glue runs in it, `ends`); a family's entries are its first macro's (`once`)."""
        first = self.st.block_macros[0].name
        out: dict[tuple[str, str], list[str]] = {}
        for m in self.st.family_macros:
            for x in self.crossing(m):
                if x in self.family_entries():
                    continue
                src = first if x == self.st.entry else self.macro_of.get(x)
                if src is not None and src != m.name:
                    out.setdefault((src, m.name), []).append(x)
        family = {x for m in self.st.family_macros for x in m.nodes}
        for r, i in self.glue_reads():
            x = self.g[r].inputs[i]
            if x in family:
                out.setdefault((self.macro_of[x], first), []).append(x)
        return out

    def family_entries(self) -> set[str]:
        return {x for f in self.st.families for x in f.entries}

    def glue_reads(self) -> list[tuple[str, int]]:
        """(glue or epilogue op, input index) for every stream value of a further family read there (the
        VACE hints: added after each main block, the last one's add in the epilogue); both run in the
        main first macro's layout (`ends`)."""
        family = {x for m in self.st.family_macros for x in m.nodes}
        tail = self.st.glue + self.st.epilogue
        return [(x, i) for x in tail for i, inp in enumerate(self.g[x].inputs) if inp in family]

    def entries_seconds(self, family, key) -> float:
        """A family's entries moved from their prologue layout into stream layout `key`."""
        total = 0.0
        for x in family.entries:
            lays = self.base.get(x)
            have = (
                lays[0] if lays and lays[0] is not None else self.lift(x, Layout.replicated(len(self.g[x].out.shape)))
            )
            total += pricing.reshard_seconds(
                self.g[x].out, have, self.stream(key), self.mesh, self.hw, self.vals, self.target
            )
        return total

    def _entry_projections(self, x: str) -> list:
        """The projections reading a further family's entry `x` (VACE's ``proj_in``): linears whose
        output has the entry's shape."""
        return [u for u in self.g.users(x) if u.op == "linear" and u.out.shape == self.g[x].out.shape]
