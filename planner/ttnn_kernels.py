"""The TTNN kernels a DiT block runs per call under tt-mlir: the planner graph's ops counted as tt-mlir lowers them.

`block_kernels` counts, for the representative block of a plan, the kernels its compiled TTNN program launches
each call (`Kernels`, by class); `Kernels.of_ttnn` classes a compiled block's TTNN op histogram the same way
(`wancompile.tt.parts.by_part`), so the two are compared class by class. Measured on tt-mlir 0.1.3
(jax-tt-plugin), ``optimization_level`` 1, parameters handed over as parameters, bf16 (docs/tenstorrent.md,
"Kernels per block"):

=====================================  ========================================================================
planner op                             TTNN kernels per call
=====================================  ========================================================================
computed from parameters alone         none: tt-mlir computes it once (const-eval), the call loads the result
attention, gelu                        one fused kernel; a head dim under a tile (32) pads q, k, v and
                                       slices the output (``pad`` x3, ``slice_static``), a whole tile's
                                       output heads are joined (``concatenate_heads``)
layer_norm, normalized dim whole       one fused ``layer_norm``
layer_norm, normalized dim split       decomposed around the all-reduces of its two sums: eight elementwise
                                       kernels (and the affine weight's and bias's), the statistics
                                       reshaped back (``reshape`` x2)
rms_norm, normalized dim whole         one fused ``rms_norm``
rms_norm, normalized dim split         decomposed around the all-reduce of its sums: ``typecast`` to f32,
                                       ``pow``, ``sum``, mean, ``+ eps`` (rsqrt folded), two ``multiply``; a
                                       ``reshape`` of the sums back
linear                                 one ``linear`` (``matmul`` when its output is reduced, the bias then
                                       one ``add`` after the reduction); its input and output are 2-D
elementwise                            one kernel each (no fusion of elementwise chains at level 1)
cast to another dtype                  one ``typecast``, free where an elementwise op makes the value (it
                                       writes the new dtype itself)
dropout, clone, same-dtype casts       none
tuple pick (chunk, unbind)             one ``slice_static``
sp_pad's K/V cut (``padded_keys``      one ``slice_static`` each, K and V: the permute into the attention
"slice")                               stays absorbed; no mask (a key mask, the ``"mask"`` form, is repeated
                                       to L_q x L_k once per call, beside the prologue)
a chain of views                       one ``reshape`` where the shape a consumer reads differs from the
                                       shape its producer wrote (a linear reads and writes 2-D); a permute
                                       into or out of an attention is absorbed, any other a ``permute``
                                       (with a ``reshape`` before it where it reads a view of another
                                       shape; both one ``reshape`` where on a chip it moves only dims of
                                       size 1)
cat, stack                             one ``concat``; on the last dim (RoPE's interleave) each operand and
                                       the result also change layout (``to_layout``)
x * cos + cat([-x2, x1]) * sin         one fused ``rotary_embedding`` (the `rope` rewrite's form for tt-mlir,
                                       on [B, heads, tokens, D]): its halves, negation, concat and
                                       products are absorbed; a chip's tokens short of whole tiles are
                                       cut back after it (``slice_static``)
a reorder of the last dim's pairs      ``reshape``, ``permute``, ``reshape`` (unflatten, a rank-5 permute
                                       swapping the last two dims, flatten); a [B, S, H, D] <-> [B, H, S, D]
                                       transpose that the permute into an attention undoes: none
a collective (the plan's, lowered)     its TTNN ops (`planner.targets.Target.lower`); a reduction of a tensor
                                       of rank other than 4 is reshaped to 4-D and back (``reshape`` x2); a
                                       weight gathered per use is first tiled (``to_layout``); an all-to-all's
                                       ``point_to_point`` transfers slice and ``assign`` each chunk
a local slice of a value made per call one ``mesh_partition`` per mesh axis added, and ``to_layout`` to
                                       row-major and back (TI2V's per-token modulation under SP)
=====================================  ========================================================================

Blocks that share their decisions are counted once (`plan_kernels`); the text's K/V projections run beside the
prologue (`per_call`). What it does not model: which typecasts and reshapes tt-mlir folds into a neighbour (the
residue: two typecasts and up to seven moves a block on the tiny DiTs).

Why one module of ~500 lines: the table above is the whole model, read against one compiled histogram; the rules,
the choice of what runs in the block (`per_call`: a rule's count depends on it, as a split RMSNorm's does) and the
moves around the plan's collectives share one context (`_Ctx`) and change together when tt-mlir does.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Mapping, Optional

from planner.collective import Collective
from planner.graph import TUPLE_OPS, Graph, Node
from planner.mesh import MeshSpec
from planner.placements import Layout, as_number, local_shape, numel
from planner.plan import Plan

TILE = 32  # TTNN's tile edge: the last two dims of a tiled tensor are padded to it

# the compiled side: TTNN op -> class (any other TTNN op is elementwise)
_TTNN_CLASS = {
    "scaled_dot_product_attention": "fused",
    "layer_norm": "fused",
    "rms_norm": "fused",
    "gelu": "fused",
    "softmax": "fused",
    "rotary_embedding": "fused",
    "linear": "matmul",
    "matmul": "matmul",
    "typecast": "typecast",
    "reshape": "move",
    "permute": "move",
    "transpose": "move",
    "to_layout": "move",
    "slice_static": "move",
    "concat": "move",
    "pad": "move",
    "repeat": "move",
    "mesh_partition": "move",
    "concatenate_heads": "move",
    "all_gather": "collective",
    "all_reduce": "collective",
    "reduce_scatter": "collective",
    "point_to_point": "collective",
    "all_to_all": "collective",
    "assign": "move",
}
_NOT_KERNELS = ("ttnn.deallocate", "ttcore.load_cached")  # freeing a buffer, loading a const-eval result


CLASSES = ("fused", "matmul", "eltwise", "typecast", "move", "collective")


@dataclass(frozen=True)
class Kernels:
    """Kernels per call, by class, and the bytes per chip the data-movement kernels read."""

    fused: int = 0  # attention, norms, GELU as one kernel each
    matmul: int = 0
    eltwise: int = 0
    typecast: int = 0
    move: int = 0  # reshape, permute, to_layout, slice, concat, pad, repeat, mesh_partition
    collective: int = 0
    # what a move costs beside its launch: each reads this many bytes and writes as many back (`planner.calibration`, pricing "ttnn");
    # predicted only (a compiled histogram has no sizes), so not compared
    move_bytes: float = field(default=0.0, compare=False)

    @property
    def total(self) -> int:
        return sum(getattr(self, c) for c in CLASSES)

    def __add__(self, other: "Kernels") -> "Kernels":
        return Kernels(
            **{c: getattr(self, c) + getattr(other, c) for c in CLASSES}, move_bytes=self.move_bytes + other.move_bytes
        )

    def to_json(self) -> dict:
        return {**{c: getattr(self, c) for c in CLASSES}, "total": self.total}

    @classmethod
    def of_ttnn(cls, ops: Mapping[str, int]) -> "Kernels":
        """A compiled part's TTNN op histogram (``ttnn.<op>`` -> count) by class; deallocations and
        const-eval loads are no kernels."""
        c: Counter = Counter()
        for op, n in ops.items():
            if op in _NOT_KERNELS:
                continue
            c[_TTNN_CLASS.get(op.split(".", 1)[-1], "eltwise")] += n
        return cls(**c)


def _k(**counts: int) -> Kernels:
    return Kernels(**counts)


# --- per-op rules -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Ctx:
    graph: Graph
    layouts: Mapping[str, tuple[Layout, ...]]
    mesh: MeshSpec
    reduced: frozenset[str]  # nodes whose output the plan all-reduces (or reduce-scatters)
    fed: frozenset[str]  # nodes the residual stream feeds (`per_call`)
    calls: frozenset[str] = frozenset()  # the nodes that run in the block each call (`per_call`)

    def split_last(self, name: str) -> bool:
        lays = self.layouts.get(name)
        if not lays:
            return False
        last = lays[0].dims[-1] if lays[0].dims else ()
        return any(self.mesh.axis_size(a) > 1 for a in last)

    def local_bytes(self, name: str, layout: Optional[Layout] = None) -> float:
        """Bytes per chip of `name`'s value, in `layout` or the one the plan gives it (whole where it gives none)."""
        node = self.graph[name]
        if not node.outputs:
            return 0.0
        lays = self.layouts.get(name)
        lay = layout or (lays[0] if lays else None)
        return as_number(numel(local_shape(node.out.shape, lay, self.mesh))) * node.out.itemsize


