"""In-graph sharding constraints: where a plan's activation layouts enter the FX graph.

`insert_constraints` copies dynamo's graph and inserts, after every op the plan constrains, a plain
Python call of ``xs.mark_sharding`` (`constrain`), which torch_xla records as a sharding annotation on
that HLO value; a constraint on an op's input becomes a constrained copy before its first reader
(`weight_read` for the layout an op reads a weight in). Ops whose torch_xla lowering is several HLO ops
(LayerNorm) and, for targets without partitioner halos, spatially split convolutions are written out
with their intermediates pinned. This module owns those calls and the meshes they name; the constant
folder (`wancompile.fold`) recognises them by the public functions `constrain` and `weight_read`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F

from planner.graph import Graph
from planner.mesh import PartitionSpec
from planner.pins import PIN_REASONS, READ_PIN_REASON
from planner.plan import Plan, PlanError
from planner.targets import Target
from wancompile import composites, meshes
from wancompile.legalize import layer_norm_decomposed

# FX code can only embed literals, so in-graph constraint calls name their mesh by a key
# (`wancompile.meshes.mesh_key`); `insert_constraints` registers it. Read only here.
_MESHES: dict[str, Any] = {}


def _register(mesh: Any) -> str:
    key = meshes.mesh_key(mesh)
    _MESHES[key] = mesh
    return key


def constrain(value: Any, mesh_key: str, spec: PartitionSpec, output: int) -> None:
    """The in-graph constraint call: output `output` of `value` (an op's result) annotated with `spec`."""
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


def weight_read(value: torch.Tensor, mesh_key: str, spec: PartitionSpec) -> torch.Tensor:
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


def insert_constraints(
    gm: fx.GraphModule, graph: Graph, plan: Plan, mesh: Any, target: Target, fused: bool = True
) -> fx.GraphModule:
    """Return a copy of `gm` with a sharding-constraint call after every constrained op (in plan
    order where one op has several) and, for constraints on an op's input, a constrained copy of
    that input before its first reader (readers of one value with one spec share the copy). The
    layouts ops written out with pinned intermediates add (`_halo_conv`) are in its
    ``meta["pinned_specs"]``. Where the target runs fused kernels for composites (`Target.composites`) and
    `fused`, the calls it can run on a shard emit them in the exported program (`wancompile.composites`);
    every candidate and why it stayed decomposed is in ``meta["fused_sites"]``."""
    gm = fx.GraphModule(gm, gm.graph.__deepcopy__())  # leave dynamo's graph untouched
    by_location = graph.by_location()
    fx_nodes = {n.name: n for n in gm.graph.nodes}
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    key = _register(mesh)
    last: dict[fx.Node, fx.Node] = {}  # op -> its last constraint call so far
    pinned = _pinned_decompositions()
    target_composites = target.composites  # `target` is rebound to graph nodes below
    halos = {} if target.spatial_halo else _HALO_CONVS  # the program carries the halo where the target does not
    specs: set = set()
    weight_reads: set = set()
    copies: dict[tuple[fx.Node, tuple], list[fx.Node]] = {}  # (value, spec) -> readers
    computes_in: dict[fx.Node, tuple] = {}  # op -> the layout its first pin fixes (the layout it computes in)
    for c in plan.activations:
        node = by_location.get(c.location)
        if node is None:
            raise PlanError(f"plan constrains {c.location}, which this graph does not have; re-plan for this model")
        if c.input is not None:
            value = _surviving(graph, fx_nodes, graph[node.inputs[c.input]].name)
            copy_key = (value, tuple(c.spec), tuple(map(tuple, c.via)))
            copies.setdefault(copy_key, []).extend(_surviving_readers(graph, fx_nodes, node.name))
            if c.reason == READ_PIN_REASON:
                weight_reads.add(copy_key)
            continue
        target = _surviving(graph, fx_nodes, node.name)
        if target not in last and c.reason in PIN_REASONS and c.output == 0:
            computes_in[target] = tuple(c.spec)
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
        for spec in (*c.via, c.spec):  # through the layouts the target lowers, then the plan's
            with gm.graph.inserting_after(anchor):
                anchor = last[target] = gm.graph.call_function(constrain, (target, key, tuple(spec), c.output))
    for (value, spec, via), readers in copies.items():
        with gm.graph.inserting_before(min(readers, key=order.__getitem__)):
            fn = weight_read if (value, spec, via) in weight_reads else _constrained_copy
            copy = value
            for step in via:
                copy = gm.graph.call_function(_constrained_copy, (copy, key, step))
            copy = gm.graph.call_function(fn, (copy, key, spec))
        for r in readers:
            r.replace_input_with(value, copy)
    gm.graph.lint()
    gm.recompile()
    gm.meta["pinned_specs"] = specs
    gm.meta["fused_sites"] = composites.mark_sites(gm, computes_in, pinned) if fused and target_composites else ()
    return gm
