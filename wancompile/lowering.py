"""Lowering a `Plan` to torch_xla SPMD: parameter shardings + in-graph activation constraints.

What the partitioner sees (DESIGN.md §4): parameters get ``xs.mark_sharding`` on their XLA tensors
before the first trace (they become the computation's input shardings); each activation constraint
becomes a plain Python call of ``xs.mark_sharding`` inserted into the FX graph right after the op at
the plan's `Location`, which torch_xla records as a sharding annotation on that HLO value.

Trace once, replay (`Replay`): the first call for an input signature runs the FX graph on XLA tensors
under lazy tracing in program order (so diffusers' RoPE ``out[..., 0::2] = ...`` writes stay before
their reads: docs/numerics.md), compiles the traced graph and records its hash and where each of its
inputs comes from (a call argument, or a constant the trace made, such as a scalar). Every later call
with that signature hands the arguments straight to ``torch_xla._XLAC._run_cached_graph`` — the
mechanism torch_xla's dynamo bridge replays with — with no FX interpretation and no IR building.
A graph that mutates an input, draws random numbers, copies a device value to the host mid-program
(its value would come back as a constant frozen into the replay) or returns an input unchanged is
not replayed: it is traced per call, and ``ShardedProgram.not_replayed`` says why.

Why not torch_xla's dynamo bridge itself (the ``openxla_eval`` backend): it re-sorts the FX graph by
data edges, which runs diffusers' RoPE writes after their reads (docs/numerics.md). Its other failure
under SPMD ("Trying to access XLA data for tensor ... while an async operation is in flight:
UNKNOWN_SCALAR[]" on the first replay) was not the resharding constraints: it was the host round trip
dynamo bakes into diffusers' ``t.to(x.device)``, which `wancompile.legalize` drops — with it gone the
bridge replays the hand plan (tests/test_lowering.py pins both). The ``openxla`` AOT path rejects
in-graph annotations altogether (DESIGN.md §4).

This is the only module that imports torch_xla's SPMD API.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
import torch.fx as fx
import torch.nn.functional as F

from planner.graph import Graph
from planner.mesh import MeshSpec, PartitionSpec
from planner.pins import PIN_REASONS, READ_PIN_REASON
from planner.plan import Plan, PlanError, replicated_params
from planner.targets import get_target
from wancompile.legalize import layer_norm_decomposed, legalize, place_factories


def xla_mesh(spec: MeshSpec):
    """A torch_xla Mesh with row-major device ids, checked against the runtime's device count."""
    import torch_xla.distributed.spmd as xs

    from wancompile import runtime

    n = runtime.device_count()
    if n != spec.size:
        raise PlanError(
            f"mesh {spec} needs {spec.size} devices but the XLA runtime has {n}. Use a mesh whose axis sizes "
            f"multiply to {n}, or start the process with PJRT_DEVICE=CPU CPU_NUM_DEVICES={spec.size} (virtual CPU devices)."
        )
    return xs.Mesh(np.arange(spec.size), spec.shape, spec.axis_names)


def mesh_for_plan(mesh: Any, spec: MeshSpec):
    """The torch_xla Mesh whose axes a plan's specs name: `mesh` itself, or for a CFG-split plan (whose
    mesh refines the user's, planner.cfg.split_mesh) the same devices in the same row-major order,
    reshaped to the plan's shape and axis names."""
    import torch_xla.distributed.spmd as xs

    if tuple(int(n) for n in mesh.mesh_shape) == spec.shape and tuple(mesh.axis_names) == spec.axis_names:
        return mesh
    ids = np.asarray(mesh.device_ids).reshape(-1)
    if ids.size != spec.size:
        raise PlanError(f"plan mesh {spec} {spec.axis_names} has {spec.size} devices, the compile's mesh {ids.size}")
    return xs.Mesh(ids, spec.shape, spec.axis_names)


def mesh_spec_of(mesh: Any) -> MeshSpec:
    """MeshSpec of a torch_xla Mesh."""
    return MeshSpec(tuple(int(n) for n in mesh.mesh_shape), tuple(mesh.axis_names))


