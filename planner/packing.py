"""Packed operands: a linear's weight or bias computed in-graph from parameters alone.

The ``qkv`` rewrite (rewrites/qkv.py) gives a fused projection the weight
``cat([w_q.unflatten(0, (H, d)), w_k..., w_v...], 1).flatten(0, 1)``: rows head-interleaved,
computed from parameters only. Such parameter-only subgraphs never run per call: the lowering
constant-folds them (wancompile/fold.py) into a program of their own, run once per parameter
version, whose outputs the main program reads as inputs. So the planner treats the **packed value
as the parameter the main program reads**: a strategy lays out the packed weight like any weight
(dim 0 over TP, FSDP axes on dim 1), the macro's evaluation takes that layout as a boundary value
(the packing ops cost nothing per call and are not in the prediction), and the plan

* gives each source parameter the same layout as the packed value, and
* constrains the packed value to its layout (an activation constraint at the packing's last op,
  which the fold program applies to its output, so the main program reads exactly that sharding).

Why this is exact rather than propagating the main program through the packing: the packing is not
in the main program at all, so the main program's collectives are those of a linear with a sharded
weight input, which the rules already predict; and the fold program is comm-free by construction,
because `source_layouts` only accepts a layout when the op rules carry the sources' layout through
every packing op to the packed layout with no redistribution. For the head-interleaved packing
that holds whenever dim 0's split divides the heads (each device packs its own whole q/k/v heads);
a packing that mixes rows across devices (a plain ``cat(dim=0)`` split over TP) is refused with
the reason, and the strategy is excluded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from planner.graph import Graph
from planner.mesh import MeshSpec
from planner.placements import Layout
from planner.rules import OpView, rule_for


@dataclass(frozen=True)
class Packed:
    node: str  # the value the linear reads (the packing's last op)
    sources: tuple[str, ...]  # the parameter placeholders it is computed from, graph order
    nodes: tuple[str, ...]  # the parameter-only ops computing it, graph order (`node` last)


def packed_operand(graph: Graph, name: str) -> Optional[Packed]:
    """The packing behind value `name`, or None when it is a parameter itself or reads any
    non-parameter value (then it is an activation, planned as one)."""
    node = graph[name]
    if node.is_param or node.op == "placeholder":
        return None
    ops: dict[str, None] = {}
    sources: dict[str, None] = {}
    todo = [name]
    while todo:
        x = graph[todo.pop()]
        if x.is_param:
            sources[x.name] = None
            continue
        if x.op == "placeholder" or not x.inputs or not x.outputs:
            return None
        ops[x.name] = None
        todo.extend(x.inputs)
    order = {n.name: i for i, n in enumerate(graph)}
    return Packed(name, tuple(sorted(sources, key=order.__getitem__)), tuple(sorted(ops, key=order.__getitem__)))


def source_layouts(graph: Graph, packed: Packed, layout: Layout, mesh: MeshSpec) -> tuple[dict[str, Layout], str]:
    """({source: layout}, "") giving every source the packed value's `layout` when the op rules
    carry it through the packing to exactly `layout` with no redistribution; else ({}, why not)."""
    if (
        not layout.axes and not layout.partial
    ):  # a replicated value packs from replicated sources, whatever their shapes
        return {s: Layout.replicated(len(graph[s].out.shape)) for s in packed.sources}, ""
    lays: dict[str, Layout] = {}
    for s in packed.sources:
        if len(graph[s].out.shape) != layout.ndim:
            return (
                {},
                f"{graph[s].param} has {len(graph[s].out.shape)} dims, the packed {graph[packed.node].location} {layout.ndim}",
            )
        lays[s] = layout
    have = dict(lays)
    for name in packed.nodes:
        node = graph[name]
        ins = [have.get(i) for i in node.inputs]
        fn, known = rule_for(node.op)
        res = fn(OpView(node, ins, [graph[i].out for i in node.inputs], mesh))
        moved = [i for i, (a, b) in enumerate(zip(ins, res.required)) if b is not None and a is not None and a != b]
        if not known or moved or res.comm:
            return {}, (
                f"packing {node.location} ({node.op}) cannot keep the sources' layout {layout} per device "
                "(its rows would move between devices)"
            )
        have[name] = res.outputs[0]
    if have[packed.node] != layout:
        return {}, f"packing gives {have[packed.node]}, not {layout}, at {graph[packed.node].location}"
    return lays, ""


def is_padded(graph: Graph, packed: Packed) -> bool:
    """Whether the packing zero-pads its sources (the ``pad_heads`` rewrite, rewrites/pad_heads.py):
    then the packed value is larger than its sources and a separate copy on the device."""
    return any(graph[x].op == "pad" for x in packed.nodes)


def padded_source_layouts(graph: Graph, packed: Packed, layout: Layout) -> dict[str, Layout]:
    """Sources of a padding packing laid out like the packed value on the dims the packing keeps
    (same size) and whole on the dims it pads: each device pads the whole dim and keeps its slice,
    so the fold program moves nothing (a split of the padded dim would shift rows between devices:
    12 heads' rows split 8 ways are not the first 12 of 16 heads' rows split 8 ways)."""
    out = graph[packed.node].out.shape
    lays = {}
    for s in packed.sources:
        shape = graph[s].out.shape
        if len(shape) != layout.ndim:
            lays[s] = Layout.replicated(len(shape))
        else:
            lays[s] = Layout(tuple(axes if a == b else () for a, b, axes in zip(shape, out, layout.dims)))
    return lays
