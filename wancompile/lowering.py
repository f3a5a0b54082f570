"""Lowering a `Plan` to torch_xla SPMD: `ShardedProgram`, a captured graph that runs under a plan.

What the partitioner sees (DESIGN.md §4): parameters get ``xs.mark_sharding`` on their XLA tensors
before the first trace (they become the computation's input shardings); each activation constraint
becomes an in-graph ``xs.mark_sharding`` call after the op at the plan's `Location`. `ShardedProgram`
puts the jobs together, each owned by its module:

* `wancompile.constraints` — the constraint calls inserted into the FX graph;
* `wancompile.params` — the arguments on the device, parameters sharded once and cached;
* `wancompile.fold` — parameter-only subgraphs computed once per parameter version;
* `wancompile.replay` — trace once per input signature, then replay the compiled program by hash;
* `wancompile.hlo_record` — which dumped partitioned HLO module is this program's.

Why not torch_xla's dynamo bridge itself (the ``openxla_eval`` backend): it re-sorts the FX graph by
data edges, which runs diffusers' RoPE writes after their reads (docs/numerics.md). Its other failure
under SPMD ("Trying to access XLA data for tensor ... while an async operation is in flight:
UNKNOWN_SCALAR[]" on the first replay) was not the resharding constraints: it was the host round trip
dynamo bakes into diffusers' ``t.to(x.device)``, which `wancompile.legalize` drops — with it gone the
bridge replays the hand plan (tests/test_lowering.py pins both). The ``openxla`` AOT path rejects
in-graph annotations altogether (DESIGN.md §4).
"""

from __future__ import annotations

import re
import time
from dataclasses import replace
from typing import Any, Callable, Optional, Sequence

import torch
import torch.fx as fx

from planner.graph import Graph
from planner.mesh import PartitionSpec
from planner.plan import Plan, replicated_params
from planner.request import PlanRequest
from planner.targets import Target
from wancompile import composites
from wancompile.constraints import insert_constraints
from wancompile.hlo_record import HloRecord, program_key
from wancompile.legalize import legalize, place_factories
from wancompile.meshes import mesh_for_plan, mesh_spec_of, xla_mesh
from wancompile.params import ProgramArguments
from wancompile.replay import Replay

__all__ = ["ShardedProgram", "mesh_for_plan", "mesh_spec_of", "xla_mesh"]


def _split(xla_spec: str) -> bool:
    """Whether a torch_xla sharding annotation (``{devices=[1,4,1]0,1,2,3}``, ``{replicated}``, "") splits a dim
    (the last tile dim of ``last_tile_dim_replicate`` replicates)."""
    tiles = re.match(r"\{devices=\[([\d,]+)\]", xla_spec)
    if tiles is None:
        return False
    dims = [int(d) for d in tiles.group(1).split(",")]
    return any(d > 1 for d in (dims[:-1] if "last_tile_dim_replicate" in xla_spec else dims))