_Rule = Callable[[Node, _Ctx], Kernels]
_RULES: dict[str, _Rule] = {}

# ops that only re-view their input: counted by the reshapes a chain of them needs (`_reshapes`)
VIEWS = frozenset(
    {"view", "reshape", "flatten", "unflatten", "squeeze", "unsqueeze", "contiguous", "expand", "permute", "transpose"}
)
_FREE = frozenset({"dropout", "clone", "detach", "contiguous", "alias"})
CASTS = frozenset({"float", "to", "type_as", "bfloat16", "half", "type", "_to_copy"})
_FUSED = frozenset({"scaled_dot_product_attention", "gelu"})
ELTWISE = frozenset(
    {"add", "sub", "mul", "truediv", "div", "neg", "pow", "exp", "rsqrt", "sqrt", "sin", "cos", "silu", "sigmoid"}
    | {"tanh", "where", "maximum", "minimum", "abs", "erf", "log", "gt", "lt", "ge", "le", "eq", "ne", "mean", "sum"}
)


def rule(*ops: str) -> Callable[[_Rule], _Rule]:
    def add(fn: _Rule) -> _Rule:
        for op in ops:
            _RULES[op] = fn
        return fn

    return add


@rule(*_FUSED)
def _fused(node: Node, ctx: _Ctx) -> Kernels:
    if node.op != "scaled_dot_product_attention":
        return _k(fused=1)
    head_dim = node.out.shape[-1]
    if isinstance(head_dim, int) and head_dim % TILE == 0:
        return _k(fused=1, move=1)  # its heads joined by ``concatenate_heads``
    # q, k, v padded to a tile (those made beside the prologue, there), the output sliced back
    return _k(fused=1, move=1 + sum(1 for i in node.inputs[:3] if i in ctx.calls))


