"""Padded heads: which attentions may be padded, to how many heads, and what the copies weigh.

An attention whose H heads some head split of the mesh does not divide (12 heads, 8 devices) is
offered head-TP and Ulysses on H' zero-padded heads too (``+pad(H->H')`` options beside SP and
replicated; `planner.autoplan` prices them on the padded graph). H' is the next multiple of the lcm
of every split the mesh offers (the sizes of its axis sets), so every head split of the padded
attention divides. The planner never edits graphs: the caller hands `plan_graph` a ``pad_heads``
function that returns the planner graph of the model with the named attentions padded
(rewrites/pad_heads.py through capture; `wancompile.backend.padder`), which the planner prices an
option on and assembles a plan that chose one on.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping

from planner.graph import Graph
from planner.macros import Macro
from planner.mesh import MeshSpec
from planner.packing import is_padded
from planner.placements import shard_count
from planner.plan import HeadPadding
from planner.pricing import local_bytes
from planner.strategies import Strategy, axis_sets

# {block-generic module: padded heads} -> padded graph; raises PlanError where the rewrite cannot pad
# one as asked (the check a plan that names the padding meets in the backend; the option is then excluded)
PadHeads = Callable[[Mapping[str, int]], Graph]


def pad_targets(graph: Graph, macros: tuple[Macro, ...], mesh: MeshSpec, exclude=()) -> dict[str, HeadPadding]:
    """Block attention macro name -> its padding, for those whose heads some split does not divide."""
    axes = tuple(a for a in mesh.axis_names if mesh.axis_size(a) > 1 and a not in exclude)
    sizes = [shard_count(mesh, s) for s in axis_sets(axes) if s]
    if not sizes:
        return {}
    unit = math.lcm(*sizes)
    out = {}
    for m in macros:
        if m.kind == "attention" and m.in_block and m.width % unit:
            module = graph.in_block(graph[m.sdpa], m.module, "*")
            out[m.name] = HeadPadding(module, m.width, -(-m.width // unit) * unit)
    return out


def needs_padding(mesh: MeshSpec, heads: int, s: Strategy) -> bool:
    """Whether option `s` splits the heads in a way `heads` does not divide (head-TP, Ulysses)."""
    split = s.tp + (s.sigma if s.ulysses else ())
    return bool(split) and heads % shard_count(mesh, split) != 0


def padded_copy_bytes(graph: Graph, macro: Macro, s: Strategy, mesh: MeshSpec, values) -> float:
    """Per-device bytes of the padded weights `s` lays out (the fold program's outputs, resident
    beside the parameters they are made from)."""
    return sum(
        local_bytes(graph[p.node].out, s.params.get(p.node), mesh, values) for p in macro.packed if is_padded(graph, p)
    )