# Partitioned-HLO dump of each distinct program compiled in this process, so a program that XLA
# serves from its compile cache still knows its HLO.
_HLO_BY_PROGRAM: dict[str, Any] = {}

# FX code can only embed literals, so in-graph constraint calls name their mesh by a key.
_MESHES: dict[str, Any] = {}


def _mesh_key(mesh: Any) -> str:
    key = f"{tuple(mesh.mesh_shape)}|{tuple(mesh.axis_names)}|{tuple(int(d) for d in np.asarray(mesh.device_ids).ravel())}"
    _MESHES[key] = mesh
    return key


def _constrain(value: Any, mesh_key: str, spec: PartitionSpec, output: int) -> None:
    import torch_xla.distributed.spmd as xs

    t = value[output] if isinstance(value, (tuple, list)) else value
    xs.mark_sharding(t, _MESHES[mesh_key], spec)


def _constrained_copy(value: torch.Tensor, mesh_key: str, spec: PartitionSpec) -> torch.Tensor:
    """A copy of `value` constrained to `spec`, leaving `value`'s own layout alone (how torch_xla's
    ``mark_sharding_with_gradients`` constrains without writing in place)."""
    import torch_xla.distributed.spmd as xs

    copy = value.clone()
    xs.mark_sharding(copy, _MESHES[mesh_key], spec)
    return copy


def _weight_read(value: torch.Tensor, mesh_key: str, spec: PartitionSpec) -> torch.Tensor:
    """`_constrained_copy` of a weight in the layout an op reads it in (`planner.pins` READ_PIN_REASON):
    in the main program, never folded (`wancompile.fold`), or a gathered FSDP weight would be stored whole.
    A view, not a clone: torch_xla's clone of a sharded parameter keeps its annotation ("Existing annotation
    must be cleared first")."""
    import torch_xla.distributed.spmd as xs

    copy = value.view(value.shape)
    xs.mark_sharding(copy, _MESHES[mesh_key], spec)
    return copy


def _pinned_layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5, *, mesh_key: str, spec: PartitionSpec):
    """`legalize.layer_norm_decomposed` with its intermediates pinned: the x-shaped ones to the layout
    the op computes in, the statistics to it with the normalized dims whole (the all-reduce of partial
    sums the norm rule prices where the hidden dim is split)."""
    import torch_xla.distributed.spmd as xs

    from wancompile.legalize import layer_norm_decomposed

    k = len(normalized_shape)
    stat = tuple(spec[:-k]) + (None,) * k

    def mark(t: torch.Tensor, is_stat: bool) -> None:
        xs.mark_sharding(t, _MESHES[mesh_key], stat if is_stat else spec)

    return layer_norm_decomposed(x, normalized_shape, weight, bias, eps, mark=mark)


def _halo_conv(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *, conv: str, mesh_key: str, spec):
    """`wancompile.halo.halo_conv` on this lowering's mesh: a spatially split conv with its halo in the program."""
    import torch_xla.distributed.spmd as xs

    from wancompile.halo import halo_conv

    mesh = _MESHES[mesh_key]
    sizes = dict(zip(mesh.axis_names, (int(n) for n in mesh.mesh_shape)))
    return halo_conv(
        getattr(torch, conv),
        x,
        weight,
        bias,
        stride,
        padding,
        dilation,
        groups,
        spec=spec,
        sizes=sizes,
        mark=lambda t, sp: xs.mark_sharding(t, mesh, sp),
    )


def _halo_specs(node: fx.Node, conv: str, spec: PartitionSpec, mesh: Any) -> set:
    """The layouts `_halo_conv` pins for `node`, from a dry run on meta tensors of dynamo's shapes."""
    from wancompile.halo import halo_conv

    def meta(a):
        v = a.meta.get("example_value", a.meta.get("val")) if isinstance(a, fx.Node) else a
        return torch.empty(tuple(v.shape), dtype=v.dtype, device="meta") if isinstance(v, torch.Tensor) else v

    args, kwargs = fx.node.map_arg((node.args, node.kwargs), meta)
    kwargs = {k: v for k, v in kwargs.items() if k not in ("conv", "mesh_key", "spec")}
    seen: set = set()
    sizes = dict(zip(mesh.axis_names, (int(n) for n in mesh.mesh_shape)))
    halo_conv(getattr(torch, conv), *args, **kwargs, spec=spec, sizes=sizes, mark=lambda t, sp: seen.add(tuple(sp)))
    return seen