@rule("rms_norm")
def _rms_norm(node: Node, ctx: _Ctx) -> Kernels:
    if not ctx.split_last(node.inputs[0]):
        return _k(fused=1)
    if node.name not in ctx.fed:
        return _k(eltwise=1)  # its statistics run beside the prologue, the weight's multiply in the block
    return _k(typecast=1, eltwise=6, move=1, move_bytes=_statistic_bytes(node, ctx))


@rule("layer_norm")
def _layer_norm(node: Node, ctx: _Ctx) -> Kernels:
    if not ctx.split_last(node.inputs[0]):
        return _k(fused=1)
    # decomposed around the all-reduces of its two sums: sum, mean, subtract, pow, sum, mean, + eps, multiply
    # (rsqrt folded), each statistic reshaped back; the affine weight's multiply and the bias add
    affine = sum(1 for i in node.inputs[1:] if ctx.graph[i].outputs)
    return _k(eltwise=8 + affine, move=2, move_bytes=2 * _statistic_bytes(node, ctx))


def _statistic_bytes(node: Node, ctx: _Ctx) -> float:
    """Bytes per chip of a norm's per-row statistic (what its reshape moves): one value per normalized row."""
    lays = ctx.layouts.get(node.name)
    rows = local_shape(node.out.shape, lays[0] if lays else None, ctx.mesh)[:-1]
    return as_number(numel(rows)) * node.out.itemsize


@rule("linear", "matmul", "bmm", "mm")
def _linear(node: Node, ctx: _Ctx) -> Kernels:
    bias = len(node.inputs) > 2 and node.name in ctx.reduced
    joined = node.inputs[0] not in ctx.fed  # a text projection, joined across the blocks (`per_call`)
    return _k(matmul=0 if joined else 1, eltwise=1 if bias else 0)


@rule(*ELTWISE)
def _eltwise(node: Node, ctx: _Ctx) -> Kernels:
    return _k(eltwise=1)


def _promotions(graph: Graph, nodes: Iterable[Node], const: set[str]) -> int:
    """The ``typecast`` kernels of type promotion: an elementwise op reading a value of another dtype than
    it computes in (bf16 activations times an fp32 modulation) converts it first, once per value."""
    seen: set[tuple[str, str]] = set()
    for node in nodes:
        if node.op not in ELTWISE or not node.outputs:
            continue
        for name in node.inputs:
            src = graph[name]
            if name in const or not src.outputs or src.out.dtype == node.out.dtype:
                continue
            seen.add((name, node.out.dtype))
    return len(seen)


@rule(*CASTS)
def _cast(node: Node, ctx: _Ctx) -> Kernels:
    src = ctx.graph[node.inputs[0]]
    if not src.outputs or src.outputs[0].dtype == node.out.dtype:
        return _k()
    # an elementwise op whose only reader is the cast writes the new dtype itself
    maker = _through(ctx.graph, src, _FREE)
    alone = len(ctx.graph.users(maker.name)) == 1 and maker is src
    return _k() if maker.op in ELTWISE and alone else _k(typecast=1)


@rule(*_FREE)
def _free(node: Node, ctx: _Ctx) -> Kernels:
    return _k()


@rule("getitem")
def _getitem(node: Node, ctx: _Ctx) -> Kernels:
    return _k(move=1)


@rule(*TUPLE_OPS)
def _tuple(node: Node, ctx: _Ctx) -> Kernels:
    return _k()  # its picks slice


