"""The DiT family's plan from a solved problem: `assemble`.

Owns the chosen plan's bill (every chosen option's evaluation, read from the problem, times its
repetitions; the stream layout changes between macros; all-reduce + slice read as reduce-scatter;
the ring transfers its attention hides), the parameter specs of all N blocks (FSDP block ranges
included), the memory prediction, the notes, and the list of pins it hands to `planner.dit_pins`.

A mixin of `planner.dit_family.DitFamily`: its methods read the family's state (``self.g``, ``self.st``, ``self.mesh`` ...) and call its other parts by name.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace as dc_replace
from typing import Mapping, Optional

from planner import engine, pricing
from planner.dit_state import DitState
from planner.graph import Graph
from planner.packing import packed_operand
from planner.padding import padded_copy_bytes
from planner.placements import Guard, Layout, as_number, numel, shard_count
from planner.plan import (
    Plan,
    Predicted,
    model_geometry,
)
from planner.reshard import redistribute, reduced_through, sliced_behind, sliced_first
from planner.strategies import Strategy


class DitAssembly(DitState):
    """`engine.Family.assemble` of the DiT (see the module docstring)."""

    def assemble(self, problem: engine.Problem, solution: engine.Solution, decisions) -> Plan:
        pads = {m: p for m, p in self.pads.items() if solution.chosen[m].pad_heads}
        if pads:
            # the plan names ops of the graph with exactly the chosen attentions padded; each option's
            # evaluation there is the one it was priced by (its macro reads the same graph)
            fam = self._padded(pads)
            fam._rings = self._rings  # its ring options: priced here, on the model's graph
            macros = {m.name: m for m in fam.st.block_macros + fam.st.root_macros}
            evals = {
                (name, s.name): fam.eval_macro(macros[name], s) for name, s in solution.chosen.items() if name in macros
            }
            plan = fam.assemble(dc_replace(problem, evals={**problem.evals, **evals}), solution, decisions)
            return plan.with_(geometry=model_geometry(self.g))  # the model's, not the padded graph's
        chosen, evals = solution.chosen, problem.evals
        first = self.st.block_macros[0]
        sigma0 = chosen[first.name].stream
        ends = self.ends(sigma0)
        events: Counter = Counter()
        compute = ends.compute_seconds
        guards: list[Guard] = list(ends.guards)
        warnings = list(ends.warnings)
        for e in ends.events:
            events[(e.kind, e.axes, e.bytes, e.where)] += 1
        forced_block: dict[str, Layout] = {}
        ranged: list[tuple[str, Layout, str, range]] = []  # pins of some blocks only (FSDP per block range)
        for m in self.macros:
            s = chosen[m.name]
            twin, span = solution.twins.get(m.name, (None, (0, 0)))
            k = self.reps(m)
            on_twin = span[1] - span[0]
            for run, times in ((s, k - on_twin), (twin, on_twin)):
                if not times:
                    continue
                ev = evals[m.name, run.name]
                compute += ev.compute_seconds * times
                guards += list(ev.guards) + list(run.guards)
                warnings += ev.warnings
                for e in ev.events:
                    events[(e.kind, e.axes, e.bytes, self.g.generic(e.where))] += times
            # a packed weight (planner.packing) is pinned where the packing ends: the fold program's output
            mine = {**s.forced, **{x.node: s.params[x.node] for x in m.packed}}
            if twin is not None:
                theirs = {**twin.forced, **{x.node: twin.params[x.node] for x in m.packed}}
                differ = [x for x in dict.fromkeys([*mine, *theirs]) if mine.get(x) != theirs.get(x)]
                rest = [b for b in range(k) if not span[0] <= b < span[1]]
                for x in differ:
                    if x in mine:  # the other blocks keep this macro's own pin
                        ranged += [(x, mine[x], _reason(self.g, self.g[x]), r) for r in _runs(rest)]
                    if x in theirs:
                        ranged.append((x, theirs[x], _reason(self.g, self.g[x]), range(*span)))
                mine = {x: lay for x, lay in mine.items() if x not in differ}
            forced_block.update(mine)
        # (node, layout, reason) in order; a node may be pinned twice (then changed in place)
        pins = [(x, lay, _reason(self.g, self.g[x])) for x, lay in forced_block.items()]
        copies: list[tuple[str, int, Layout]] = []  # (reader, input index, layout of its copy)
        changes = self._sigma_changes(chosen)
        out_changed = any(readers is None for *_, readers in changes)
        for a, b, l_sig, readers, times in changes:
            if readers is None:
                # the block output: pinned where it is made (else GSPMD moves the change back into the
                # last macro's glue), then changed in place: all its readers are in the next block
                pins += [(a, self.stream(b), _MADE), (a, self.stream(l_sig), _CHANGED)]
            else:
                # pinned where it is made, so that the copy the readers in the other macro get cannot
                # move its layout back into the producing macro (GSPMD propagates a constraint backwards)
                if a == self.st.entry and times > 1:  # in block 0 the entry's own pin; later: the block output
                    if not out_changed:
                        pins.append((self.st.block_output, self.stream(b), _MADE))
                        out_changed = True
                elif a not in forced_block and a != self.st.entry:
                    pins.append((a, self.stream(b), _MADE))
                copies += [(r, i, self.stream(l_sig)) for r, i in readers]
            reduced = self._reduced(a, chosen, evals)
            moves = redistribute(self.g[a].out, self.stream(b), self.stream(l_sig), self.mesh, reduced=reduced)
            for kind, axes, shape in moves:
                nbytes = int(as_number(numel(shape), self.vals) * self.g[a].out.itemsize)
                events[(kind, axes, nbytes, self.g.generic(str(self.g[a].location)))] += times
            sliced = sliced_first(self.g[a].out, self.stream(b), self.stream(l_sig), self.mesh, reduced)
            if sliced:
                self._scatter_into_slice(events, a, sliced, chosen, evals, times)
        collectives, comm = pricing.bill(events, self.mesh, self.hw)
        comm -= self._ring_hidden_seconds(chosen)  # a ring's transfers under its attention compute cost nothing
        params = self._params(chosen, solution.twins)
        stack = self.st.block_macros + self.st.family_macros
        split_stream = any(chosen[m.name].stream != (chosen[m.name].sigma, ()) for m in stack)
        tokens_split = any(chosen[m.name].stream[0] for m in stack)
        if split_stream or tokens_split:  # with the tokens split, a per-token modulation is pinned too
            pins += [
                (x, lay, _MODULATION)
                for x, lay in self._modulation(chosen, evals)
                if x not in forced_block and (split_stream or self._per_token(self.g[x]))
            ]
        acts = self._activations(pins, sigma0, copies, tokens_split=tokens_split, ranged=ranged)
        acts = acts[:1] + self._family_entries(chosen) + acts[1:]
        memory = pricing.weight_bytes(self.g, self.st, params, self.mesh, self.vals, self.n, self.copies)
        memory += sum(
            padded_copy_bytes(self.g, m, chosen[m.name], self.mesh, self.vals) * self.n * self.copies
            for m in self.st.block_macros
        )
        running = {(name, s.name) for name, s in chosen.items()} | {
            (name, t.name) for name, (t, _) in solution.twins.items()
        }
        act_peak = max(ev.peak_bytes for key, ev in evals.items() if key in running)
        memory += pricing.ACTIVATION_FACTOR * act_peak
        nsp = shard_count(self.mesh, sigma0[0])
        if self.hw.tile > 1 and nsp > 1:
            guards.append(
                Guard(str(self.st.tokens), nsp * self.hw.tile, f"{self.hw.tile}-token tiles per device; otherwise pad")
            )
        rings = [f"{m} {s.name}" for m, s in chosen.items() if s.ring]
        notes = [
            f"planned from {self.st.captured_blocks} captured block(s); block decisions shared by all {self.n} blocks and expanded by name"
            + (" (but for the FSDP block ranges)" if solution.twins else ""),
            "predicted time = compute + comm, no overlap assumed"
            + (" but ring attention's" if rings else "")
            + f"; {self.copies} weight set(s) resident",
        ]
        if rings:
            notes.append(
                "ring attention (K/V chunks passed around the SP axes, each step's transfer hidden behind its "
                "attention compute): " + ", ".join(rings)
            )
        notes += [f"warning: {w}" for w in dict.fromkeys(warnings)]
        if any(s.fsdp for s in chosen.values()) or solution.twins:
            notes.append(
                "memory forces weight sharding: "
                + ", ".join(
                    [f"{m} {s.name}" for m, s in chosen.items() if s.fsdp]
                    + [
                        f"{m} {t.name} on " + (f"block {a}" if b - a == 1 else f"blocks {a}..{b - 1}")
                        for m, (t, (a, b)) in solution.twins.items()
                    ]
                )
            )
        plan = Plan(
            model=self.model,
            mesh=self.mesh,
            params=params,
            activations=acts,
            hardware=self.hw.name,
            collectives=collectives,
            predicted=Predicted(compute + comm, compute, comm, int(memory)),
            solver=engine.solver_info(solution),
            decisions=tuple(decisions),
            notes=tuple(notes),
            weight_sets=self.copies,
            geometry=model_geometry(self.g),
        )
        unique = {(g.expr, g.divisor): g for g in reversed(guards)}  # one per condition, first reason kept
        return plan.with_(guards=tuple(sorted(unique.values(), key=lambda g: (g.divisor, g.expr))))

    def _reduced(self, a: str, chosen, evals) -> bool:
        """Whether stream value `a` is (past pass-throughs) the all-reduced output of the op that makes it
        in its macro's chosen evaluation (`planner.reshard.redistribute`'s ``reduced``)."""
        src = reduced_through(self.g, a)[-1]
        m = self.macro_of.get(src)
        if m is None or (m, chosen[m].name) not in evals:
            return False
        where = str(self.g[src].location)
        return any(e.kind == "all-reduce" and e.where == where for e in evals[m, chosen[m].name].events)

    def _scatter_into_slice(self, events: Counter, a: str, added: tuple[str, ...], chosen, evals, times: int) -> None:
        """Stream value `a` sliced onto `added` first in its reshard (`planner.reshard.sliced_first`: a
        pure slice, or the slice before a minor-factor all-to-all) where the op behind it (past
        pass-throughs) all-reduces its partial sums over those axes: GSPMD's all-reduce + slice, one
        reduce-scatter (`planner.propagate`), as the whole-graph propagation reads it too."""
        src = reduced_through(self.g, a)[-1]
        m = self.macro_of.get(src)
        if not added or m is None:
            return
        if len(self.g.users(src)) == 1:
            behind = [src]
        elif src == a and a == self.st.block_output:
            # the block output, changed in place (every reader reads the slice): the all-reduce may sit
            # behind elementwise ops that only it reads (the FFN's row-parallel output, gated, added to
            # the residual): XLA slices them, so the all-reduced value's readers keep one slice each
            behind = sliced_behind(self.g, a, lambda x: self.macro_of.get(x) == m)
        else:
            return
        wheres = {str(self.g[x].location) for x in behind}
        for e in evals[m, chosen[m].name].events:
            if e.kind == "all-reduce" and e.where in wheres and set(e.axes) == set(added):
                key = (e.kind, e.axes, e.bytes, self.g.generic(e.where))
                events[key] -= times
                events[("reduce-scatter",) + key[1:]] += times
                if events[key] <= 0:
                    del events[key]
                return

    def _sigma_changes(self, chosen) -> list[tuple[str, tuple, tuple, Optional[list[tuple[str, int]]]]]:
        """Stream values crossing into a macro with another stream key: (producer, from, to, readers,
        times per forward), one per value and reading macro; readers = the (node, input index) pairs of
        that macro that read it, None for the block output (all its readers are in the next block:
        changed in place). A further family's values cross once (their macros span their blocks), and
        so do the family values the glue reads (into the main first macro's layout)."""
        out = []
        macros = self.st.block_macros
        first = macros[0]
        key = {m.name: chosen[m.name].stream for m in macros + self.st.family_macros}
        if key[macros[-1].name] != key[first.name]:
            out.append((self.st.block_output, key[macros[-1].name], key[first.name], None, self.n))
        for m in macros:
            for x in self.crossing(m):
                src = first.name if x == self.st.entry else self.macro_of.get(x, first.name)
                if key[src] != key[m.name]:
                    readers = [(n, i) for n in m.nodes for i, inp in enumerate(self.g[n].inputs) if inp == x]
                    out.append((x, key[src], key[m.name], readers, self.n))
        for (src, dst), xs in self.family_crossings().items():
            if key[src] == key[dst]:
                continue
            # a family value goes to the main first macro only through the glue that reads it
            reading = (
                self.st.glue + self.st.epilogue
                if dst == first.name
                else next(m for m in self.st.family_macros if m.name == dst).nodes
            )
            for x in xs:
                readers = [(n, i) for n in reading for i, inp in enumerate(self.g[n].inputs) if inp == x]
                out.append((x, key[src], key[dst], readers, 1))
        return out

    def _ring_hidden_seconds(self, chosen: Mapping[str, Strategy]) -> float:
        """Per forward, the ring transfers of the chosen ring options that their attention compute hides."""
        total = 0.0
        for m in self.macros:
            s = chosen[m.name]
            if s.ring:
                ring = next(r for r in self._rings[m.name] if r.strategy.name == s.name)
                total += self.reps(m) * ring.price.hidden_s
        return total

    def _params(self, chosen, twins: Mapping = {}) -> dict:
        """Every parameter's spec by name, for all n blocks; the blocks of an FSDP block range (`twins`:
        macro -> (twin strategy, (first, stop))) get the twin's."""
        spec0: dict[str, tuple] = {}
        ranged: dict[str, tuple[tuple, tuple[int, int]]] = {}  # block-0 name -> (twin's spec, its blocks)
        for m in self.macros:
            for p, lay in chosen[m.name].params.items():
                if self.g[p].is_param:  # not a packed weight: that one is an activation constraint
                    spec0[self.g[p].param] = lay.to_spec()
            if m.name in twins:
                twin, span = twins[m.name]
                for p, lay in twin.params.items():
                    if self.g[p].is_param:
                        ranged[self.g[p].param] = (lay.to_spec(), span)

        def spec(key: str, block: Optional[int], default: tuple) -> tuple:
            if key in ranged and block is not None and ranged[key][1][0] <= block < ranged[key][1][1]:
                return ranged[key][0]
            return spec0.get(key, default)

        out = {}
        for node in self.g.params():
            name = node.param
            whole = (None,) * len(node.out.shape)
            if self.st.in_main(self.g, node):
                key = self.g.in_block(node, name, 0)
                out[name] = spec(key, node.block, spec0.get(name, whole))
            else:  # the prologue's, the epilogue's, and a further family's (each block its own)
                key = name
                out[name] = spec0.get(name, whole)
            if self.st.in_rep(self.g, node):  # the captured blocks stand for all n
                for k in range(self.n):
                    out.setdefault(self.g.in_block(node, name, k), spec(key, k, out[name]))
        return out


def _runs(blocks: list[int]) -> list[range]:
    """Consecutive runs of sorted block indices as ranges."""
    out: list[range] = []
    for b in blocks:
        if out and out[-1].stop == b:
            out[-1] = range(out[-1].start, b + 1)
        else:
            out.append(range(b, b + 1))
    return out


_MADE = "stream value pinned where it is made, in its macro's layout (another macro reads it in another)"
_CHANGED = "stream layout change between blocks (the next block's first macro)"
_MODULATION = "block value independent of the stream (adaLN modulation), kept in its planned layout"


def _reason(graph: Graph, node) -> str:
    if packed_operand(graph, node.name) is not None:
        return "packed projection weight (folded once per weight version): its sources carry the same spec"
    if node.op == "linear":
        return "linear output pinned to the planned layout (tokens on the SP axes, features on the TP axes)"
    if node.op == "permute":
        return "SDPA operand layout (K/V gathered on tokens, or Ulysses heads)"
    return "stream layout change between macros"
