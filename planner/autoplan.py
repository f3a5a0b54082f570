"""`plan_graph`: captured DiT graph + mesh + hardware -> `Plan`, through the ILP.

`DitFamily` is the DiT's side of `planner.engine` (which solves, words the failures and calls back
to explain and assemble; the VAE is the other family, `planner.vae_plan`). Pipeline (each step is
its own module):

1. `strategies.find_structure` splits the graph into prologue, one representative block (its macros
   with their glue), epilogue; `strategies.strategies` lists each macro's legal options.
2. Every option is priced by running the op rules over the macro's ops (`propagate.evaluate`): the
   collectives it implies, roofline compute, parameter and activation bytes per device. Stream
   edges between macros are priced as redistributions of the (B, L, D) tokens.
3. `ilp.solve` picks one option per macro (blocks share variables, costs × N) under the memory
   budget, hinted with the tt-xla style plan (head-TP on the last axis, SP on the others).
4. The chosen plan is evaluated end to end once more: its collectives (HLO units, ``where``
   naming the op), predicted compute/comm/memory, guards; then expanded by name to all N blocks.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from dataclasses import replace as dc_replace
from typing import Mapping, Optional

from planner import engine, pricing
from planner.collective import Collective
from planner.cost_model import collective_seconds, to_ns
from planner.graph import Graph
from planner.hardware import PROFILES, HardwareProfile, default_hardware, get_profile
from planner.ilp import Edge, Group, Infeasible, Option
from planner.mesh import MeshSpec
from planner.packing import packed_operand
from planner.padding import PadHeads, needs_padding, pad_targets, padded_copy_bytes
from planner.placements import Guard, Layout, as_number, numel, shard_count
from planner.plan import (
    ActivationConstraint,
    Decision,
    Exclusion,
    HeadPadding,
    Plan,
    PlanError,
    Predicted,
    RingAttention,
    model_geometry,
)
from planner.propagate import Evaluation, evaluate, redistribute, reduced_through, sliced_behind, sliced_first
from planner.ring import RingPrice, ring_evaluation
from planner.strategies import Macro, Strategy, dit_graph, family_strategies, find_structure, ring_variant
from planner.targets import get_target


def plan_graph(
    graph: Graph,
    mesh: MeshSpec,
    hardware: str | HardwareProfile | None = None,
    *,
    memory_gb: Optional[float] = None,
    num_blocks: Optional[int] = None,
    weight_copies: int = 1,
    values: Optional[Mapping[str, int]] = None,
    time_limit_s: float = 5.0,
    model: str = "",
    sequence_parallel: bool = True,
    only: Optional[Mapping[str, str]] = None,
    batch_axes: tuple[str, ...] = (),
    stream_layouts: bool = True,
    preset: str = "auto",
    target: str = "gspmd",
    pad_heads: Optional[PadHeads] = None,
    fsdp_blocks: Optional[Mapping[str, int]] = None,
) -> Plan:
    """Plan a captured Wan DiT graph.

    Args:
        graph: the captured graph (`wancompile.capture`); one or two blocks suffice.
        mesh: the logical mesh (axes of size 1 are ignored).
        hardware: a profile name (`planner.hardware.PROFILES`) or profile; None: the system with
            this mesh shape (`planner.hardware.default_hardware`).
        memory_gb: per-device budget (default: the profile's DRAM).
        num_blocks: how many identical blocks the model has (default: as captured). Block decisions
            are shared; parameters and constraints are written for all of them by name.
        weight_copies: weight sets resident per device (2 for both A14B experts).
        values: example sizes for symbolic dims (costs need numbers; the plan keeps guards).
        sequence_parallel: False restricts block macros to unsplit tokens (TP / replicated only).
        only: macro name (``attn1``, ``ffn``, ``condition_embedder.time_embedder``) -> regular
            expression a strategy name must match (``{"attn1": "^Ulysses"}``): restricts the
            choice, e.g. to compile and check a strategy the cost model would not pick here.
        batch_axes: mesh axes that split the batch dim (dim 0) of every batch-carrying value and that no
            macro may use otherwise (CFG parallel: ``("cfg",)``, `planner.cfg`); parameters stay
            replicated over them. Batch-carrying = the values whose propagated layout, from the
            batch-split model inputs, keeps the split on dim 0 (the op rules decide, no name lists).
        stream_layouts: offer the split stream layouts between macros (STATE B: hidden split over
            the TP axes; sequence-parallel Megatron: tokens also split over them) besides STATE A
            (hidden whole). False: STATE A only, the seed's plans.
        preset: ``auto`` (the solver decides) or ``tt-xla``: the seed's hand plan through this same
            engine — every block macro head-TP / Megatron on the last mesh axis with SP on the others,
            the embedders Megatron on the last axis, STATE A, no FSDP — so its bill is the rules'
            (`PRESETS`); the other options are recorded as excluded by the preset.
        target: the partitioner (`planner.targets`): options and stream edges are priced with the
            reshards it compiles (tt-mlir: a split added to a split value is an all-to-all), while the
            plan's ``collectives`` stay GSPMD's (its prediction for the target: `planner.pins`).
        pad_heads: {block-generic attention module: heads} -> the planner graph of this model with
            those attentions' heads zero-padded (`planner.padding`). Given, attentions whose heads a
            split of the mesh does not divide are also offered head-TP / Ulysses on padded heads,
            priced on that graph; a plan that chooses one names ops of the padded graph and records
            the padding in its decisions (`Plan.head_padding`). None: no padded options.
        fsdp_blocks: block macro -> how many of its blocks run the FSDP twin of its chosen strategy
            (0 .. num_blocks - 1; fixes the ILP's w, `planner.ilp` (e)): with ``only``, transfers a
            plan's FSDP block range to another model (``bench/bench_score.py``). None: the solver
            decides, for every block macro, how many blocks (the last ones) memory needs on the twin.

    Raises:
        MemoryBudgetError: no plan fits the budget; ``need_gb`` is a budget that plans (found by a
            minimise-memory solve), ``meshes`` the larger system meshes that would plan within it.
        SolverTimeout: the solver hit ``time_limit_s`` before finding any plan.
    """
    hw = get_target(target).profile(_profile(hardware, mesh))  # what the target cannot lower, priced out
    if weight_copies < 1:
        raise PlanError(f"weight_copies must be at least 1 (weight sets resident per device), got {weight_copies}")
    family = DitFamily(
        graph,
        mesh,
        hw,
        num_blocks=num_blocks,
        weight_copies=weight_copies,
        values=values,
        sequence_parallel=sequence_parallel,
        only=only,
        batch_axes=tuple(batch_axes),
        stream_layouts=stream_layouts,
        preset=preset,
        model=model or graph.model,
        target=target,
        pad_heads=pad_heads,
        fsdp_blocks=fsdp_blocks,
    )
    budget = (memory_gb * 1e9) if memory_gb is not None else float(hw.dram_bytes)
    return engine.plan(family, budget, time_limit_s).with_(target=target)


def _profile(hardware, mesh: MeshSpec) -> HardwareProfile:
    if isinstance(hardware, HardwareProfile):
        return hardware
    try:
        return get_profile(hardware or default_hardware(mesh))
    except ValueError as e:
        raise PlanError(str(e)) from None


PRESETS = ("auto", "tt-xla")


def _system_meshes(mesh: MeshSpec) -> list[MeshSpec]:
    """Native meshes of the hardware profiles with more devices than `mesh` (smallest first), named
    like `mesh` when it is 2-D: the meshes that exist to suggest."""
    shapes = sorted(
        {p.mesh_shape for p in PROFILES.values() if math.prod(p.mesh_shape) > mesh.size},
        key=lambda s: (math.prod(s), s),
    )
    names = mesh.axis_names if len(mesh.shape) == 2 else None
    return [MeshSpec(tuple(s), tuple(names) if names else ("batch", "model")) for s in shapes]


class DitFamily:
    """The DiT as a model family of `planner.engine`: its macros (`strategies.find_structure`), their
    options priced by the op rules, the stream edges between them; its decisions and its plan. Built
    once from `plan_graph`'s arguments (immutable after construction)."""

    def __init__(
        self,
        graph: Graph,
        mesh: MeshSpec,
        hw: HardwareProfile,
        *,
        num_blocks: Optional[int] = None,
        weight_copies: int = 1,
        values: Optional[Mapping[str, int]] = None,
        sequence_parallel: bool = True,
        only: Optional[Mapping[str, str]] = None,
        batch_axes: tuple[str, ...] = (),
        stream_layouts: bool = True,
        preset: str = "auto",
        model: str = "",
        target: str = "gspmd",
        pad_heads: Optional[PadHeads] = None,
        fsdp_blocks: Optional[Mapping[str, int]] = None,
    ):
        if preset not in PRESETS:
            raise PlanError(f"unknown DiT plan preset {preset!r}; choose one of {list(PRESETS)}")
        graph = dit_graph(graph)  # stacks that are not transformer blocks planned op by op
        st = find_structure(graph)
        self.g, self.mesh, self.hw, self.st = graph, mesh, hw, st
        self.n, self.copies, self.vals = num_blocks or st.captured_blocks, weight_copies, dict(values or {})
        self.sequence_parallel, self.only, self.preset, self.model = sequence_parallel, dict(only or {}), preset, model
        self.stream_layouts = stream_layouts
        self.batch_axes = tuple(a for a in batch_axes if mesh.axis_size(a) > 1)
        self.inputs = self._batch_inputs()
        self.batch_nodes = self._batch_carrying()
        self.base = self._base_layouts()
        self.macro_of: dict[str, str] = {x: m.name for m in st.block_macros + st.family_macros for x in m.nodes}
        self.macros = st.block_macros + st.family_macros + st.root_macros
        self.family_first = {f.macros[0].name: f for f in st.families}
        self.hidden = graph[st.entry].out.shape[-1] if stream_layouts and preset == "auto" else None
        self._ends: dict = {}  # (stream key, priced) -> `ends(key)`, computed once
        self.target_name = target
        # None: GSPMD, whose reshards the rules' events are in; else the target the options are priced for
        self.target = None if target == "gspmd" else get_target(target)
        self.pad_heads = pad_heads
        self.fsdp_blocks = dict(fsdp_blocks or {})
        self.pads = pad_targets(graph, st.block_macros, mesh, self.batch_axes) if pad_heads is not None else {}
        self._variants: dict = {}  # macro name -> (family on its padded graph, its macro there) or why not
        # macro name -> every ring option priced by `problem` (offered to the solver or not), `_RingOption`
        self._rings: dict[str, list[_RingOption]] = {}

    def _with(self, graph: Optional[Graph] = None, mesh: Optional[MeshSpec] = None, **changes) -> "DitFamily":
        """This family's model and options, with `changes` (keyword arguments of the constructor)."""
        options = dict(
            num_blocks=self.n,
            weight_copies=self.copies,
            values=self.vals,
            sequence_parallel=self.sequence_parallel,
            only=self.only,
            batch_axes=self.batch_axes,
            stream_layouts=self.stream_layouts,
            preset=self.preset,
            model=self.model,
            target=self.target_name,
            pad_heads=self.pad_heads,
            fsdp_blocks=self.fsdp_blocks,
        )
        return DitFamily(graph or self.g, mesh or self.mesh, self.hw, **{**options, **changes})

    def on(self, mesh: MeshSpec) -> "DitFamily":
        """The same model and options on another mesh (no batch axes)."""
        return self._with(mesh=mesh, batch_axes=())

    def _padded(self, pads: Mapping[str, HeadPadding]) -> "DitFamily":
        """This family on the graph with the attentions of `pads` padded (no padded options of its own)."""
        return self._with(self.pad_heads({p.module: p.padded for p in pads.values()}), pad_heads=None)

    def variant(self, name: str) -> Optional[tuple["DitFamily", Macro]]:
        """(family on the graph with macro `name` padded, the macro there), or None where the
        rewrite could not pad it (then it has no padded options; `_variant_or_why` says why)."""
        found = self._variant_or_why(name)
        return None if isinstance(found, str) else found

    def _variant_or_why(self, name: str):
        """`variant`, or why there is none: the ``pad_heads`` function's refusal (the backend's
        check, the one a plan naming the padding meets), or a padded graph without the padded macro."""
        if name not in self._variants:
            pad = self.pads[name]
            try:
                fam = self._padded({name: pad})
            except PlanError as e:
                self._variants[name] = str(e)
                return self._variants[name]
            vm = next((m for m in fam.st.block_macros if m.name == name), None)
            ok = vm is not None and vm.kind == "attention" and vm.width == pad.padded
            self._variants[name] = (fam, vm) if ok else f"the padded graph has no {pad.padded}-head {name}"
        return self._variants[name]

    def _padded_options(self, m: Macro) -> tuple[list[Strategy], list[Exclusion]]:
        """Macro `m`'s options that split its heads in a way only the padded heads divide, named
        ``...+pad(H->H')``; nothing unless `m` is a padding target."""
        if m.name not in self.pads or self.preset != "auto":
            return [], []
        found = self._variant_or_why(m.name)
        pad = self.pads[m.name]
        if isinstance(found, str):
            return [], [Exclusion(f"pad heads {pad.heads}->{pad.padded}", found)]
        fam, vm = found
        opts, _ = self._strategies(fam.g, vm)
        out = [
            dc_replace(fam.lift_strategy(s), name=f"{s.name}+pad({pad.heads}->{pad.padded})", pad_heads=pad.padded)
            for s in opts
            if needs_padding(self.mesh, m.width, s)
        ]
        return out, []

    def _strategies(self, graph: Graph, m: Macro) -> tuple[list[Strategy], list[Exclusion]]:
        """`family_strategies` of macro `m` of `graph` (this graph, or one with heads padded) under this
        family's options."""
        return family_strategies(
            graph,
            m,
            self.mesh,
            self.st.tokens,
            tile=self.hw.tile,
            values=self.vals,
            exclude=self.batch_axes,
            hidden=self.hidden,
        )

    def _family_of(self, m: Macro, s: Strategy) -> tuple["DitFamily", Macro]:
        """Where option `s` of `m` is priced: this graph, or the one with `m`'s heads padded."""
        return self.variant(m.name) if s.pad_heads else (self, m)

    # --- pricing ------------------------------------------------------------------------------

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
        inside = set(m.nodes)
        shape = self.g[self.st.entry].out.shape
        entries = {x for f in self.st.families for x in f.entries}
        out = []
        for x in m.nodes:
            for i in self.g[x].inputs:
                src = self.g[i]
                if i in inside or src.is_param or not src.outputs or src.out.shape != shape:
                    continue
                if (i == self.st.entry or i in entries or src.block is not None) and i not in out:
                    out.append(i)
        return out

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
        return pricing.evaluate_option(
            self.g,
            m.nodes,
            self.mesh,
            self.hw,
            params=s.params,
            stream=stream,
            forced=forced,
            values=self.vals,
            base=self.base,
            target=self.target if priced else None,
        )

    def param_bytes(self, m: Macro, s: Strategy) -> float:
        """Per-device bytes of the macro's parameters under `s`, for all its repetitions; with padded
        heads also the padded copies the fold program keeps beside them."""
        one = pricing.param_bytes(self.g, m.params, s.params, self.mesh, self.vals)
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
            if get_target(self.target_name).ring_attention:
                opts = opts + [r for r, _ in rings]
            if m.name in self.only:
                pattern = self.only[m.name]
                kept = [s for s in opts if re.search(pattern, s.name)]  # none kept: `engine.check_options` says so
                why = why + [Exclusion(s.name, f"restricted by only={pattern!r}") for s in opts if s not in kept]
                opts = kept
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
        target = get_target(self.target_name)
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

    def _ring_hidden_seconds(self, chosen: Mapping[str, Strategy]) -> float:
        """Per forward, the ring transfers of the chosen ring options that their attention compute hides."""
        total = 0.0
        for m in self.macros:
            s = chosen[m.name]
            if s.ring:
                ring = next(r for r in self._rings[m.name] if r.strategy.name == s.name)
                total += self.reps(m) * ring.price.hidden_s
        return total

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

    # --- the solve's failures ----------------------------------------------------------------------

    @property
    def subject(self) -> str:
        return f"{self.model or 'this model'} x{self.copies} weight set(s)"

    def advice(self, budget: float) -> tuple[str, tuple[str, ...]]:
        meshes = self._larger_meshes(budget)
        if meshes:
            text = ", or use a larger mesh: " + "; ".join(
                f"{m} ({m.size} devices) plans within {need:.6g} GB" for m, need in meshes
            )
        elif _system_meshes(self.mesh):
            text = (
                "; no larger system mesh (" + ", ".join(str(m) for m in _system_meshes(self.mesh)) + ") fits it either"
            )
        else:
            text = ""
        return text, tuple(str(m) for m, _ in meshes)

    def _larger_meshes(self, budget: float) -> list[tuple[MeshSpec, float]]:
        """(mesh, smallest budget that plans there) for the system meshes larger than this one whose
        smallest plan fits `budget`; at most the two smallest."""
        out = []
        for m in _system_meshes(self.mesh):
            try:
                need = self.on(m).problem().need_gb(5.0)
            except (PlanError, Infeasible):
                continue
            if need * 1e9 <= budget:
                out.append((m, need))
            if len(out) == 2:
                break
        return out

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
        once = self.family_crossings()
        keys = {m.name: {s.stream for s in tables[m.name]} for m in macros + self.st.family_macros}
        out = []
        for (a, b), tensors in list(crossings.items()) + list(once.items()):
            cost = {
                (k, l): to_ns(sum(self.reshard_seconds(t, k, l) for t in tensors)) for k in keys[a] for l in keys[b]
            }
            out.append(Edge(a, b, self.n if (a, b) in crossings else 1, cost))
        return out

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

    # --- the solve's companions --------------------------------------------------------------------

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

    # --- the plan ------------------------------------------------------------------------------------

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
            moves = redistribute(self.g[a].out, self.stream(b), self.stream(l_sig), self.mesh)
            for kind, axes, shape in moves:
                nbytes = int(as_number(numel(shape), self.vals) * self.g[a].out.itemsize)
                events[(kind, axes, nbytes, self.g.generic(str(self.g[a].location)))] += times
            sliced = sliced_first(self.g[a].out, self.stream(b), self.stream(l_sig), self.mesh)
            if sliced:
                self._scatter_into_slice(events, a, sliced, chosen, evals, times)
        collectives = pricing.collectives(events, self.mesh)
        comm = sum(collective_seconds(c.kind, c.bytes, c.axes, self.mesh, self.hw) * c.count for c in collectives)
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
        memory = _weight_bytes(self.g, self.st, params, self.mesh, self.vals, self.n, self.copies)
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

    def _entry_projections(self, x: str) -> list:
        """The projections reading a further family's entry `x` (VACE's ``proj_in``): linears whose
        output has the entry's shape."""
        return [u for u in self.g.users(x) if u.op == "linear" and u.out.shape == self.g[x].out.shape]

    def _family_entries(self, chosen) -> tuple[ActivationConstraint, ...]:
        """Each further family's entries (VACE's control tokens: patch-embedded, then ``cat`` with zero
        padding) in the layout its first macro reads them, the values they are made from whole: left
        open, GSPMD propagated the token split back through the patch embedding's transpose into the
        conv and all-to-all'ed it (measured on 2x4); whole, the split is a local slice at the entry."""
        out = []
        for f in self.st.families:
            lay = self.stream(chosen[f.macros[0].name].stream)
            for x in f.entries:
                node = self.g[x]
                for i in dict.fromkeys(node.inputs):
                    src = self.g[i]
                    while src.outputs and src.op in ("transpose", "flatten") and src.inputs:
                        if src.op == "transpose":
                            whole = self.lift(i, Layout.replicated(len(src.out.shape)))
                            out.append(
                                ActivationConstraint(
                                    src.location,
                                    whole.to_spec(),
                                    src.out.shape,
                                    reason="block-family entry's tokens whole until the entry (left open, GSPMD split "
                                    "the patch embedding's channels and all-to-all'ed them onto the tokens: 2x4)",
                                )
                            )
                        src = self.g[src.inputs[0]]
                    if src.op in ("conv3d", "linear") and not any(x.location == src.location for x in out):
                        whole = self.lift(src.name, Layout.replicated(len(src.out.shape)))
                        out.append(
                            ActivationConstraint(
                                src.location,
                                whole.to_spec(),
                                src.out.shape,
                                reason="block-family patch embedding whole",
                            )
                        )
                readers = self._entry_projections(x)
                if not any(lay.dims) or not readers:
                    out.append(
                        ActivationConstraint(
                            node.location,
                            lay.to_spec(),
                            node.out.shape,
                            reason="block-family entry (the control tokens): laid out as its first macro reads them",
                        )
                    )
                    continue
                # whole up to the projection that reads it, whose output is split: each device projects
                # its own token rows (a pinned split on the concatenation still all-to-all'ed: 2x4)
                out.append(
                    ActivationConstraint(
                        node.location,
                        self.lift(x, Layout.replicated(len(node.out.shape))).to_spec(),
                        node.out.shape,
                        reason="block-family entry (the control tokens) whole; split by the projection reading it",
                    )
                )
                out += [
                    ActivationConstraint(
                        u.location,
                        lay.to_spec(),
                        u.out.shape,
                        reason="block-family entry projected in its first macro's layout (tokens on its SP axes)",
                    )
                    for u in readers
                ]
        return tuple(out)

    def _scatter_into_slice(self, events: Counter, a: str, added: tuple[str, ...], chosen, evals, times: int) -> None:
        """Stream value `a` sliced onto `added` first in its reshard (`planner.propagate.sliced_first`: a
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

    def _modulation(self, chosen, evals) -> list[tuple[str, Layout]]:
        """Block values that do not depend on the stream (the adaLN modulation: the block's table
        plus the timestep projection, chunked) read by ops that do, with the layout the chosen
        option of their macro gives them. With the stream split on hidden in one macro and whole in
        another, GSPMD propagated the split backwards into the shared chunk and all-gathered the other
        macro's vectors (measured: 3 per block on 2x4); pinned, each use slices its own. An op that
        reads only values made before the blocks (the RoPE table's even/odd columns) is left to its
        input's layout: the table is pinned where it is made.

        A per-token modulation (diffusion forcing: a timestep per frame, so the table plus a
        (B, 6, L, D) projection, chunked) is pinned all along, not only where the stream reads it:
        left open, GSPMD split the chunk on the stream's tokens and all-gathered each piece back to
        the layout the readers are pinned in (measured: 9 all-gathers over the whole 2x4 mesh, none
        predicted)."""
        block = [n for n in self.g if self.st.in_rep(self.g, n) and n.op != "placeholder"]
        dependent = {self.st.entry}
        for n in block:
            if any(i in dependent for i in n.inputs):
                dependent.add(n.name)
        out = []
        for n in block:
            m = self.macro_of.get(n.name)
            if n.name in dependent or not n.outputs or m is None:
                continue
            if all(self.g[i].block is None and not self.g[i].is_param for i in n.inputs):
                continue
            if any(u.name in dependent for u in self.g.users(n.name)) or self._per_token(n):
                lay = evals[m, chosen[m].name].layouts.get(n.name)
                if lay and lay[0] is not None:
                    out.append((n.name, self.lift(n.name, lay[0])))  # a CFG half keeps its branch
        return out

    def _per_token(self, node) -> bool:
        """Whether a single-output value of rank > 2 holds the stream's tokens on an inner dim: a per-token
        modulation, (B, 6, L, D) in SkyReels-V2 DF, (B, L, 6, D) in Wan 2.2 TI2V, its (B, L, D) pieces."""
        shape = node.out.shape if len(node.outputs) == 1 else ()
        return any(d == self.st.tokens for d in shape[1:-1]) if len(shape) > 2 else False

    def _pads_tokens(self, pad, src) -> bool:
        """Whether op `pad` pads `src` on one dim to the stream's token count (sp_pad's padding)."""
        if not src.outputs or len(src.outputs) != 1 or len(src.out.shape) != len(pad.out.shape):
            return False
        grown = [b for a, b in zip(src.out.shape, pad.out.shape) if a != b]
        return grown == [self.st.tokens]

    def _side_inputs(self) -> list[str]:
        """Non-parameter values made before the block stack that block 0 or the epilogue read,
        except the stream."""
        out: list[str] = []
        prologue, epilogue = set(self.st.prologue), set(self.st.epilogue)
        for node in self.g:
            if not self.st.in_rep(self.g, node) and node.name not in epilogue:
                continue
            for i in node.inputs:
                src = self.g[i]
                if (
                    i in prologue
                    and not src.is_param
                    and src.outputs
                    and i != self.st.entry
                    and src.op != "placeholder"
                    and i not in out
                    and self._reads_a_placeholder(i)
                ):
                    out.append(i)
        return out

    def _reads_a_placeholder(self, name: str) -> bool:
        """Whether `name` depends on a model input or parameter: a value made from literals alone
        (sp_pad's key mask, an ``arange`` on the host) has nothing to pin and may not live on the device."""
        todo, seen = [name], set()
        while todo:
            x = self.g[todo.pop()]
            if x.op == "placeholder":
                return True
            if x.name not in seen:
                seen.add(x.name)
                todo.extend(x.inputs)
        return False

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

    def _activations(self, pins, sigma0, copies, *, tokens_split: bool, ranged=()) -> tuple[ActivationConstraint, ...]:
        """Constraints: `pins` (node, layout, reason) in place after the op, `copies` (reader, input index,
        layout) on a reader's input; block nodes are written for every block, `ranged` pins (node,
        layout, reason, blocks) for those blocks only (FSDP per block range); the prologue values the
        blocks read, in their planned layout. `tokens_split`: some block macro splits the stream's tokens."""
        entry = self.g[self.st.entry]
        acts = [
            ActivationConstraint(
                entry.location,
                self.stream(sigma0).to_spec(),
                entry.out.shape,
                reason="block-stack entry: tokens split over the SP axes (a transpose copy, not a reshape)",
            )
        ]
        if entry.op == "pad" and any(sigma0[0]):
            # sp_pad's token padding: keep its input whole, so the split starts after the pad (a free
            # local slice). Left to propagation, GSPMD splits the unpadded tokens and shifts them into
            # the padded shards with a collective-permute (45 -> 64 tokens over 4: 12 vs 16 per device).
            src = self.g[entry.inputs[0]]
            whole = self.lift(src.name, Layout.replicated(len(src.out.shape))).to_spec()
            acts.insert(
                0, ActivationConstraint(src.location, whole, src.out.shape, reason="tokens whole before SP padding")
            )

        def per_block(node, blocks=None) -> list:
            if not self.st.in_rep(self.g, node):
                return [node.location]
            return [self.g.block_location(node, k) for k in (range(self.n) if blocks is None else blocks)]

        for name, lay, why, *blocks in [*pins, *ranged]:
            node = self.g[name]
            k = self.g.picks(node)
            # output k of a tuple-valued op (an adaLN chunk piece) is constrained at that op: a getitem
            # of a tuple is no op in the model's own code (plain torch_xla, the export, cannot see it)
            at, output = (self.g[node.inputs[0]], k) if k is not None else (node, 0)
            acts += [
                ActivationConstraint(loc, lay.to_spec(), node.out.shape, output=output, reason=why)
                for loc in per_block(at, *blocks)
            ]
        for name, i, lay in copies:
            node, value = self.g[name], self.g[self.g[name].inputs[i]]
            acts += [
                ActivationConstraint(
                    loc,
                    lay.to_spec(),
                    value.out.shape,
                    input=i,
                    reason="stream read in this macro's layout (a copy: the producing macro keeps its own)",
                )
                for loc in per_block(node)
            ]
        if tokens_split:
            from planner.hand_plans import _rope_tables

            for table in _rope_tables(self.g):
                acts.append(
                    ActivationConstraint(
                        table.location,
                        (None,) * len(table.out.shape),
                        table.out.shape,
                        reason="RoPE table kept replicated: each device slices its token rows locally (unconstrained, GSPMD "
                        "propagates the SP split back into the table's (F, H, W) -> L reshape and emits all-to-alls)",
                    )
                )
        # GSPMD propagates a split the blocks read in backwards into the unconstrained prologue
        # (measured: with the stream split beyond σ, the timestep projection all-reduced on a
        # contraction it chose to split; an FSDP K/V projection split on its input features made the
        # image embedder's last linear compute half its features and its LayerNorm all-reduce the
        # statistics): the values the blocks read from the prologue keep the rules' layout.
        pinned = {a.location for a in acts}
        for x in self._side_inputs():
            node = self.g[x]
            if node.location not in pinned and self.base.get(x):
                acts.append(
                    ActivationConstraint(
                        node.location,
                        self.base[x][0].to_spec(),
                        node.out.shape,
                        reason="prologue value the blocks read, kept in its planned layout",
                    )
                )
        if tokens_split:
            # the other token paddings (sp_pad: RoPE tables, diffusion forcing's per-token modulation and
            # output shift/scale) read whole like the entry's: left open, GSPMD split the unpadded
            # shift/scale of the output modulation and shifted them with collective-permutes
            pinned = {a.location for a in acts}
            for pad in self.g:
                src = self.g[pad.inputs[0]] if pad.op == "pad" and pad.inputs else None
                while src is not None and src.op == "to" and self.g[src.inputs[0]].outputs == src.outputs:
                    src = self.g[src.inputs[0]]  # a device-only .to, which the lowering drops
                if src is None or pad.name == entry.name or src.location in pinned or not self._pads_tokens(pad, src):
                    continue
                whole = self.lift(src.name, Layout.replicated(len(src.out.shape))).to_spec()
                acts.append(
                    ActivationConstraint(src.location, whole, src.out.shape, reason="tokens whole before SP padding")
                )
            # and sp_pad's unpadding slices outside the blocks (Animate's face adapter reads the padded
            # stream, slices the true tokens back to group them by frame) read and make their planned
            # layouts: left open, GSPMD kept the token split through the slice (a collective-permute
            # shifting the shards onto the true token count), then gathered at the frame reshape
            ends = self.ends(sigma0)
            planned = ends.layouts
            for cut in self.g:
                src = self.g[cut.inputs[0]] if cut.op == "getitem" and cut.inputs else None
                if (
                    src is None
                    or cut.block is not None
                    or self.g.picks(cut) is not None
                    or cut.location in pinned
                    or not planned.get(cut.name)
                    or not self._pads_tokens(src, cut)
                ):
                    continue
                read = ends.required.get((cut.name, 0))
                if read is not None:
                    acts.append(
                        ActivationConstraint(
                            cut.location,
                            read.to_spec(),
                            src.out.shape,
                            input=0,
                            reason="padded tokens read by the unpadding slice as planned (resharded before it)",
                        )
                    )
                acts.append(
                    ActivationConstraint(
                        cut.location,
                        planned[cut.name][0].to_spec(),
                        cut.out.shape,
                        reason="tokens unpadded in their planned layout",
                    )
                )
        exit_ = self.g[self.st.exit]
        exit_lay = self.lift(exit_.name, Layout.replicated(len(exit_.out.shape)))
        acts.append(
            ActivationConstraint(
                exit_.location,
                exit_lay.to_spec(),
                exit_.out.shape,
                reason="exit: tokens gathered before unpatchify"
                + (" (batch stays split: each half keeps its branch)" if self.batch_axes else ""),
            )
        )
        inputs = [
            ActivationConstraint(
                self.g[x].location,
                lays[0].to_spec(),
                self.g[x].out.shape,
                reason="model input split on the batch: one CFG branch per half of the mesh",
            )
            for x, lays in self.inputs.items()
        ]
        return tuple(inputs + acts)


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


def _weight_bytes(graph: Graph, st, specs: Mapping, mesh: MeshSpec, values, num_blocks: int, copies: int) -> float:
    """Per-device parameter bytes of the whole model under the partition specs `specs` (by parameter
    name): the captured graph's parameters outside the main stack, and the main stack's
    representative block's under each of the `num_blocks` blocks' own specs (an FSDP block range
    differs; a name the specs lack reads the representative's)."""

    def size(p, name: str) -> float:
        spec = specs.get(name, specs.get(p.param))
        return pricing.local_bytes(p.out, Layout.from_spec(spec) if spec is not None else None, mesh, values)

    outside = sum(size(p, p.param) for p in graph.params() if not st.in_main(graph, p))
    blocks = sum(
        size(p, graph.in_block(p, p.param, k)) for p in graph.params() if st.in_rep(graph, p) for k in range(num_blocks)
    )
    return (outside + blocks) * copies


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


def price_plan(graph: Graph, plan: Plan, hardware: str | HardwareProfile, **how) -> Predicted:
    """Price any plan (a hand plan, a loaded plan.json) under the same cost model as the ILP; `how`:
    ``num_blocks``, ``weight_copies``, ``values`` as `evaluate_forward`'s."""
    return evaluate_forward(graph, plan, hardware, **how).predicted


@dataclass(frozen=True)
class Forward:
    """One forward of a plan, evaluated by the op rules: what `price_plan` sums and
    `planner.calibration` takes apart."""

    graph: Graph  # the planner graph the evaluations name
    parts: tuple[tuple[Evaluation, int], ...]  # (prologue | one block | epilogue, times per forward)
    events: tuple[tuple[Collective, int], ...]  # every collective call, with its calls per forward
    memory_bytes: float

    @property
    def predicted(self) -> Predicted:
        compute = sum(ev.compute_seconds * times for ev, times in self.parts)
        comm = sum(e.seconds * times for e, times in self.events)
        return Predicted(compute + comm, compute, comm, int(self.memory_bytes))


def evaluate_forward(
    graph: Graph,
    plan: Plan,
    hardware: str | HardwareProfile,
    *,
    num_blocks: Optional[int] = None,
    weight_copies: int = 1,
    values: Optional[Mapping[str, int]] = None,
) -> Forward:
    """The op rules over one forward of `graph` under `plan`: the prologue, block 0 (standing for
    all `num_blocks`) and the epilogue."""
    hw = hardware if isinstance(hardware, HardwareProfile) else get_profile(hardware)
    graph = dit_graph(graph)
    st = find_structure(graph)
    n = num_blocks or st.captured_blocks
    vals = dict(values or {})
    mesh = plan.mesh
    forced, copies = plan.constraint_layouts(graph)
    boundary = {p.name: (Layout.from_spec(plan.params[p.param]),) for p in graph.params() if p.param in plan.params}
    b0 = [x for x in graph if st.in_rep(graph, x) and x.op != "placeholder"]
    pro = [graph[x] for x in st.prologue]
    epi_in = {}
    ev_pre = evaluate(graph, pro + b0, mesh, hw, boundary=boundary, forced=forced, forced_inputs=copies, values=vals)
    out_lay = ev_pre.layouts[st.block_output]
    for x in st.epilogue:
        for i in graph[x].inputs:
            if graph[i].block is not None and graph[i].outputs and graph[i].out.shape == graph[st.entry].out.shape:
                epi_in[i] = out_lay
    ev_epi = evaluate(
        graph,
        [graph[x] for x in st.epilogue],
        mesh,
        hw,
        boundary={**ev_pre.layouts, **boundary, **epi_in},
        forced=forced,
        forced_inputs=copies,
        values=vals,
    )
    b0_names = {x.name for x in b0}
    events = [(e, 1) for e in ev_epi.events]
    events += [(e, n if graph.generic(e.where) != e.where else 1) for e in ev_pre.events]
    ev_blk = evaluate(
        graph,
        b0,
        mesh,
        hw,
        boundary={k: v for k, v in {**ev_pre.layouts, **boundary}.items() if k not in b0_names},
        forced=forced,
        forced_inputs=copies,
        values=vals,
    )
    ev_pro = evaluate(graph, pro, mesh, hw, boundary=boundary, forced=forced, forced_inputs=copies, values=vals)
    memory = _weight_bytes(graph, st, plan.params, mesh, vals, n, weight_copies)
    memory += pricing.ACTIVATION_FACTOR * max(ev_blk.peak_bytes, ev_pro.peak_bytes, ev_epi.peak_bytes)
    return Forward(graph, ((ev_pro, 1), (ev_blk, n), (ev_epi, 1)), tuple(events), memory)