@rule("cat", "stack")
def _cat(node: Node, ctx: _Ctx) -> Kernels:
    dim = node.arg(1, "dim", 0)
    rank = len(node.out.shape)
    last = isinstance(dim, int) and dim % rank == rank - 1
    return _k(move=1 + (len(node.inputs) + 1 if last else 0))


def _through(graph: Graph, node: Node, ops: frozenset) -> Node:
    """The op that made `node`'s value, past `ops` (single-input pass-throughs)."""
    while node.op in ops and node.inputs:
        node = graph[node.inputs[0]]
    return node


# --- views: reshapes where shapes change -------------------------------------------------------------


def _written(graph: Graph, node: Node) -> Optional[tuple]:
    """The shape `node`'s value has in TTNN as its op writes it (a linear writes 2-D)."""
    if not node.outputs:
        return None
    shape = tuple(node.out.shape)
    if node.op in ("linear", "matmul") and len(shape) != 2:
        return (_prod(shape[:-1]), shape[-1])
    if node.op == "getitem" and graph[node.inputs[0]].op == "unbind":  # the picked dim stays, size 1
        return shape[:-1] + (1, shape[-1]) if len(shape) else shape
    return shape


def _read(node: Node, graph: Graph, i: int) -> Optional[tuple]:
    """The shape `node` reads its input `i` in (a linear reads 2-D)."""
    src = graph[node.inputs[i]]
    if not src.outputs:
        return None
    shape = tuple(src.out.shape)
    if node.op in ("linear", "matmul") and i == 0 and len(shape) != 2:
        return (_prod(shape[:-1]), shape[-1])
    return shape


def _prod(dims) -> int:
    out = 1
    for d in dims:
        out = out * d
    return out


def _reshapes(graph: Graph, nodes: Iterable[Node], const: set[str]) -> list[str]:
    """One reshape per (producer, consumer) across a chain of views, where the shape the consumer reads
    differs from the one the producer wrote: the producers, one per reshape; permutes next to an attention are
    absorbed, any other is a kernel of its own (counted by `block_kernels`)."""
    out: list[str] = []
    seen: set[tuple[str, tuple]] = set()
    for node in nodes:
        if node.op in VIEWS or node.op in _FREE or node.op in CASTS or node.name in const:
            continue
        for i, name in enumerate(node.inputs):
            src = graph[name]
            if not src.outputs or name in const:
                continue
            root = _viewed(graph, name)
            if root.name in const or root.op == "placeholder" and root.is_param:
                continue
            have, want = _written(graph, root), _read(node, graph, i)
            if have is None or want is None or tuple(have) == tuple(want):
                continue
            key = (root.name, tuple(want))
            if key not in seen:
                seen.add(key)
                out.append(root.name)
    return out


def constants(graph: Graph) -> set[str]:
    """The nodes computed from parameters and buffers alone: tt-mlir's const-eval computes them once."""
    out: set[str] = set()
    for node in graph:
        if node.op == "placeholder":
            if node.is_param:
                out.add(node.name)
            continue
        if node.inputs and all(i in out for i in node.inputs):
            out.add(node.name)
        elif not node.inputs and node.op not in ("output",):
            out.add(node.name)
    return out


def per_call(graph: Graph, nodes: list[Node], reduced: frozenset[str] = frozenset()) -> tuple[list[Node], set[str]]:
    """The ops of a block (`nodes`) that run in the block each call, and of those the ones fed by the
    residual stream (the outside value of the block output's shape) through activations.

    An op runs in the block when it reads, directly or through other such ops, the stream or a parameter of
    the block, and is not computed from parameters alone. The others (a cast of the timestep embedding, the
    text K/V projections, which tt-mlir joins across the blocks into one linear) read only what the prologue
    made: tt-mlir runs them beside it, and `wancompile.tt.parts` labels them so. A text projection the plan
    reduces (`reduced`) adds its bias after the reduction, in the block: what reads it is fed as the stream's
    consumers are. An op the stream does not feed (the text keys' RMSNorm) has only its kernels that read the
    block's parameters in the block."""
    inside = {n.name for n in nodes}
    stream = tuple(nodes[-1].out.shape)
    const = constants(graph)
    fed = {
        i
        for n in nodes
        for i in n.inputs
        if i not in inside and graph[i].outputs and tuple(graph[i].out.shape) == stream
    }
    own = {n.name for n in nodes if n.op == "placeholder" and n.is_param}
    out = []
    for n in nodes:
        if n.op == "placeholder":
            continue
        if any(i in fed for i in n.inputs):
            fed.add(n.name)
        elif n.op in ("linear", "matmul") and n.inputs[0] not in inside:
            if n.name not in reduced or len(n.inputs) < 3:
                continue  # a projection of the text states: joined across the blocks
            fed.add(n.name)
        elif not any(i in own for i in n.inputs):
            continue
        own.add(n.name)
        if n.name not in const and n.outputs and n.op != "output":
            out.append(n)
    return out, fed & inside


