"""RoPE without strided writes: the interleaved halves are stacked instead of scattered.

diffusers' Wan attention applies rotary embeddings by writing the two rotated halves into the even
and odd lanes of an empty tensor::

    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    ... out ...

The pass matches an ``empty_like`` whose first uses are exactly those two ``setitem``s (even lanes,
odd lanes, each of half the last dim) and emits::

    out = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).flatten(-2).to(x.dtype)

Exactly equal: lane 2i of the flattened stack is the even value i and lane 2i+1 the odd value i, and
the ``.to`` is the same rounding the write into ``out`` did (the tables are float64 in diffusers, so
the halves are float64 and ``out`` is x's dtype). The ``.to`` is left out when the dtypes agree.
No scatter (setitem on a strided slice) and no ``empty_like`` remain for the partitioner.

A hand matcher, not `rewrites._pattern`: the pattern is two in-place writes into a buffer, which no
dataflow path from the output reaches (``torch.fx.subgraph_rewriter`` rejects a pattern whose nodes
have no users), and it holds only if ``out`` is not read between the writes, an ordering condition.
"""

from __future__ import annotations

import operator
from functools import partial

import torch
import torch.fx as fx

from ._core import (
    Emitter,
    RewriteContext,
    RewriteReport,
    Skip,
    calls,
    module_path,
    replace,
    rewrite_each,
    shape,
    value,
)
from ._registry import Rewrite, register

EVEN = (Ellipsis, slice(0, None, 2))
ODD = (Ellipsis, slice(1, None, 2))


def rope_without_scatter(gm: fx.GraphModule, context: RewriteContext = RewriteContext()) -> RewriteReport:
    order = {node: i for i, node in enumerate(gm.graph.nodes)}

    def unscatter(out: fx.Node) -> None:
        _rewrite(gm.graph, out, *_writes(out, order), order)

    buffers = [
        n for n in gm.graph.nodes if calls(n, torch.empty_like) and any(calls(u, operator.setitem) for u in n.users)
    ]
    return rewrite_each(gm, "rope", ((module_path(n), partial(unscatter, n)) for n in buffers))


register(
    Rewrite(
        "rope",
        rope_without_scatter,
        "out = empty_like(x); out[..., 0::2] = a; out[..., 1::2] = b -> stack([a, b], -1).flatten(-2)",
        order=50,
    )
)


def _writes(out: fx.Node, order: dict) -> tuple[fx.Node, fx.Node]:
    """The even-lane and odd-lane setitem nodes, if they are the first two uses and fill ``out``."""
    users = sorted(out.users, key=order.__getitem__)
    writes = [u for u in users if calls(u, operator.setitem)]
    if len(writes) != 2 or users[:2] != writes:
        raise Skip(f"{out.name} is not written by exactly two setitems before it is read")
    even = [w for w in writes if _index(w) == EVEN]
    odd = [w for w in writes if _index(w) == ODD]
    if len(even) != 1 or len(odd) != 1:
        raise Skip(f"writes {[_index(w) for w in writes]} are not [..., 0::2] and [..., 1::2]")
    full = shape(out)
    if full[-1] % 2:
        raise Skip(f"last dim {full[-1]} is odd")
    half = full[:-1] + (full[-1] // 2,)
    for w in writes:
        written = w.args[2]
        if not isinstance(written, fx.Node) or shape(written) != half:
            raise Skip(f"{w.name} writes a value of shape {_shape_of(written)}, not {half}")
    return even[0], odd[0]


def _index(setitem: fx.Node):
    index = setitem.args[1]
    return tuple(index) if isinstance(index, (tuple, list)) else index


def _rewrite(graph: fx.Graph, out: fx.Node, even: fx.Node, odd: fx.Node, order: dict) -> None:
    last = max(even, odd, key=order.__getitem__)
    emit = Emitter(graph, last, out, after=True)
    halves = [even.args[2], odd.args[2]]
    lanes = emit.method("flatten", emit.call(torch.stack, halves, -1), -2, name="rotated")
    if value(lanes).dtype != value(out).dtype:
        lanes = emit.method("to", lanes, value(out).dtype)
    graph.erase_node(even)
    graph.erase_node(odd)
    replace(out, lanes)


def _shape_of(node) -> object:
    return shape(node) if isinstance(node, fx.Node) else type(node).__name__
