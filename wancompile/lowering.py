"""Lowering a `Plan` to torch_xla SPMD: parameter shardings + in-graph activation constraints.

What the partitioner sees (DESIGN.md §4): parameters get ``xs.mark_sharding`` on their XLA tensors
before the first trace (they become the computation's input shardings); each activation constraint
becomes a plain Python call of ``xs.mark_sharding`` inserted into the FX graph right after the op at
the plan's `Location`, which torch_xla records as a sharding annotation on that HLO value. The
graph then runs on XLA tensors under lazy tracing: each call traces the FX graph (Python cost
only; ~10 µs per op) and torch_xla reuses the compiled computation cached under the trace's hash.

Why not torch_xla's dynamo bridge (the ``openxla_eval`` backend), which traces once and replays:
with SPMD and an in-graph constraint that actually reshards (the block-stack SP entry, the K/V
gather), torch_xla 2.9's bridge fails on its first replay with "Trying to access XLA data for tensor
... while an async operation is in flight: UNKNOWN_SCALAR[]" (tests/test_lowering.py pins this);
constraints that do not reshard and parameter shardings work there. The ``openxla`` AOT path
rejects in-graph annotations altogether (DESIGN.md §4).

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

from planner.graph import Graph
from planner.mesh import MeshSpec, PartitionSpec
from planner.plan import Plan, PlanError, replicated_params
from wancompile.legalize import legalize


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


def insert_constraints(gm: fx.GraphModule, graph: Graph, plan: Plan, mesh: Any) -> fx.GraphModule:
    """Return a copy of `gm` with a sharding-constraint call after every constrained op."""
    gm = fx.GraphModule(gm, gm.graph.__deepcopy__())  # leave dynamo's graph untouched
    by_location = graph.by_location()
    fx_nodes = {n.name: n for n in gm.graph.nodes}
    key = _mesh_key(mesh)
    for c in plan.activations:
        node = by_location.get(c.location)
        if node is None:
            raise PlanError(f"plan constrains {c.location}, which this graph does not have; re-plan for this model")
        target = fx_nodes[node.name]
        anchor = target
        while anchor.next.op == "placeholder":  # keep placeholders first
            anchor = anchor.next
        with gm.graph.inserting_after(anchor):
            gm.graph.call_function(_constrain, (target, key, tuple(c.spec), c.output))
    gm.graph.lint()
    gm.recompile()
    return gm


class ParamCache:
    """XLA copies of host parameters, made (and sharded) once per tensor version."""

    def __init__(self) -> None:
        self._copies: dict[int, tuple[weakref.ref, int, torch.Tensor]] = {}

    def get(self, t: torch.Tensor, device: torch.device, shard: Callable[[torch.Tensor], None]) -> torch.Tensor:
        key = id(t)
        hit = self._copies.get(key)
        if hit is not None and hit[0]() is t and hit[1] == t._version:
            return hit[2]
        x = t.detach().to(device)
        shard(x)
        self._copies[key] = (weakref.ref(t), t._version, x)
        return x


class ShardedProgram:
    """A captured graph lowered under a plan: call it with the graph's inputs (host or XLA).

    Parameter-only subgraphs (e.g. the ``qkv`` rewrite's weight packing) are constant-folded
    (`wancompile.fold`): computed on the device once per parameter version, then read by the main
    program as extra inputs. ``fold=False`` (or ``ShardedProgram.fold_parameters = False``) keeps them
    in-graph."""

    fold_parameters = True

    def __init__(self, gm: fx.GraphModule, graph: Graph, plan: Plan, mesh: Any, *, legalize_ops: bool = True,
                 fold: Optional[bool] = None) -> None:
        import torch_xla

        from wancompile.fold import FoldedValues, split_parameter_subgraphs

        self.graph, self.plan, self.mesh, self.source = graph, plan, mesh, gm
        self.hlo_path = self.fold_hlo_path = None
        self.device = torch_xla.device()
        self.lowered = insert_constraints(legalize(gm)[0] if legalize_ops else gm, graph, plan, mesh)
        placeholders = [n for n in graph if n.op == "placeholder"]
        self._params = [n.param for n in placeholders]
        self._input_specs = self._placeholder_specs(placeholders)
        self._cache = ParamCache()
        self.fold = None  # FoldedValues, when the graph has parameter-only subgraphs
        split = split_parameter_subgraphs(self.lowered, self._params) if (self.fold_parameters if fold is None else fold) else None
        if split is not None:
            self.fold = FoldedValues(split)
            self.lowered = split.main

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
        out = []
        for i, (a, param, spec) in enumerate(zip(args, self._params, self._input_specs)):
            if not isinstance(a, torch.Tensor) or (needed is not None and not needed[i]):
                out.append(a)
            elif a.device.type == "xla":
                if param is not None and spec is not None:
                    self._ensure_sharded(a, spec)
                out.append(a)
            elif param is not None:
                out.append(self._cache.get(a, self.device, self._mark(spec)))
            else:
                x = a.detach().to(self.device)
                self._mark(spec)(x)
                out.append(x)
        return out

    def _ensure_sharded(self, x: torch.Tensor, spec: PartitionSpec) -> None:
        import torch_xla

        if not torch_xla._XLAC._get_xla_sharding_spec(x):
            self._mark(spec)(x)

    def __call__(self, *args: Any) -> Any:
        import torch_xla

        from wancompile import hlo, runtime

        host = next((a.device for a in args if isinstance(a, torch.Tensor) and a.device.type != "xla"), None)
        xla_args = self.to_device(args, self.fold.split.main_reads if self.fold else None)
        if self.fold is not None:
            xla_args = [a if keep else None for a, keep in zip(xla_args, self.fold.split.main_reads)]
            xla_args += self._folded(args, xla_args)
        dump = runtime.current_dump_dir() if self.hlo_path is None else None
        before = hlo.dump_state(dump) if dump else {}
        out = self.lowered(*xla_args)
        torch_xla.sync()
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
        values = self.fold.get(args, device_arg)
        if dump and self.fold.runs > runs:
            key = hashlib.sha1((self.fold.split.fold.code + self._program_key(values)).encode()).hexdigest()
            new = hlo.new_modules(dump, before)
            if new:
                _HLO_BY_PROGRAM[key] = hlo.main_module(new)
            self.fold_hlo_path = _HLO_BY_PROGRAM.get(key)
        return values

    def _program_key(self, args: Sequence[Any]) -> str:
        shapes = [(tuple(a.shape), str(a.dtype)) if isinstance(a, torch.Tensor) else repr(a) for a in args]
        plan = json.dumps({"params": self.plan.to_json()["params"], "acts": self.plan.to_json()["activations"],
                           "mesh": self.plan.mesh.to_json()}, sort_keys=True)
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
        return ShardedProgram(self.source, self.graph, Plan(self.plan.model, self.plan.mesh, replicated_params(self.graph)), self.mesh)


def _to_host(out: Any, device: torch.device) -> Any:
    if isinstance(out, torch.Tensor):
        return out.to(device)
    if isinstance(out, (tuple, list)):
        return type(out)(_to_host(o, device) for o in out)
    return out