def block_kernels(
    graph: Graph,
    nodes: Iterable[Node],
    layouts: Mapping[str, tuple[Layout, ...]],
    mesh: MeshSpec,
    collectives: Iterable[Collective],
    reshards: Iterable[tuple[str, Layout, Layout]] = (),
) -> Kernels:
    """The TTNN kernels one block (`nodes`, graph order, its parameters included) runs per call
    (`per_call`): its ops under the rules above, the reshapes between them, and `collectives` (the
    block's, with their calls per block call, lowered for tt-mlir: `planner.targets.Target.lower`; their
    ``where`` the block's own locations or the generic ``blocks.*`` ones) with the reshapes to 4-D around them,
    and the `reshards` (value, from, to) that are local slices (`_local_slice`)."""
    nodes = list(nodes)
    by_loc = {graph.generic(str(n.location)): n for n in nodes}
    by_loc.update({str(n.location): n for n in nodes})
    located = [(c, by_loc.get(c.where)) for c in collectives]
    reduced = frozenset(at.name for c, at in located if at is not None and c.kind in ("all-reduce", "reduce-scatter"))
    nodes, fed = per_call(graph, nodes, reduced)
    const = constants(graph)
    # a text projection the plan reduces: its matmul and reduction run joined beside the prologue, its bias add here
    joined = {n.name for n in nodes if n.op in ("linear", "matmul") and n.inputs[0] not in fed}
    # a collective at an op the stream does not feed runs beside the prologue (`per_call`)
    colls = [(c, at) for c, at in located if at is None or at.name in fed and at.name not in joined]
    ctx = _Ctx(graph, layouts, mesh, reduced, frozenset(fed), frozenset(n.name for n in nodes))
    rotary, absorbed = _rotaries(graph, nodes)
    total = Kernels()
    for node in nodes:
        if node.name in absorbed:
            continue
        if node.name in rotary:
            total = total + _rotary(node, ctx)
            continue
        if node.op in ("permute", "transpose"):
            total = total + _permute(graph, node, ctx)
            continue
        fn = _RULES.get(node.op)
        if fn is not None:
            k = fn(node, ctx)
            if k.move and not k.move_bytes:  # a move the rule names moves the op's value
                k = replace(k, move_bytes=k.move * ctx.local_bytes(node.name))
            total = total + k
    roots = _reshapes(graph, nodes, const)
    total = total + _k(move=len(roots), typecast=_promotions(graph, nodes, const))
    total = total + _k(move_bytes=sum(ctx.local_bytes(r) for r in roots))
    for c, at in colls:
        total = total + _k(collective=int(c.count)) + _around(c, at, ctx)
    ran = {n.name for n in nodes} | {i for n in nodes if n.name not in joined for i in n.inputs}
    slices = {(v, b): a for v, a, b in reshards if v in ran and v not in const and _local_slice(a, b, mesh)}
    for (v, b), a in slices.items():
        total = total + _k(move=len(b.axes) + 2, move_bytes=(len(b.axes) + 2) * ctx.local_bytes(v, a))
    return total


def _rotaries(graph: Graph, nodes: list[Node]) -> tuple[set[str], set[str]]:
    """The adds that tt-mlir fuses with what they read into one ``rotary_embedding`` (``x * cos + rotate_half(x) *
    sin``, x of rank 4, rotate_half(x) = ``cat([-x[..., D/2:], x[..., :D/2]], -1)``), and the ops absorbed."""
    made = {n.name: n for n in nodes}
    rotary: set[str] = set()
    absorbed: set[str] = set()
    for node in nodes:
        if node.op != "add" or len(node.inputs) != 2 or not all(i in made for i in node.inputs):
            continue
        products = [made[i] for i in node.inputs]
        if any(p.op != "mul" for p in products):
            continue
        for cos_side, sin_side in (products, products[::-1]):
            half = next((made[i] for i in sin_side.inputs if i in made and made[i].op in ("cat", "concat")), None)
            x = _rotate_half_of(graph, half) if half is not None else None
            if x is not None and x in cos_side.inputs and len(graph[x].out.shape) == 4:
                neg, lo = (graph[i] for i in half.inputs)
                rotary.add(node.name)
                absorbed.update({cos_side.name, sin_side.name, half.name, neg.name, neg.inputs[0], lo.name})
                break
    return rotary, absorbed