class ShardedProgram:
    """A captured graph lowered under a plan: call it with the graph's inputs (host or XLA).

    Parameter-only subgraphs (e.g. the ``qkv`` rewrite's weight packing) are constant-folded
    (`wancompile.fold`): computed on the device once per parameter version, then read by the main
    program as extra inputs. ``fold=False`` keeps them in-graph (the backend's ``fold_parameters`` option).

    ``kind`` is what the backend captured (``"wan-dit"``, ``"wan-vae"``, ``"graph"``: `wancompile.programs.
    Component`, or the name of a planner family registered since: `planner.families`), for callers that look
    for one component among the programs compiled. ``target``: the partitioner the program is for (its
    request's, `planner.request.PlanRequest`); None: the plan's.
    ``stablehlo_sink`` is called as sink(program, output tensors, arguments) when the main ("main") or fold
    ("fold") program traces, before XLA compiles it (`arguments`: the program's argument tensors, each with
    the names of the parameters it holds or was folded from, `argument_names`):
    `wancompile.tt.export.ShardyExport` writes it for tt-mlir."""

    def __init__(
        self,
        gm: fx.GraphModule,
        graph: Graph,
        plan: Plan,
        mesh: Any,
        *,
        legalize_ops: bool = True,
        fold: bool = True,
        kind: str = "graph",
        target: Optional[Target] = None,
        fused: bool = True,
    ) -> None:
        import torch_xla

        from wancompile.fold import FoldedValues, moves_to_host, split_parameter_subgraphs

        self.graph, self.plan, self.mesh, self.source, self.kind = graph, plan, mesh, gm, kind
        self.stablehlo_sink: Optional[Callable[[str, list], None]] = None
        self.verification = None  # the backend's verify option: the first call's `wancompile.verify.Numerics`
        self.compile_times = None  # `wancompile.backend.CompileTimes`, set by the backend
        self.first_call_s: Optional[float] = None  # the first call: trace, XLA compile (or cache load), run
        self._hlo, self._fold_hlo = HloRecord(), HloRecord()
        self.device = torch_xla.device()
        legal = place_factories(legalize(gm)[0] if legalize_ops else gm, self.device)[0]
        target = self.target = target if target is not None else PlanRequest.for_plan(plan).target
        self.lowered = insert_constraints(legal, graph, plan, mesh, target, fused=fused)
        # the calls the target runs as fused kernels (`wancompile.composites`), and why the others are not
        self.fused_sites = self.lowered.meta["fused_sites"]
        # every layout the program marks: the plan's, and those of ops written out with pinned intermediates
        self.specs = frozenset(
            {tuple(s) for s in plan.params.values()}
            | {tuple(a.spec) for a in plan.activations}
            | self.lowered.meta["pinned_specs"]
        )
        placeholders = [n for n in graph if n.op == "placeholder"]
        self._params = [n.param for n in placeholders]
        self.arguments = ProgramArguments(self._params, self._placeholder_specs(placeholders), mesh, self.device)
        self._replays: dict[tuple, Replay] = {}
        self.traces = 0  # how many times the FX graph was traced (once per input signature when replayed)
        self.not_replayed: Optional[str] = None  # why the last trace could not be replayed
        self.fold = None  # FoldedValues, when the graph has parameter-only subgraphs
        in_order = mesh.axis_names if target is not None and target.results_in_mesh_order else None
        split = split_parameter_subgraphs(self.lowered, self._params, in_order) if fold else None
        if split is not None:
            self.fold = FoldedValues(split)
            self.lowered = split.main
        moves = [n.name for n in self.lowered.graph.nodes if moves_to_host(n)]
        self._host_moves = (
            (f"the graph copies values to the host mid-program ({', '.join(moves)}): a replay would freeze them")
            if moves
            else None
        )
        self._last_args: Optional[list] = None  # the last call's program arguments (`program_args`)

    def _placeholder_specs(self, placeholders) -> list[Optional[PartitionSpec]]:
        """Sharding for each placeholder: the plan's parameter spec, or an activation constraint
        placed on an input placeholder."""
        on_inputs = {c.location: c.spec for c in self.plan.activations}
        return [self.plan.params.get(n.param) if n.param else on_inputs.get(n.location) for n in placeholders]

    @property
    def hlo_path(self):
        """The main program's partitioned HLO (after its first run with an HLO dump directory), else None."""
        return self._hlo.path

    @property
    def fold_hlo_path(self):
        """The fold program's partitioned HLO (after it ran with an HLO dump directory), else None."""
        return self._fold_hlo.path

    def to_device(self, args: Sequence[Any], needed: Optional[Sequence[bool]] = None) -> list[Any]:
        """The arguments on the device (`wancompile.params.ProgramArguments.to_device`)."""
        return self.arguments.to_device(args, needed)

    def holds(self, t: torch.Tensor) -> bool:
        """Does this program hold `t` (a parameter of the module it ran) on the device?"""
        return self.arguments.holds(t)

    def __call__(self, *args: Any) -> Any:
        host = next(
            (
                args[i].device
                for i in self.arguments.inputs
                if isinstance(args[i], torch.Tensor) and args[i].device.type != "xla"
            ),
            None,
        )
        t0 = time.perf_counter() if self.first_call_s is None else None
        xla_args = self.program_args(args)
        signature = self._signature(xla_args)
        replay = self._replays.get(signature) if self._host_moves is None else None
        if replay is not None:
            out = replay(xla_args)
        else:
            started = self._hlo.start()
            sink = self.stablehlo_sink
            replay, out, why, mutated = Replay.trace(
                self.lowered,
                xla_args,
                self.device,
                refuse=self._host_moves or "",
                sink=(lambda outs: sink("main", self._exported(xla_args, outs), self.named_arguments(xla_args)))
                if sink is not None
                else None,
            )
            self.traces += 1
            if replay is not None:
                self._replays[signature] = replay
            else:
                self.not_replayed = why
            for i in mutated:  # in-place writes into host arguments land where the caller sees them
                if args[i].device.type != "xla":
                    with torch.no_grad():
                        args[i].copy_(xla_args[i].to(args[i].device))
            if started is not None:
                key = replay.graph_hash if replay is not None else program_key(self.lowered, self.plan, xla_args)
                self._hlo.finish(started, key)
        if t0 is not None:
            self.first_call_s = time.perf_counter() - t0
        return out if host is None else _to_host(out, host)

    def trace_only(self, *args: Any) -> int:
        """Trace the main program for the graph's inputs `args` and hand it to `stablehlo_sink`, without
        compiling or running it: a full-width model is exported for tt-mlir on a machine that could
        not run it (`wancompile.tt.fullsize`). Split parameters go to the device as data, sharded as the
        plan says; replicated ones are placeholders that hold no buffer (`ProgramArguments.placeholders`).
        The fold program (parameter-only values: RoPE tables, casts, packed weights) runs, so that the
        main program reads its values as device data, as it does when it runs. Returns the number of
        traced outputs; the traced graph is then dropped."""
        import torch.utils._pytree as pytree
        import torch_xla

        if self.stablehlo_sink is None:
            raise RuntimeError("trace_only needs a stablehlo_sink to hand the traced program to")
        with torch.no_grad():
            fold = set(self.fold.split.sources) if self.fold is not None else set()
            xla_args = self.arguments.placeholders(args, [i in fold for i in range(len(args))])
            if self.fold is not None:
                xla_args = [a if keep else None for a, keep in zip(xla_args, self.fold.split.main_reads)]
                xla_args += self._folded(args, xla_args)
            with composites.emitting():
                outs = [t for t in pytree.tree_leaves(self.lowered(*xla_args)) if isinstance(t, torch.Tensor)]
            if self._composites_refused(xla_args, outs):
                torch_xla._XLAC._clear_pending_irs(str(self.device))
                outs = [t for t in pytree.tree_leaves(self.lowered(*xla_args)) if isinstance(t, torch.Tensor)]
            self.stablehlo_sink("main", outs, self.named_arguments(xla_args))
        self.traces += 1
        torch_xla._XLAC._clear_pending_irs(str(self.device))
        return len(outs)

    def _exported(self, xla_args: Sequence[Any], outs: list) -> list:
        """The traced outputs of the program as exported: `outs` itself, or where fused ops emit composites
        (`fused_sites`), the same program traced once more with them emitted (XLA:CPU cannot run their
        markers, so the program that runs is the first trace); that second trace is never compiled."""
        import torch.utils._pytree as pytree
        import torch_xla

        if not any(not s.why_not for s in self.fused_sites) or self._composites_refused(xla_args, outs):
            return outs
        tensors = [a for a in xla_args if isinstance(a, torch.Tensor)]
        pending = torch_xla._XLAC._check_tensor_need_materialization(tensors)
        with composites.emitting():
            exported = [t for t in pytree.tree_leaves(self.lowered(*xla_args)) if isinstance(t, torch.Tensor)]
        if torch_xla._XLAC._check_tensor_need_materialization(tensors) != pending:
            raise RuntimeError("the program writes into its inputs: it cannot be traced a second time for its export")
        return exported

    def _composites_refused(self, xla_args: Sequence[Any], outs: Sequence[torch.Tensor]) -> bool:
        """Whether the target would refuse the program's composites (`Target.composites_need_split_boundary`): it
        splits values inside while every argument and result is whole. Its fused sites then say so, and the
        program is exported as it runs (each op decomposed, with the plan's pins)."""
        import torch_xla

        if not self.target.composites_need_split_boundary or not any(not s.why_not for s in self.fused_sites):
            return False
        split_inside = any(e is not None for spec in self.specs for e in spec)
        boundary = [t for t in (*xla_args, *outs) if isinstance(t, torch.Tensor)]
        if not split_inside or any(_split(torch_xla._XLAC._get_xla_sharding_spec(t)) for t in boundary):
            return False
        why = (
            f"every argument and result of the program is whole while it splits values inside: {self.target.name} "
            "partitions a composite's decomposition only in a program with a split argument or result"
        )
        self.fused_sites = tuple(replace(s, why_not=s.why_not or why) for s in self.fused_sites)
        return True

    def argument_names(self) -> list[tuple[str, ...]]:
        """Per argument of the lowered program (`program_args`): the parameter it is (one name), the
        parameters a folded value was computed from (`wancompile.fold`), or () for an input."""
        names = [(p,) if p else () for p in self._params]
        if self.fold is not None:
            names += self.fold.split.sources_of(self._params)
        return names

    def named_arguments(self, xla_args: Sequence[Any]) -> list[tuple[Any, tuple[str, ...]]]:
        """The program's argument tensors among `xla_args` (`program_args`), each with its `argument_names`."""
        return [(a, n) for a, n in zip(xla_args, self.argument_names()) if isinstance(a, torch.Tensor)]

    def program_args(self, args: Sequence[Any]) -> list[Any]:
        """The lowered program's arguments for a call with the graph's inputs `args`: on the device,
        parameters sharded and cached, the fold program's values appended (it runs if they are stale).
        ``self.lowered(*program_args(args))`` traces the program without running it.

        The parameters' part is kept from the last call while the same parameter tensors (identity and
        ``_version``, compared without a Python loop) come again: a call then prepares its inputs only."""
        same = self.arguments.same_parameters(args)
        if same and self._last_args is not None:
            return self.arguments.inputs_to_device(args, list(self._last_args))
        xla_args = self.to_device(args, self.fold.split.main_reads if self.fold else None)
        if self.fold is not None:
            xla_args = [a if keep else None for a, keep in zip(xla_args, self.fold.split.main_reads)]
            xla_args += self._folded(args, xla_args)
        self._last_args = xla_args if same else None
        return xla_args

    def _signature(self, xla_args: Sequence[Any]) -> tuple:
        """What a replay is specialised to beyond dynamo's own guards: the sizes of the inputs that are
        not parameters (they vary under ``dynamic=True``) and the values of non-tensor arguments."""
        return tuple(
            (tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a
            for a in (xla_args[i] for i in self.arguments.inputs)
        )

    def _folded(self, args: Sequence[Any], xla_args: Sequence[Any]) -> list[torch.Tensor]:
        """The fold program's values (cached per parameter version); its HLO is recorded apart."""
        runs = self.fold.runs
        started = self._fold_hlo.start()
        sink = self.stablehlo_sink

        def device_arg(i: int) -> torch.Tensor:  # read only by the fold program: on the device, not kept there
            return xla_args[i] if xla_args[i] is not None else self.arguments.uncached(args, i)

        def fold_sink(outs: list, inputs: list) -> None:
            names = [(self._params[i],) if self._params[i] else () for i in self.fold.split.sources]
            sink("fold", outs, list(zip(inputs, names)))

        values = self.fold.get(args, device_arg, sink=fold_sink if sink is not None else None)
        if started is not None and self.fold.runs > runs:
            self._fold_hlo.finish(started, self.fold.graph_hash)
        return values

    def collectives(self) -> list:
        """The collectives of this program's partitioned HLO (needs an HLO dump directory: see
        wancompile.runtime.configure)."""
        from wancompile import hlo

        if self.hlo_path is None:
            raise RuntimeError(
                "no partitioned HLO was recorded for this program: run it once with XLA_FLAGS=--xla_dump_to=DIR set "
                "before the XLA runtime starts (wancompile.runtime.configure(dump_dir=...), or the backend's dump_dir option)"
            )
        return hlo.parse_collectives(self.hlo_path.read_text(), self.plan.mesh)

    def fold_collectives(self) -> list:
        """The collectives of the fold program's partitioned HLO ([] when nothing was folded)."""
        from wancompile import hlo

        if self.fold is None:
            return []
        if self.fold_hlo_path is None:
            raise RuntimeError("no partitioned HLO was recorded for the fold program (see collectives())")
        return hlo.parse_collectives(self.fold_hlo_path.read_text(), self.plan.mesh)

    def replicated(self) -> "ShardedProgram":
        """The same (legalized) graph with every parameter and activation replicated: the
        one-device program that sharded results are judged against."""
        return ShardedProgram(
            self.source,
            self.graph,
            Plan(self.plan.model, self.plan.mesh, replicated_params(self.graph)),
            self.mesh,
            kind=self.kind,
        )


def _to_host(out: Any, device: torch.device) -> Any:
    if isinstance(out, torch.Tensor):
        return out.to(device)
    if isinstance(out, (tuple, list)):
        return type(out)(_to_host(o, device) for o in out)
    return out
