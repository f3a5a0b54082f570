"""The DiT as a model family of `planner.engine`, assembled from its parts by job.

`DitFamily` is built once from a `planner.request.PlanRequest` (immutable after construction). This module owns its construction, its variants (another mesh, the graph with some
attentions' heads padded) and each macro's strategies under the family's options; the rest is one
module per job, each a part reading the state set here and declared in `planner.dit_state.DitState`:

- `planner.dit_pricing`: what an option and a stream edge cost;
- `planner.dit_problem`: the ILP problem, the ring options, the presets and the hint;
- `planner.dit_advice`: the words of a failed solve (the larger meshes that plan);
- `planner.dit_explain`: the decisions;
- `planner.dit_assemble`: the plan from the solution;
- `planner.dit_pins`: the plan's activation constraints.
"""

from __future__ import annotations

from dataclasses import replace as dc_replace
from typing import Mapping, Optional

from planner.dit_advice import DitAdvice
from planner.dit_assemble import DitAssembly
from planner.dit_explain import DitExplain
from planner.dit_pins import DitPins
from planner.dit_pricing import DitPricing
from planner.dit_problem import PRESETS, DitProblem, _RingOption
from planner.graph import Graph
from planner.macros import Macro
from planner.mesh import MeshSpec
from planner.padding import needs_padding, pad_targets
from planner.plan import Exclusion, HeadPadding, PlanError
from planner.request import PlanRequest
from planner.strategies import Strategy, family_strategies
from planner.structure import dit_graph, find_structure


class DitFamily(DitPricing, DitProblem, DitAdvice, DitExplain, DitAssembly, DitPins):
    """The DiT as a model family of `planner.engine`: its macros (`structure.find_structure`), their
    options priced by the op rules, the stream edges between them; its decisions and its plan. Built
    once from `plan_graph`'s arguments (immutable after construction)."""

    def __init__(self, graph: Graph, request: PlanRequest):
        r = request
        if r.preset not in PRESETS:
            raise PlanError(f"unknown DiT plan preset {r.preset!r}; choose one of {list(PRESETS)}")
        graph = dit_graph(graph)  # stacks that are not transformer blocks planned op by op
        st = find_structure(graph)
        mesh = r.mesh
        self.g, self.mesh, self.hw, self.st = graph, mesh, r.hw, st
        self.n, self.copies, self.vals = r.num_blocks or st.captured_blocks, r.weight_sets, dict(r.values)
        self.sequence_parallel, self.only = r.sequence_parallel, dict(r.only)
        self.preset, self.model = r.preset, r.model or graph.model
        self.stream_layouts = r.stream_layouts
        self.batch_axes = tuple(a for a in r.batch_axes if mesh.axis_size(a) > 1)
        self.inputs = self._batch_inputs()
        self.batch_nodes = self._batch_carrying()
        self.base = self._base_layouts()
        self.macro_of: dict[str, str] = {x: m.name for m in st.block_macros + st.family_macros for x in m.nodes}
        self.macros = st.block_macros + st.family_macros + st.root_macros
        self.family_first = {f.macros[0].name: f for f in st.families}
        self.hidden = graph[st.entry].out.shape[-1] if r.stream_layouts and r.preset == "auto" else None
        self._ends: dict = {}  # (stream key, priced) -> `ends(key)`, computed once
        self.spec = r.target  # the target (planner.targets): what its partitioner lowers
        # None: GSPMD, whose reshards the rules' events are in; else the target the options are priced for
        self.target = None if r.target.modelled_by_rules else r.target
        self.pad_heads = r.pad_heads
        self.fsdp_blocks = dict(r.fsdp_blocks or {})
        self.pads = pad_targets(graph, st.block_macros, mesh, self.batch_axes) if r.pad_heads is not None else {}
        self._variants: dict = {}  # macro name -> (family on its padded graph, its macro there) or why not
        # macro name -> every ring option priced by `problem` (offered to the solver or not), `_RingOption`
        self._rings: dict[str, list[_RingOption]] = {}
        # the request as built: `_with` varies it
        self.request = r.variant(num_blocks=self.n, batch_axes=self.batch_axes, model=self.model)

    def _with(self, graph: Optional[Graph] = None, **changes) -> "DitFamily":
        """This family's model and request, with `changes` (`PlanRequest` fields)."""
        return DitFamily(graph or self.g, self.request.variant(**changes))

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