def _rotary(node: Node, ctx: _Ctx) -> Kernels:
    """One ``rotary_embedding``; where each chip's tokens are not a whole number of tiles, it writes them padded
    to one and a ``slice_static`` cuts them back (measured: 16 tokens a chip, TI2V's auto plan on 2x4)."""
    lays = ctx.layouts.get(node.name)
    tokens = local_shape(node.out.shape, lays[0] if lays else None, ctx.mesh)[-2]
    if isinstance(tokens, int) and tokens % TILE:
        return _k(fused=1, move=1, move_bytes=ctx.local_bytes(node.name))
    return _k(fused=1)


def _rotate_half_of(graph: Graph, cat: Node) -> Optional[str]:
    """x where `cat` is ``cat([-x[..., D/2:], x[..., :D/2]], -1)``, else None."""
    if len(cat.inputs) != 2:
        return None
    neg, lo = (graph[i] for i in cat.inputs)
    if neg.op != "neg" or lo.op != "getitem":
        return None
    hi = graph[neg.inputs[0]]
    if hi.op != "getitem" or hi.inputs[:1] != lo.inputs[:1]:
        return None
    return lo.inputs[0]


def _permute(graph: Graph, node: Node, ctx: _Ctx) -> Kernels:
    """A permute's kernels: none into or out of an attention (absorbed); a rank-5 swap of the last two dims (a
    reorder of the last dim's pairs) a ``reshape``, ``permute``, ``reshape``; a transpose of dims 1 and 2 beside
    such a reorder none (merged into it); any other one ``permute``, and a ``reshape`` before it where the value
    it reads was written in another shape (the head split before RoPE's heads-first transpose), both one
    ``reshape`` where on a chip it only moves dims of size 1 (one head per chip)."""
    near = [graph[i] for i in node.inputs] + _readers_past_key_cuts(graph, node)
    if any(x.op == "scaled_dot_product_attention" for x in near):
        return _k()
    if _pair_swap(node):
        return _k(move=3, move_bytes=3 * ctx.local_bytes(node.name))
    if _merged_transpose(graph, node):
        return _k()
    reshaped = _written(graph, _viewed(graph, node.inputs[0])) != _read(node, graph, 0)
    moves = 1 if _unit_moves(node, ctx) else 1 + reshaped
    return _k(move=moves, move_bytes=moves * ctx.local_bytes(node.name))


def _viewed(graph: Graph, name: str) -> Node:
    """The op that wrote value `name`, past views and ops that keep its value and dtype."""
    root = graph[name]
    while root.inputs and (
        root.op in VIEWS | _FREE or root.op in CASTS and root.out.dtype == graph[root.inputs[0]].out.dtype
    ):
        root = graph[root.inputs[0]]
    return root


def _unit_moves(node: Node, ctx: _Ctx) -> bool:
    """Whether permute `node`, on a chip's part of its input, keeps the dims of size > 1 in their order."""
    lays = ctx.layouts.get(node.inputs[0])
    src = ctx.graph[node.inputs[0]]
    shape = local_shape(src.out.shape, lays[0] if lays else None, ctx.mesh)
    rank = len(shape)
    if node.op == "transpose":
        a, b = node.arg(1, "dim0") % rank, node.arg(2, "dim1") % rank
        order = list(range(rank))
        order[a], order[b] = b, a
    else:
        order = [d % rank for d in _permute_dims(node)]
    kept = [d for d in order if as_number(shape[d]) != 1]
    return kept == sorted(kept)


def _merged_transpose(graph: Graph, node: Node) -> bool:
    """A [B, S, H, D] <-> [B, H, S, D] transpose tt-mlir does not run: the permute into an attention its value
    reaches through casts undoes it."""
    if not _swaps(node, 1, 2):
        return False
    todo = [node]
    while todo:
        x = todo.pop()
        for u in graph.users(x.name):
            if u.inputs[:1] != (x.name,):
                continue  # reads x's dtype (``other.type_as(x)``), not its value
            if u.op in CASTS:
                todo.append(u)
            elif u.op in ("permute", "transpose") and any(
                w.op == "scaled_dot_product_attention" for w in _readers_past_key_cuts(graph, u)
            ):
                return True
    return False