# Convolutions a target without partitioner halos (`planner.targets.Target.spatial_halo`) gets with the
# halo written out, when the plan splits their output spatially (`wancompile.halo`).
_HALO_CONVS = {torch.conv2d: "conv2d", torch.conv3d: "conv3d", F.conv2d: "conv2d", F.conv3d: "conv3d"}


def _pinned_decompositions() -> dict:
    """Ops whose torch_xla lowering is several HLO ops, written out with pinned intermediates when the
    plan is pinned (planner.pins): the first constraint on such an op is the layout it computes in."""
    return {layer_norm_decomposed: _pinned_layer_norm}


def _surviving(graph: Graph, fx_nodes: dict, name: str) -> fx.Node:
    """The lowered graph's node for `name`; a device-only move `legalize` dropped stands for its input."""
    while name not in fx_nodes and graph[name].op == "to" and graph[name].inputs:
        name = graph[name].inputs[0]
    return fx_nodes[name]


def _surviving_readers(graph: Graph, fx_nodes: dict, name: str) -> list[fx.Node]:
    """The lowered graph's readers standing for reader `name`: itself, or, for a dropped device-only
    move (VACE's ``control_hint.to(hidden_states.device)``), the ops that read the move."""
    if name in fx_nodes or graph[name].op != "to":
        return [fx_nodes[name]]
    return [r for u in graph.users(name) for r in _surviving_readers(graph, fx_nodes, u.name)]


def insert_constraints(gm: fx.GraphModule, graph: Graph, plan: Plan, mesh: Any) -> fx.GraphModule:
    """Return a copy of `gm` with a sharding-constraint call after every constrained op (in plan
    order where one op has several) and, for constraints on an op's input, a constrained copy of
    that input before its first reader (readers of one value with one spec share the copy). The
    layouts ops written out with pinned intermediates add (`_halo_conv`) are in its
    ``meta["pinned_specs"]``."""
    gm = fx.GraphModule(gm, gm.graph.__deepcopy__())  # leave dynamo's graph untouched
    by_location = graph.by_location()
    fx_nodes = {n.name: n for n in gm.graph.nodes}
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    key = _mesh_key(mesh)
    last: dict[fx.Node, fx.Node] = {}  # op -> its last constraint call so far
    pinned = _pinned_decompositions()
    halos = {} if get_target(plan.target).spatial_halo else _HALO_CONVS
    specs: set = set()
    weight_reads: set = set()
    copies: dict[tuple[fx.Node, tuple], list[fx.Node]] = {}  # (value, spec) -> readers
    for c in plan.activations:
        node = by_location.get(c.location)
        if node is None:
            raise PlanError(f"plan constrains {c.location}, which this graph does not have; re-plan for this model")
        if c.input is not None:
            value = _surviving(graph, fx_nodes, graph[node.inputs[c.input]].name)
            copies.setdefault((value, tuple(c.spec)), []).extend(_surviving_readers(graph, fx_nodes, node.name))
            if c.reason == READ_PIN_REASON:
                weight_reads.add((value, tuple(c.spec)))
            continue
        target = _surviving(graph, fx_nodes, node.name)
        if target.op == "call_function" and target.target in pinned and target not in last and c.reason in PIN_REASONS:
            target.target = pinned[target.target]
            target.kwargs = {**target.kwargs, "mesh_key": key, "spec": tuple(c.spec)}
        elif target.op == "call_function" and target.target in halos and target not in last and c.output == 0:
            conv = halos[target.target]
            specs |= _halo_specs(target, conv, tuple(c.spec), mesh)
            target.target = _halo_conv
            target.kwargs = {**target.kwargs, "conv": conv, "mesh_key": key, "spec": tuple(c.spec)}
        anchor = last.get(target, target)
        while anchor.next.op == "placeholder":  # keep placeholders first
            anchor = anchor.next
        with gm.graph.inserting_after(anchor):
            last[target] = gm.graph.call_function(_constrain, (target, key, tuple(c.spec), c.output))
    for (value, spec), readers in copies.items():
        with gm.graph.inserting_before(min(readers, key=order.__getitem__)):
            fn = _weight_read if (value, spec) in weight_reads else _constrained_copy
            copy = gm.graph.call_function(fn, (value, key, spec))
        for r in readers:
            r.replace_input_with(value, copy)
    gm.graph.lint()
    gm.recompile()
    gm.meta["pinned_specs"] = specs
    return gm