def _key_cut(graph: Graph, node: Node) -> bool:
    """Whether `node` is sp_pad's cut of an attention's K or V back to the real tokens (its ``padded_keys="slice"``
    form): a slice of dim -2 that only attentions read. TTNN runs it as one ``slice_static`` (`_getitem`) on the
    value the permute into the attention made, so the permute stays absorbed."""
    if node.op != "getitem" or not node.outputs or not node.inputs:
        return False
    src = graph[node.inputs[0]]
    users = graph.users(node.name)
    if not src.outputs or not users or any(u.op != "scaled_dot_product_attention" for u in users):
        return False
    a, b = tuple(src.out.shape), tuple(node.out.shape)
    return len(a) == len(b) >= 2 and a[:-2] == b[:-2] and a[-1] == b[-1] and a[-2] != b[-2]


def _readers_past_key_cuts(graph: Graph, node: Node) -> list[Node]:
    """`node`'s readers, an attention reading it through a K/V cut (`_key_cut`) among them."""
    users = graph.users(node.name)
    return users + [w for u in users if _key_cut(graph, u) for w in graph.users(u.name)]


def _swaps(node: Node, a: int, b: int) -> bool:
    rank = len(node.out.shape) if node.outputs else 0
    if node.op == "transpose":
        dims = {node.arg(1, "dim0") % rank, node.arg(2, "dim1") % rank} if rank else set()
        return dims == {a % rank, b % rank} if rank else False
    return False


def _pair_swap(node: Node) -> bool:
    """A rank-5 permute that swaps the last two dims (the rope rewrite's reorder of the head dim's pairs, which
    may also swap tokens and heads)."""
    if not node.outputs or len(node.out.shape) != 5:
        return False
    if node.op == "transpose":
        return _swaps(node, -1, -2)
    dims = _permute_dims(node)
    return node.op == "permute" and len(dims) == 5 and tuple(d % 5 for d in dims[3:]) == (4, 3)


def _permute_dims(node: Node) -> tuple:
    """A ``permute``'s dims, given as one sequence or as separate arguments."""
    dims = node.arg(1, "dims")
    return tuple(dims) if isinstance(dims, (list, tuple)) else tuple(node.attrs.get("args", [None])[1:])


def _local_slice(a: Layout, b: Layout, mesh: MeshSpec) -> bool:
    """Whether resharding `a` to `b` is a local slice of a replicated value: each chip keeps its part of what it
    holds (a ``mesh_partition`` per axis added, with a ``to_layout`` to row-major and back around them), where
    only dims `a` keeps whole gain axes and nothing is summed. (A split dim gaining a minor axis is sliced
    inside the tiles the collectives around it move.)"""
    if a.partial or b.partial or a.ndim != b.ndim:
        return False
    added = False
    for x, y in zip(a.dims, b.dims):
        if x != y and x:
            return False
        added = added or any(mesh.axis_size(ax) > 1 for ax in y[len(x) :])
    return added


def _around(c: Collective, at: Optional[Node], ctx: _Ctx) -> Kernels:
    """The data movement tt-mlir puts around one lowered collective: a reduction of a tensor of rank other than
    4 reshaped to 4-D and back; a parameter gathered for a linear copied to tile layout first (an activation, or
    a weight const-eval computed from parameters, is gathered as it is); an all-to-all (its ``point_to_point``
    transfers, `planner.targets`) slicing each chip's chunks and assigning the received."""
    layouts, mesh = ctx.layouts, ctx.mesh
    calls = int(c.count)
    n = math.prod(mesh.axis_size(a) for a in c.axes)
    if c.kind == "collective-permute":
        if len(c.axes) == 1 and n > 1:
            moves = 2 * n * (calls // (mesh.size * (n - 1)))
            return _k(move=moves, move_bytes=moves * c.bytes)  # each transfer's chunk sliced, then assigned
        return _k()
    if c.kind == "all-gather":
        tiled = at is not None and _gathers_weight(c, at, layouts) and _viewed(ctx.graph, at.inputs[1]).is_param
        moves = calls if tiled else 0
        return _k(move=moves, move_bytes=moves * c.bytes / max(n, 1))  # the local shard, tiled
    rank = len(at.out.shape) if at is not None and at.outputs else 4
    moves = calls * (2 if rank != 4 else 0)
    out = 1 / n if c.kind == "reduce-scatter" and n else 1  # the operand reshaped in, the result back
    return _k(move=moves, move_bytes=moves / 2 * c.bytes * (1 + out))


def _gathers_weight(c: Collective, at: Node, layouts: Mapping[str, tuple[Layout, ...]]) -> bool:
    """Whether an all-gather at a linear gathers its weight (a plan names both its input's and its weight's
    gathers at the linear): the weight is split over the axes gathered."""
    if at.op not in ("linear", "matmul") or len(at.inputs) < 2:
        return False
    lays = layouts.get(at.inputs[1])
    return bool(lays) and bool(set(c.axes) & set(lays[0].axes))


def _own_collectives(graph: Graph, plan: Plan, stack: str, root: str) -> dict[int, list[Collective]]:
    """Block index -> its collectives as the plan's target compiles them (`Target.lower`), each at the
    representative block's place (`root`)."""
    from planner.pins import graph_events
    from planner.request import PlanRequest

    target = PlanRequest.for_plan(plan).target
    const = constants(graph)
    # a weight's place, or a packed weight's (computed from weights once) -> the op reading it per call, where the
    # plan names its gathers
    reader: dict[str, str] = {}
    for node in graph:
        if node.name in const:
            continue
        for i in node.inputs:
            for w in _made_once(graph, i, const):
                reader.setdefault(str(graph[w].location), str(node.location))
    by_block: dict[int, list[Collective]] = {}
    for (kind, axes, nbytes, where), n in graph_events(graph, plan, None, target, generic=False).items():
        where = reader.get(where, where)
        at = plan.block_of(where)
        if at is not None and at[0] == stack:
            by_block.setdefault(at[1], []).append(Collective(kind, axes, nbytes, n, root + at[2]))
    return {k: list(target.lower(cs, plan.mesh)) for k, cs in by_block.items()}


def _made_once(graph: Graph, name: str, const: set[str]) -> list[str]:
    """Value `name` and all it is computed from, where it is computed from parameters alone (else none)."""
    if name not in const:
        return []
    return [name] + [w for i in graph[name].inputs for w in _made_once(graph, i, const)]


def plan_kernels(graph: Graph, plan: Plan, num_blocks: Optional[int] = None) -> dict[int, Kernels]:
    """Block index -> the TTNN kernels that block of `graph`'s main stack runs per call under `plan` (a
    ``tt-mlir`` plan; `block_kernels`): each run of blocks that share their decisions (`forward.block_runs`)
    counted at the representative block with that run's layouts and its collectives: those the plan names at
    one of the run's blocks, and its share of those it names for every block (``blocks.*``: a plan sums them
    over the blocks, so they are shared among the blocks of the runs whose evaluation makes them, as an
    FSDP block range's gathers are its blocks' alone). Where `graph` holds every block, each block's
    collectives are its own, as the whole graph's evaluation places them (`planner.pins.graph_events`: the
    next block's entry reshard is made at this block's output; the last block's is read by the output
    instead). `num_blocks`: the blocks of the model (default: the plan's)."""
    from planner.forward import block_runs, evaluate_forward
    from planner.request import PlanRequest
    from planner.structure import dit_graph, family_of, find_structure

    graph = dit_graph(graph)
    st = find_structure(graph)
    stack = family_of(st.root)
    n = num_blocks or plan.layers or st.captured_blocks
    fwd = evaluate_forward(graph, plan, PlanRequest.for_plan(plan).hardware, num_blocks=n)
    runs = block_runs(graph, st, plan, n)
    # (kind, generic module) -> the runs whose evaluation makes such a collective there (a weight's gather is made
    # at its parameter, the plan names it at the op reading it)
    made_in: dict[tuple[str, str], set[int]] = {}
    for e, _, part in fwd.events:
        if 1 <= part <= len(runs):
            made_in.setdefault((e.kind, graph.generic(e.where).split(":")[0]), set()).add(part - 1)
    rep = [x for x in graph if st.in_rep(graph, x)]
    lowered = plan.predicted_by_partitioner()[plan.target]
    own = _own_collectives(graph, plan, stack, st.root) if st.captured_blocks == n else None
    out: dict[int, Kernels] = {}
    for r, ((_, run), (ev, _)) in enumerate(zip(runs, fwd.parts[1:-1])):
        reshards = [(graph[x].inputs[i], ev.layouts[graph[x].inputs[i]][0], lay) for (x, i), lay in ev.required.items()]
        reshards += [(x, lay, ev.layouts[x][0]) for x, lay in ev.unforced.items()]
        for k in run:
            if own is not None:
                out[k] = block_kernels(graph, rep, ev.layouts, plan.mesh, own.get(k, []), reshards)
                continue
            mine = []
            for c in lowered:
                at = plan.block_of(c.where)
                if at is not None and at[0] == stack and at[1] == k:
                    mine.append(replace(c, where=st.root + at[2]))
                elif c.where.startswith(stack + ".*"):
                    sharing = made_in.get((c.kind, c.where.split(":")[0]), set(range(len(runs))))
                    if r in sharing:
                        mine.append(replace(c, count=c.count // sum(len(runs[j][1]) for j in sharing)))
            out[k] = block_kernels(graph, rep, ev.layouts, plan.mesh, mine, reshards)
    return out