class ParamCache:
    """Parameters as the program reads them, prepared once per tensor version: an XLA copy of a host
    parameter (made and sharded on first use), or an XLA parameter checked to carry a sharding. Keyed
    by identity and ``_version``, so a per-call hit is a dict lookup (a 40-block DiT has ~1,000)."""

    def __init__(self) -> None:
        # id -> (weak ref to the caller's tensor, its version, the XLA copy or None for "use it as is")
        self._copies: dict[int, tuple[weakref.ref, int, Optional[torch.Tensor]]] = {}

    def get(self, t: torch.Tensor, prepare: Callable[[torch.Tensor], Optional[torch.Tensor]]) -> torch.Tensor:
        hit = self._copies.get(id(t))
        if hit is not None and hit[0]() is t and hit[1] == t._version:
            return t if hit[2] is None else hit[2]
        x = prepare(t)
        self._copies[id(t)] = (weakref.ref(t), t._version, None if x is t else x)
        return x


_TENSOR = object()  # marks a tensor output leaf in `Replay.leaves`


def _host_reads() -> int:
    """Device-to-host transfers so far in this process (torch_xla's metric)."""
    import torch_xla.debug.metrics as met

    data = met.metric_data("TransferFromDeviceTime")
    return data[0] if data else 0


class Replay:
    """One traced and compiled program, replayed by graph hash.

    `trace` runs `fn` once on `args` (XLA tensors holding device data, or Python values), compiles
    the graph rooted at its tensor outputs and runs it; afterwards ``replay(args)`` runs the cached
    computation on new arguments of the same signature. ``sources[i]`` is the argument position of
    the computation's i-th input, or None for a constant of the trace (kept in ``constants``)."""

    def __init__(
        self,
        graph_hash: Any,
        sources: list[Optional[int]],
        constants: list[Optional[torch.Tensor]],
        leaves: list[Any],
        treespec: Any,
    ) -> None:
        self.graph_hash, self.sources, self.constants = graph_hash, sources, constants
        self.leaves, self.treespec = leaves, treespec  # output leaves, _TENSOR where a tensor goes
        self.runs = 0

    @classmethod
    def trace(
        cls,
        fn: Callable,
        args: Sequence[Any],
        device: torch.device,
        refuse: str = "",
        sink: Optional[Callable[[list[torch.Tensor]], None]] = None,
    ) -> tuple[Optional["Replay"], Any, str, list[int]]:
        """(replay or None, this call's output, why not replayable or "", positions of the arguments
        the graph wrote into); `refuse`: a reason known beforehand not to replay; `sink`: handed the
        traced output tensors before anything is compiled (`wancompile.tt.export`)."""
        import torch.utils._pytree as pytree
        import torch_xla

        C = torch_xla._XLAC
        tensor_args = [(i, a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        if any(C._check_tensor_need_materialization([a for _, a in tensor_args])):
            C._xla_sync_multi([a for _, a in tensor_args], devices=[], wait=True, sync_xla_data=True)
        arg_of = {C._xla_get_tensor_id(a): i for i, a in tensor_args}
        host_reads = _host_reads()
        out = fn(*args)
        host_reads = _host_reads() - host_reads
        leaves, treespec = pytree.tree_flatten(out)
        outs = [t for t in leaves if isinstance(t, torch.Tensor)]
        if sink is not None:
            sink(outs)
        written = C._check_tensor_need_materialization([a for _, a in tensor_args])
        mutated = [i for (i, _), w in zip(tensor_args, written) if w]
        why = (
            refuse
            or (mutated and "the graph writes into one of its inputs")
            or (host_reads and "the graph copies a device value to the host mid-program (a replay would freeze it)")
            or (
                not all(C._check_tensor_need_materialization(outs))
                and "the graph returns an input (or a constant) unchanged"
            )
            or ""
        )
        if why:
            torch_xla.sync()
            return None, out, why, mutated
        ids, values = C._get_tensors_xla_device_data_node(outs)
        if C._get_seed_info_id() in ids:
            torch_xla.sync()
            return None, out, "the graph draws random numbers (its seed must advance per call)", []
        sources = [arg_of.get(i) for i in ids]
        constants = [None if src is not None else v for src, v in zip(sources, values)]
        graph_hash = C._get_graph_hash(outs)
        C._xla_warm_up_cache(outs, [])
        C._clear_pending_irs(str(device))
        replay = cls(
            graph_hash, sources, constants, [_TENSOR if isinstance(t, torch.Tensor) else t for t in leaves], treespec
        )
        return replay, replay(args), "", []

    def __call__(self, args: Sequence[Any]) -> Any:
        import torch.utils._pytree as pytree
        import torch_xla

        inputs = [args[src] if src is not None else const for src, const in zip(self.sources, self.constants)]
        results = iter(torch_xla._XLAC._run_cached_graph(self.graph_hash, inputs))
        self.runs += 1
        return pytree.tree_unflatten(
            [next(results) if leaf is _TENSOR else leaf for leaf in self.leaves], self.treespec
        )


class ShardedProgram:
    """A captured graph lowered under a plan: call it with the graph's inputs (host or XLA).

    Parameter-only subgraphs (e.g. the ``qkv`` rewrite's weight packing) are constant-folded
    (`wancompile.fold`): computed on the device once per parameter version, then read by the main
    program as extra inputs. ``fold=False`` (or ``ShardedProgram.fold_parameters = False``) keeps them
    in-graph."""

    fold_parameters = True
    # Called as sink(program, output tensors) when the main ("main") or fold ("fold") program traces,
    # before XLA compiles it: `wancompile.tt.export.ShardyExport` writes the program for tt-mlir.
    stablehlo_sink: Optional[Callable[[str, list], None]] = None

    def __init__(
        self,
        gm: fx.GraphModule,
        graph: Graph,
        plan: Plan,
        mesh: Any,
        *,
        legalize_ops: bool = True,
        fold: Optional[bool] = None,
    ) -> None:
        import torch_xla

        from wancompile.fold import FoldedValues, moves_to_host, split_parameter_subgraphs

        self.graph, self.plan, self.mesh, self.source = graph, plan, mesh, gm
        self.hlo_path = self.fold_hlo_path = None
        self.device = torch_xla.device()
        legal = place_factories(legalize(gm)[0] if legalize_ops else gm, self.device)[0]
        self.lowered = insert_constraints(legal, graph, plan, mesh)
        # every layout the program marks: the plan's, and those of ops written out with pinned intermediates
        self.specs = frozenset(
            {tuple(s) for s in plan.params.values()}
            | {tuple(a.spec) for a in plan.activations}
            | self.lowered.meta["pinned_specs"]
        )
        placeholders = [n for n in graph if n.op == "placeholder"]
        self._params = [n.param for n in placeholders]
        self._input_specs = self._placeholder_specs(placeholders)
        self._cache = ParamCache()
        self._preparers = [self._preparer(spec) for spec in self._input_specs]
        self._inputs = [i for i, param in enumerate(self._params) if param is None]
        self._replays: dict[tuple, Replay] = {}
        self.traces = 0  # how many times the FX graph was traced (once per input signature when replayed)
        self.not_replayed: Optional[str] = None  # why the last trace could not be replayed
        self.fold = None  # FoldedValues, when the graph has parameter-only subgraphs
        split = (
            split_parameter_subgraphs(self.lowered, self._params)
            if (self.fold_parameters if fold is None else fold)
            else None
        )
        if split is not None:
            self.fold = FoldedValues(split)
            self.lowered = split.main
        moves = [n.name for n in self.lowered.graph.nodes if moves_to_host(n)]
        self._host_moves = (
            (f"the graph copies values to the host mid-program ({', '.join(moves)}): a replay would freeze them")
            if moves
            else None
        )
        # per argument of the lowered program: its parameter name, None for inputs (folded values are
        # functions of parameters)
        self._signature_params = self._params + (["<folded>"] * len(self.fold.split.folded) if self.fold else [])

    def _placeholder_specs(self, placeholders) -> list[Optional[PartitionSpec]]:
        """Sharding for each placeholder: the plan's parameter spec, or an activation constraint
        placed on an input placeholder."""
        on_inputs = {c.location: c.spec for c in self.plan.activations}
        return [self.plan.params.get(n.param) if n.param else on_inputs.get(n.location) for n in placeholders]

    def _mark(self, spec: Optional[PartitionSpec]) -> Callable[[torch.Tensor], None]:
        import torch_xla.distributed.spmd as xs

        def mark(x: torch.Tensor) -> None:
            if spec is not None and any(e is not None for e in spec):
                xs.mark_sharding(x, self.mesh, spec)

        return mark

    def to_device(self, args: Sequence[Any], needed: Optional[Sequence[bool]] = None) -> list[Any]:
        """The arguments on the device, parameters sharded and cached; where `needed` is False the
        argument is left as it is (a parameter only the fold program reads is not kept on device)."""
        out = list(args)
        for i, a in enumerate(args):
            if not isinstance(a, torch.Tensor) or (needed is not None and not needed[i]):
                continue
            if self._params[i] is not None:
                out[i] = self._cache.get(a, self._preparers[i])
            else:
                out[i] = self._preparers[i](a)
        return out

    def _preparer(self, spec: Optional[PartitionSpec]) -> Callable[[torch.Tensor], torch.Tensor]:
        """Argument -> the XLA tensor the program reads: a host tensor copied and sharded as `spec`
        says, an XLA tensor given the sharding when it has none."""
        mark = self._mark(spec)

        def prepare(a: torch.Tensor) -> torch.Tensor:
            if a.device.type == "xla":
                if spec is not None:
                    self._ensure_sharded(a, spec)
                return a
            x = a.detach().to(self.device)
            mark(x)
            return x

        return prepare

    def _ensure_sharded(self, x: torch.Tensor, spec: PartitionSpec) -> None:
        import torch_xla

        if not torch_xla._XLAC._get_xla_sharding_spec(x):
            self._mark(spec)(x)

    def __call__(self, *args: Any) -> Any:
        from wancompile import hlo, runtime

        host = next(
            (
                args[i].device
                for i in self._inputs
                if isinstance(args[i], torch.Tensor) and args[i].device.type != "xla"
            ),
            None,
        )
        xla_args = self.program_args(args)
        signature = self._signature(xla_args)
        replay = self._replays.get(signature) if self._host_moves is None else None
        if replay is not None:
            out = replay(xla_args)
        else:
            dump = runtime.current_dump_dir() if self.hlo_path is None else None
            before = hlo.dump_state(dump) if dump else {}
            sink = self.stablehlo_sink
            replay, out, why, mutated = Replay.trace(
                self.lowered,
                xla_args,
                self.device,
                refuse=self._host_moves or "",
                sink=(lambda outs: sink("main", outs)) if sink is not None else None,
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
            if dump:
                key = self._program_key(xla_args)
                new = hlo.new_modules(dump, before)
                if new:
                    _HLO_BY_PROGRAM[key] = hlo.main_module(new)
                # No new dump: XLA reused an identical compiled program (same code, plan and shapes).
                self.hlo_path = _HLO_BY_PROGRAM.get(key)
        if host is None:
            return out
        return _to_host(out, host)

    def program_args(self, args: Sequence[Any]) -> list[Any]:
        """The lowered program's arguments for a call with the graph's inputs `args`: on the device,
        parameters sharded and cached, the fold program's values appended (it runs if they are stale).
        ``self.lowered(*program_args(args))`` traces the program without running it."""
        xla_args = self.to_device(args, self.fold.split.main_reads if self.fold else None)
        if self.fold is not None:
            xla_args = [a if keep else None for a, keep in zip(xla_args, self.fold.split.main_reads)]
            xla_args += self._folded(args, xla_args)
        return xla_args

    def _signature(self, xla_args: Sequence[Any]) -> tuple:
        """What a replay is specialised to beyond dynamo's own guards: the sizes of the inputs that are
        not parameters (they vary under ``dynamic=True``) and the values of non-tensor arguments."""
        return tuple(
            (tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a
            for a, param in zip(xla_args, self._signature_params)
            if param is None
        )

    def _folded(self, args: Sequence[Any], xla_args: Sequence[Any]) -> list[torch.Tensor]:
        """The fold program's values (cached per parameter version); its HLO is recorded apart."""
        from wancompile import hlo, runtime

        def device_arg(i: int) -> torch.Tensor:
            if xla_args[i] is not None:
                return xla_args[i]
            # Read only by the fold program: on the device (sharded) for the fold, not kept there.
            a, mark = args[i], self._mark(self._input_specs[i])
            if a.device.type == "xla":
                if self._input_specs[i] is not None:
                    self._ensure_sharded(a, self._input_specs[i])
                return a
            x = a.detach().to(self.device)
            mark(x)
            return x

        runs = self.fold.runs
        dump = runtime.current_dump_dir() if self.fold_hlo_path is None else None
        before = hlo.dump_state(dump) if dump else {}
        sink = self.stablehlo_sink
        values = self.fold.get(args, device_arg, sink=(lambda outs: sink("fold", outs)) if sink is not None else None)
        if dump and self.fold.runs > runs:
            # What the fold program's HLO depends on: its ops (constraints included, node names not),
            # its inputs' specs and shapes — not the rest of the plan, or a second plan with the same
            # packing (served by XLA's compile cache, so no new dump) would find no HLO.
            inputs = [(self._input_specs[i], tuple(args[i].shape), str(args[i].dtype)) for i in self.fold.split.sources]
            key = hashlib.sha1(
                (_structure(self.fold.split.fold) + repr(inputs) + json.dumps(self.plan.mesh.to_json())).encode()
            ).hexdigest()
            new = hlo.new_modules(dump, before)
            if new:
                _HLO_BY_PROGRAM[key] = hlo.main_module(new)
            self.fold_hlo_path = _HLO_BY_PROGRAM.get(key)
        return values

    def _program_key(self, args: Sequence[Any]) -> str:
        shapes = [(tuple(a.shape), str(a.dtype)) if isinstance(a, torch.Tensor) else repr(a) for a in args]
        plan = json.dumps(
            {
                "params": self.plan.to_json()["params"],
                "acts": self.plan.to_json()["activations"],
                "mesh": self.plan.mesh.to_json(),
            },
            sort_keys=True,
        )
        return hashlib.sha1((self.lowered.code + plan + repr(shapes)).encode()).hexdigest()

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
            self.source, self.graph, Plan(self.plan.model, self.plan.mesh, replicated_params(self.graph)), self.mesh
        )


def _structure(gm: fx.GraphModule) -> str:
    """The ops of `gm` and how they connect, without node names (equal for equal programs)."""
    index = {n: i for i, n in enumerate(gm.graph.nodes)}
    return repr(
        [
            (n.op, getattr(n.target, "__qualname__", str(n.target)), fx.node.map_arg((n.args, n.kwargs), index.get))
            for n in gm.graph.nodes
        ]
    )


def _to_host(out: Any, device: torch.device) -> Any:
    if isinstance(out, torch.Tensor):
        return out.to(device)
    if isinstance(out, (tuple, list)):
        return type(out)(_to_host(o, device) for o in out)
    return out
