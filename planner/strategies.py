"""Macro-strategies: the choices the ILP makes, one per Megatron pair or attention.

A DiT block is found by structure, not by name lists: inside the repeated block, a child module that
runs ``scaled_dot_product_attention`` is an **attention** macro (its to_q/k/v, norm_q/k, RoPE, SDPA and
to_out all switch together); a child with two linears and no attention is an **MLP** macro (a
col -> row Megatron pair); root modules with exactly two linears (the time/text embedders) are MLP
macros too. Everything else in the block (norms, adaLN modulation, residual adds) is glue that follows
the stream layout of the next macro — Alpa's follower merging, by construction. An attention's
projections are found by dataflow too (each SDPA operand walked back to the linear producing it), so
the ``qkv`` rewrite's fused projections plan like the three they replace; their packed weights are
laid out as parameters (`planner.packing`).

A `Strategy` of a macro is a sequence-parallel axis set σ (the token dim of the stream is split over
σ), a tensor-parallel axis set t (heads / FFN columns split over t, disjoint from σ), and flags:

=====================  ========================================================================
strategy               collectives it implies (found by the op rules, not written here)
=====================  ========================================================================
head-TP(t) [+SP(σ)]    all-reduce of to_out on t; norm_q/k statistics all-reduces on t;
                       self-attention with σ: K and V all-gathered on σ (constraints pin where)
SP(σ)                  self-attention: K and V (full width) all-gathered on σ; no TP collective
Ulysses(t×σ)           all-to-all on σ around SDPA (heads split over (t, σ), TP major); to_out
                       all-reduce on t; needs heads % (|t|·|σ|) == 0
+ring                  (self-attention with σ, for head-TP(t)+SP(σ) and SP(σ)) ring attention: instead
                       of the K/V all-gather, each device's K/V chunk circulates around σ
                       (|σ|-1 collective-permutes of K and of V), each step's transfer hidden
                       behind that step's attention (`planner.ring`); offered only on targets
                       that lower it (`Target.ring_attention`), priced and reported everywhere
replicated             nothing inside; the stream edge gathers tokens in (and slices out)
Megatron(t) [+SP(σ)]   one all-reduce on t after the row-parallel linear
+FSDP                  weights also split over σ, all-gathered per use (memory for time)
+hidden(t)             stream between macros split on D over t (STATE B): all-gather of the
                       column-parallel input on D, reduce-scatter of the row-parallel sums onto D,
                       LayerNorm statistics all-reduced on t
+seq(t)                stream split on the tokens over σ + t (sequence-parallel Megatron):
                       all-gather of the column-parallel input on the tokens over t,
                       reduce-scatter of the row-parallel sums onto them
+pad(H->H')            (attention) heads a split does not divide padded with zero heads
                       (rewrites/pad_heads.py): the option above on the padded graph, priced
                       there (H'/H the attention's FLOPs and bytes; padded weight copies)
=====================  ========================================================================

`forced` holds the activation constraints a strategy places (node name -> layout) at points the
partitioner handles cleanly: linear outputs and the permutes feeding SDPA — never a reshape whose
merged or split dim the constraint would shard (see docs/planner.md).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from dataclasses import replace as dc_replace
from typing import Optional

from planner.graph import Graph, Node
from planner.macros import Macro
from planner.mesh import MeshSpec
from planner.packing import is_padded, packed_operand, padded_source_layouts, source_layouts
from planner.placements import Guard, Layout, divides, shard_count
from planner.plan import Exclusion

Stream = tuple[tuple[str, ...], tuple[str, ...]]  # (axes splitting the stream's tokens, its hidden dim)


@dataclass(frozen=True)
class Strategy:
    """One option of a macro. ``stream`` is the layout of the (B, L, D) residual stream the macro
    reads and writes between macros — the ILP's key: ``(σ, ())`` is the seed's STATE A (hidden
    whole), ``(σ, t)`` tt-metal's STATE B (hidden split over the TP axes), ``(σ + t, ())``
    Megatron-LM's sequence parallelism (tokens also split over the TP axes)."""

    name: str
    sigma: tuple[str, ...]
    tp: tuple[str, ...]
    ulysses: bool = False
    fsdp: bool = False
    params: dict[str, Layout] = field(default_factory=dict, hash=False, compare=False)
    forced: dict[str, Layout] = field(default_factory=dict, hash=False, compare=False)
    guards: tuple[Guard, ...] = ()
    stream: Stream = ((), ())
    pad_heads: int = 0  # attention heads padded to this many (rewrites/pad_heads.py); 0: not padded
    ring: bool = False  # self-attention K/V circulated around σ instead of all-gathered (`ring_variant`)

    @property
    def state(self) -> str:
        """Which stream layout this is, by its well-known name."""
        return stream_state(self.stream, self.tp)


def stream_state(stream: Stream, tp: tuple[str, ...] = ()) -> str:
    tokens, hidden = stream
    if hidden:
        return "STATE B"
    if tp and set(tp) <= set(tokens):
        return "SP-Megatron"
    return "STATE A"


@dataclass(frozen=True)
class Family:
    """A further stack of repeated blocks beside the main one (VACE's control stack ``vace_blocks``):
    its macros each span all of its captured blocks (one ILP variable per macro for the family),
    and the stream values it reads from the prologue (`entries`: the control tokens)."""

    prefix: str
    macros: tuple[Macro, ...]
    entries: tuple[str, ...]
    blocks: int


@dataclass(frozen=True)
class Structure:
    """The DiT as the planner sees it: prologue, one representative block of the main stack (the
    stack the epilogue reads), epilogue; further block families (`families`) and the glue between
    the main blocks that reads them (`glue`: VACE's hint adds)."""

    prologue: tuple[str, ...]
    epilogue: tuple[str, ...]
    block_macros: tuple[Macro, ...]
    root_macros: tuple[Macro, ...]
    entry: str  # the flattened (B, L, D) tokens entering the block stack
    block_output: str  # the block's last stream value (block 0)
    exit: str  # proj_out's linear: gathered to replicated before unpatchify
    tokens: object  # L (int or sympy expression)
    captured_blocks: int
    root: str = ""  # the representative block's module path (``blocks.0``)
    families: tuple[Family, ...] = ()
    glue: tuple[str, ...] = ()  # non-block ops between the main stack's first and last block ops

    def in_rep(self, graph: Graph, node: Node) -> bool:
        """Whether `node` belongs to the main stack's representative block."""
        return node.block is not None and graph.block_root(node) == self.root

    def in_main(self, graph: Graph, node: Node) -> bool:
        """Whether `node` belongs to any block of the main stack."""
        root = graph.block_root(node)
        return root is not None and family_of(root) == family_of(self.root)

    @property
    def family_macros(self) -> tuple[Macro, ...]:
        return tuple(m for f in self.families for m in f.macros)


def family_of(root: str) -> str:
    """A block's family prefix: its module path without the block number (``vace_blocks.1`` ->
    ``vace_blocks``)."""
    return root.rsplit(".", 1)[0]


class StructureError(ValueError):
    pass


def _child(module: str, root: str) -> Optional[str]:
    if not module.startswith(root + "."):
        return None
    return module[len(root) + 1 :].split(".")[0]


def _roots(graph: Graph, nodes: list[Node]) -> dict[str, str]:
    """node name -> its block's module path, for the block ops of `nodes`."""
    out = {}
    for n in nodes:
        root = graph.block_root(n) if n.block is not None else None
        if root is not None:
            out[n.name] = root
    return out


def _macro_children(b0: list[Node], root0: str) -> list[str]:
    """The children of block `root0` (its ops `b0`) that are macros: attention, or two linears."""
    by_child: dict[str, list[Node]] = {}
    for n in b0:
        c = _child(n.module, root0)
        if c is not None:
            by_child.setdefault(c, []).append(n)
    return [
        c
        for c, ns in by_child.items()
        if any(n.op == "scaled_dot_product_attention" for n in ns) or sum(n.op == "linear" for n in ns) >= 2
    ]


def dit_graph(graph: Graph) -> Graph:
    """The graph as the DiT planner reads it: a block family is a stack of transformer blocks (each
    block has a macro child, `_block_macros`) or its ops are plain ops. Wan Animate's
    ``motion_encoder.res_blocks`` (conv residual blocks of the prologue) and ``face_adapter`` (each
    block one cross-attention module: its SDPA in the block itself, no attention or MLP child; it
    reads the main stream after every ``inject_face_latents_blocks``-th block and its output is added
    back to it) are planned op by op, the face adapters as glue between the main blocks."""
    ops: dict[str, list[Node]] = {}
    for n in graph:
        root = graph.block_root(n) if n.op != "placeholder" else None
        if root is not None:
            ops.setdefault(root, []).append(n)
    first = {f.prefix: f"{f.prefix}.{f.indices[0]}" for f in graph.families if f.indices}
    plain = [p for p, root in first.items() if not _macro_children(ops.get(root, []), root)]
    if len(plain) == len(first):  # no transformer stack at all: `find_structure` says why
        return graph
    return graph.without_families(plain)


def _block_macros(graph: Graph, b0: list[Node], root0: str) -> tuple[Macro, ...]:
    """One block's macros: children of the block root with attention or two linears; every other op
    of the block (norms, adaLN, residual adds, single projections) joins the next macro."""
    macro_children = _macro_children(b0, root0)
    if not macro_children:
        raise StructureError(f"block {root0} has no attention and no two-linear child: nothing to plan as a macro")
    assign: dict[str, str] = {}
    pending: list[Node] = []
    order: list[str] = []
    for n in b0:
        c = _child(n.module, root0)
        if c in macro_children:
            if c not in order:
                order.append(c)
            for p in pending:
                assign[p.name] = c
            pending = []
            assign[n.name] = c
        else:
            pending.append(n)
    for p in pending:
        assign[p.name] = order[-1]
    return tuple(_macro(graph, c, f"{root0}.{c}", True, [n for n in b0 if assign.get(n.name) == c]) for c in order)


def _family(graph: Graph, prefix: str, roots: list[str], of: dict[str, str], nodes: list[Node], main: set) -> Family:
    """A further block family: per child name one macro spanning all its blocks (`Macro.parts`)."""
    per_block = [_block_macros(graph, [n for n in nodes if of.get(n.name) == r], r) for r in roots]
    names = [m.name for m in per_block[0]]
    if any([m.name for m in b] != names for b in per_block):
        raise StructureError(
            f"the blocks of {prefix} do not share their macros ({names}); cannot plan them as one family"
        )
    macros = []
    for i, c in enumerate(names):
        parts = tuple(b[i] for b in per_block)
        macros.append(
            Macro(
                f"{prefix}.*.{c}",
                parts[0].kind,
                tuple(x for p in parts for x in p.nodes),
                tuple(x for p in parts for x in p.params),
                module=f"{prefix}.*.{c}",
                in_block=True,
                linears=tuple(x for p in parts for x in p.linears),
                width=parts[0].width,
                self_attention=parts[0].self_attention,
                family=prefix,
                parts=parts,
            )
        )
    inside = {x for m in macros for x in m.nodes}
    stream = graph[next(iter(main))].out.shape if main else None
    entries = tuple(
        dict.fromkeys(
            i
            for x in inside
            for i in graph[x].inputs
            if i not in inside
            and graph[i].block is None
            and not graph[i].is_param
            and graph[i].outputs
            and graph[i].out.shape == stream
            and i not in main
        )
    )
    return Family(prefix, tuple(macros), entries, len(roots))


def find_structure(graph: Graph) -> Structure:
    """The `Structure` of `dit_graph(graph)` (the graph the DiT planner plans; pass that graph to
    whatever reads the structure's node sets)."""
    graph = dit_graph(graph)
    nodes = [n for n in graph if n.op not in ("placeholder", "output")]
    if not graph.blocks():
        raise StructureError("no repeated blocks in the graph (is this a Wan DiT?)")
    of = _roots(graph, nodes)
    if not of:
        raise StructureError("no repeated blocks in the graph (is this a Wan DiT?)")
    order: dict[str, list[str]] = {}  # family prefix -> its block roots, graph order
    for root in of.values():
        fam = order.setdefault(family_of(root), [])
        if root not in fam:
            fam.append(root)
    last_block = max(i for i, n in enumerate(nodes) if n.name in of)
    main = family_of(of[nodes[last_block].name])  # the stack the epilogue reads
    root0 = order[main][0]
    b0 = [n for n in nodes if of.get(n.name) == root0]
    first = nodes.index(b0[0])
    prologue = [n for n in nodes[:first] if n.block is None]
    epilogue = [n for n in nodes[last_block + 1 :] if n.block is None]
    glue = [n for n in nodes[first : last_block + 1] if n.block is None]

    block_macros = _block_macros(graph, b0, root0)

    # root MLP pairs (embedders): two linear *modules* under one parent. Calls are not modules: one
    # linear called twice (Animate's motion encoder runs per batch of face frames, its 1x1 conv_in a
    # linear after the conv1x1 rewrite) is one weight, not a pair.
    parents: dict[str, dict[str, None]] = {}
    for n in prologue:
        if n.op == "linear":
            parents.setdefault(n.module.rsplit(".", 1)[0] if "." in n.module else "", {})[n.module] = None
    root_macros = tuple(
        _macro(graph, p, p, False, [n for n in prologue if n.module.startswith(p + ".")])
        for p, lin in parents.items()
        if len(lin) == 2 and p and _one_call_each(prologue, p)
    )

    entry = block_stack_entry(graph, root0)
    exit_ = next((n for n in reversed(epilogue) if n.op == "linear"), None)
    if exit_ is None:
        raise StructureError("no output projection after the block stack")
    stream_shape = entry.out.shape
    block_output = next(n for n in reversed(b0) if n.outputs and n.out.shape == stream_shape)
    families = tuple(
        _family(graph, prefix, roots, of, nodes, {entry.name}) for prefix, roots in order.items() if prefix != main
    )
    return Structure(
        tuple(n.name for n in prologue),
        tuple(n.name for n in epilogue),
        block_macros,
        root_macros,
        entry.name,
        block_output.name,
        exit_.name,
        stream_shape[1],
        len(order[main]),
        root0,
        families,
        tuple(n.name for n in glue),
    )


def _one_call_each(prologue: list[Node], parent: str) -> bool:
    """Is every linear under `parent` called once (an MLP pair planned as one macro, not a module run per batch)?"""
    calls = [n.module for n in prologue if n.op == "linear" and n.module.startswith(parent + ".")]
    return len(calls) == len(set(calls))


def block_stack_entry(graph: Graph, root: Optional[str] = None) -> Node:
    """The (B, L, D) token tensor the main stack's first block (`root`; default: the block of the
    last block op, ``blocks.0``) reads: walk back from its first LayerNorm (norm1) through its dtype
    casts until the producer lies outside the block. Found by dataflow, so it holds after rewrites
    (patch_embed's linear, sp_pad's pad)."""
    if root is None:
        ops = [n for n in graph if n.block is not None and n.op != "placeholder"]
        if not ops:
            raise StructureError("cannot find the block-stack entry (no blocks); is this a Wan DiT graph?")
        main = family_of(graph.block_root(ops[-1]) or "")
        root = next(r for r in (graph.block_root(n) for n in ops) if r and family_of(r) == main)
    norm1 = next((n for n in graph if graph.block_root(n) == root and n.op == "layer_norm"), None)
    if norm1 is None:
        raise StructureError(f"cannot find the block-stack entry (no LayerNorm in {root}); is this a Wan DiT graph?")
    x = graph[norm1.inputs[0]]
    while graph.block_root(x) == root:
        x = graph[x.inputs[0]]
    return x


def _macro(graph: Graph, name: str, module: str, in_block: bool, ns: list[Node]) -> Macro:
    params = tuple(dict.fromkeys(i for n in ns for i in n.inputs if graph[i].is_param))
    # the macro's own projections (a block's single projections, VACE's proj_in/proj_out, are glue)
    linears = tuple(n.name for n in ns if n.op == "linear" and (n.module + ".").startswith(module + "."))
    packed = tuple(
        p
        for lin in linears
        for p in (packed_operand(graph, w) for w in graph[lin].inputs[1:])
        if p is not None and p.node in {n.name for n in ns}
    )
    folded = {x for p in packed for x in p.nodes}
    nodes = tuple(n.name for n in ns if n.name not in folded)  # packing runs once per weight version, not per call
    sdpas = [n for n in ns if n.op == "scaled_dot_product_attention"]
    if sdpas:
        sdpa = sdpas[0]
        heads = int(sdpa.out.shape[1])
        inside = set(nodes)
        qkv = tuple(_producing_linear(graph, x, inside, module) for x in sdpa.inputs[:3])
        kv = tuple(dict.fromkeys(_producing_linear(graph, x, inside, module) for s in sdpas for x in s.inputs[1:3]))
        q, k = graph[qkv[0]], graph[qkv[1]]
        self_attn = q.inputs[0] == k.inputs[0]
        return Macro(
            name,
            "attention",
            nodes,
            params,
            module=module,
            in_block=in_block,
            linears=linears,
            width=heads,
            self_attention=self_attn,
            sdpa=sdpa.name,
            qkv=qkv,
            kv=kv,
            packed=packed,
        )
    width = int(graph[linears[0]].out.shape[-1])
    return Macro(
        name, "mlp", nodes, params, module=module, in_block=in_block, linears=linears, width=width, packed=packed
    )


def _producing_linear(graph: Graph, name: str, inside: set[str], module: str) -> str:
    """The linear whose output an SDPA operand is (through views, norms, RoPE, casts): walk the
    first tensor input back. Fused projections (the qkv rewrite) give one linear for several."""
    x = graph[name]
    while x.op != "linear":
        if x.name not in inside or not x.inputs:
            raise StructureError(
                f"{module}: cannot trace {graph[name].location} back to a projection inside the attention"
            )
        x = graph[x.inputs[0]]
    return x.name


# --- enumeration --------------------------------------------------------------------------------------


def axis_sets(axes: tuple[str, ...]) -> list[tuple[str, ...]]:
    """Every subset of the mesh axes (size > 1), in mesh order."""
    return [tuple(c) for r in range(len(axes) + 1) for c in itertools.combinations(axes, r)]


def strategies(
    graph: Graph,
    macro: Macro,
    mesh: MeshSpec,
    tokens,
    *,
    tile: int = 1,
    values: Optional[dict] = None,
    exclude: tuple[str, ...] = (),
    hidden: Optional[int] = None,
) -> tuple[list[Strategy], list[Exclusion]]:
    """Legal strategies of a macro, and the reasons the excluded ones were excluded. With symbolic
    tokens, a split is legal if its guard holds at the example sizes `values` (the plan records it).
    Axes in `exclude` (the CFG batch split) are used by no strategy. `hidden` is the stream's
    hidden size D: given, a block macro with TP axes t is also offered with the stream split
    between macros on D over t (STATE B) and on the tokens over σ + t (sequence-parallel Megatron)."""
    axes = tuple(a for a in mesh.axis_names if mesh.axis_size(a) > 1 and a not in exclude)
    out: list[Strategy] = []
    why: list[Exclusion] = []
    sigmas = axis_sets(axes) if macro.in_block else [()]
    for sigma in sigmas:
        nsp = shard_count(mesh, sigma)
        fit = divides(nsp, tokens)
        guards: tuple[Guard, ...] = ()
        if fit is False:
            why.append(Exclusion(f"SP over {'x'.join(sigma)} ({nsp})", f"{tokens} tokens do not divide"))
            continue
        if isinstance(fit, Guard):
            guards = (Guard(fit.expr, fit.divisor, f"tokens split over {'+'.join(sigma)}"),)
            if values and not guards[0].holds(values):
                why.append(
                    Exclusion(f"SP over {'x'.join(sigma)} ({nsp})", f"{tokens} tokens do not divide at sizes {values}")
                )
                continue
        rest = tuple(a for a in axes if a not in sigma)
        for tp in axis_sets(rest):
            ntp = shard_count(mesh, tp)
            if macro.width % ntp:
                unit = "heads" if macro.kind == "attention" else "features"
                why.append(
                    Exclusion(
                        f"{'head-TP' if macro.kind == 'attention' else 'Megatron'} over {'x'.join(tp)} ({ntp})",
                        f"{macro.width} {unit} do not divide into {ntp}",
                    )
                )
                continue
            base = [(False, fsdp) for fsdp in ((False, True) if sigma else (False,))]
            if macro.kind == "attention" and macro.self_attention and sigma:
                if macro.width % (ntp * nsp):
                    why.append(
                        Exclusion(
                            f"Ulysses over {'x'.join(tp + sigma)} ({ntp * nsp})", f"{macro.width} heads do not divide"
                        )
                    )
                else:
                    base.append((True, False))
            candidates = []
            for stream, extra in _streams(macro, mesh, sigma, tp, tokens, hidden, values, why):
                for ulysses, fsdp in base:
                    candidates.append(_make(graph, macro, mesh, sigma, tp, ulysses, fsdp, guards + extra, stream))
            for s in candidates:
                bad = undivided(graph, mesh, s, values)
                if not bad:
                    s, bad = with_sources(graph, mesh, macro, s)
                if bad:
                    why.append(Exclusion(s.name, bad))
                else:
                    out.append(s)
    return out, why


def family_strategies(
    graph: Graph, macro: Macro, mesh: MeshSpec, tokens, **kwargs
) -> tuple[list[Strategy], list[Exclusion]]:
    """`strategies` of a macro; for a further family's macro (`Macro.parts`), the options every one of
    its blocks has, each one strategy for all of them (parameters and constraints of every block)."""
    if not macro.parts:
        return strategies(graph, macro, mesh, tokens, **kwargs)
    per = [strategies(graph, p, mesh, tokens, **kwargs) for p in macro.parts]
    names = [s.name for s in per[0][0] if all(any(t.name == s.name for t in opts) for opts, _ in per[1:])]
    why = list(dict.fromkeys(x for _, w in per for x in w))
    why += [Exclusion(s.name, f"not legal in every block of {macro.family}") for s in per[0][0] if s.name not in names]
    out = []
    for name in names:
        parts = [next(t for t in opts if t.name == name) for opts, _ in per]
        params = {k: v for t in parts for k, v in t.params.items()}
        forced = {k: v for t in parts for k, v in t.forced.items()}
        guards = tuple(dict.fromkeys(g for t in parts for g in t.guards))
        out.append(dc_replace(parts[0], params=params, forced=forced, guards=guards))
    return out, why


def _streams(macro: Macro, mesh: MeshSpec, sigma, tp, tokens, hidden, values, why) -> list[tuple[Stream, tuple]]:
    """The stream layouts a macro with SP axes σ and TP axes t may read and write, with the guards
    each adds: STATE A always; STATE B and sequence-parallel Megatron for block macros with t."""
    out: list[tuple[Stream, tuple]] = [((tuple(sigma), ()), ())]
    if not macro.in_block or not tp or hidden is None:
        return out
    ntp = shard_count(mesh, tp)
    label = "x".join(tp)
    if hidden % ntp:
        why.append(Exclusion(f"hidden-split stream over {label} ({ntp})", f"hidden size {hidden} does not divide"))
    else:
        out.append(((tuple(sigma), tuple(tp)), ()))
    n = shard_count(mesh, tuple(sigma) + tuple(tp))
    fit = divides(n, tokens)
    if isinstance(fit, Guard):
        fit = Guard(fit.expr, fit.divisor, f"tokens split over {'+'.join(tuple(sigma) + tuple(tp))} between macros")
        if values and not fit.holds(values):
            fit = False
    if fit is False:
        why.append(
            Exclusion(
                f"sequence-parallel stream over {'x'.join(tuple(sigma) + tuple(tp))} ({n})",
                f"{tokens} tokens do not divide",
            )
        )
    else:
        out.append(((tuple(sigma) + tuple(tp), ()), (fit,) if isinstance(fit, Guard) else ()))
    return out


def undivided(graph: Graph, mesh: MeshSpec, s: Strategy, values: Optional[dict] = None) -> Optional[str]:
    """Why `s` splits some tensor unevenly (a parameter it shards or an activation it pins), or None.
    Checked before the solve, so the solver only ever sees options the plan checker accepts (e.g.
    FSDP over batch+model splits a 200-row weight 32 ways: excluded here, not refused after)."""
    for name, lay in list(s.params.items()) + list(s.forced.items()):
        node = graph[name]
        what = f"parameter {node.param}" if node.is_param else f"activation {node.location}"
        for d, (size, axes) in enumerate(zip(node.out.shape, lay.dims)):
            n = shard_count(mesh, axes)
            fit = divides(n, size)
            if fit is False or (isinstance(fit, Guard) and values and not fit.holds(values)):
                return f"{what} dim {d} of size {size} does not split {n} ways over {'+'.join(axes)}"
    return None


def _make(
    graph: Graph, macro: Macro, mesh: MeshSpec, sigma, tp, ulysses: bool, fsdp: bool, guards, stream: Stream
) -> Strategy:
    params: dict[str, Layout] = {}
    fs = sigma if fsdp else ()
    first = macro.linears[0]
    col = macro.linears[:-1] if macro.kind == "attention" else (first,)
    packed = {p.node for p in macro.packed}
    for lin_name in macro.linears:
        lin = graph[lin_name]
        w, b = lin.inputs[1], (lin.inputs[2] if len(lin.inputs) > 2 else None)
        if lin_name in col:
            # A packed weight keeps dim 0 head-aligned (whole q/k/v heads per shard, so the packing
            # needs no communication): its FSDP split joins TP there where the heads allow it (as
            # unfused: the same program), else it goes on the input features.
            aligned = w not in packed or macro.width % shard_count(mesh, tp + fs) == 0
            params[w] = Layout((tp + fs, ())) if aligned else Layout((tp, fs))
            if b:
                params[b] = Layout((tp,))
        else:
            params[w] = Layout((fs, tp))
            if b:
                params[b] = Layout(((),))
    for p in macro.params:
        if p not in params:
            node = graph[p]
            if macro.kind == "attention" and _scales_projection(graph, macro, p):
                params[p] = Layout((tp,))  # norm_q/k gamma split like the TP-split activation it scales
            else:
                params[p] = Layout.replicated(len(node.out.shape))
    forced: dict[str, Layout] = {}
    if macro.in_block and (tp or fsdp or ulysses):
        # Pin every linear's output to the planned layout (tokens on sigma, features on tp; the
        # row-parallel output whole). Without it GSPMD's propagation takes the weight's sharding
        # for the product: with FSDP weights (features over tp+sigma) it all-gathers the tokens
        # instead of the weight and later re-partitions a reshape (measured, docs/planner.md).
        for lin_name in macro.linears:
            lin = graph[lin_name]
            nd = len(lin.out.shape)
            reads_stream = _reads_stream(graph, macro, lin)
            rows = sigma if reads_stream else ()
            feat = tp if lin_name in col else ()
            if lin_name not in col and stream[1]:
                rows, feat = stream  # the row-parallel sums reduce-scattered onto the hidden split
            forced[lin_name] = Layout(((),) * (nd - 2) + (rows, feat))
            if lin_name not in col and stream[0] != tuple(sigma):
                # tokens split further: reduce the sums first (pinned whole above), then slice at
                # the linear's user (attention: to_out's dropout; MLP: the cast), inside the macro —
                # pinned straight onto the tokens, GSPMD instead all-to-alls the input and gathers
                # the weight (measured); the pair is the reduce-scatter
                (user,) = graph.users(lin.name)
                forced[user.name] = Layout(((),) * (len(user.out.shape) - 2) + stream)
            if lin_name in col and reads_stream and stream != (tuple(sigma), ()):
                # the all-gather before the column-parallel linear: its input (the normalised,
                # modulated stream) whole on the dims the stream splits beyond σ
                src = graph[lin.inputs[0]]
                forced[src.name] = Layout(((),) * (len(src.out.shape) - 2) + (tuple(sigma), ()))
    elif not macro.in_block and tp:
        # An embedder's row-parallel output whole, as the rules have it: unpinned, GSPMD merges the
        # all-reduce into a consumer that splits its features (a packed K/V weight's FSDP split on
        # the input features) and reduces axis by axis instead (measured on 2x4).
        last = graph[macro.linears[-1]]
        forced[last.name] = Layout.replicated(len(last.out.shape))
    if macro.kind == "attention" and macro.self_attention and sigma:
        sdpa = graph[macro.sdpa]
        q, k, v = sdpa.inputs[:3]
        if ulysses:
            heads = tp + sigma  # TP split major (DESIGN.md §4: else GSPMD emits collective-permutes)
            for x in (q, k, v):
                forced[x] = Layout(((), heads, (), ()))
                # entry: the (B, L, H, d) operand of each permute stays token-split (after RoPE),
                # so the all-to-all sits exactly at the permute, not inside RoPE's strided writes
                # (through reshapes: a fused projection's V is a getitem of the packed (B, L, H, 3, d)
                # output, which GSPMD would otherwise all-to-all whole, 3x the bytes; measured on 2x4)
                src = graph[graph[x].inputs[0]]
                while src.op in _RESHAPES:
                    src = graph[src.inputs[0]]
                if src.op != "linear" and len(src.out.shape) == 4:
                    forced[src.name] = Layout(((), sigma, tp, ()))
            forced[sdpa.name] = Layout(((), heads, (), ()))  # exit of the head-split region, then back to tokens
            back = next(u for u in graph.users(sdpa.name) if u.op == "permute")
            forced[back.name] = Layout(((), sigma, tp, ()))
        else:
            for lin_name in dict.fromkeys(macro.qkv[1:]):  # K's and V's projections: keep them token-local
                forced[lin_name] = Layout(((), sigma, tp))
            for x in (k, v):
                forced[x] = Layout(((), tp, (), ()))
    name = _name(macro, sigma, tp, ulysses, fsdp, stream)
    return Strategy(name, sigma, tp, ulysses, fsdp, params, forced, guards, stream)


def ring_variant(graph: Graph, macro: Macro, s: Strategy) -> Optional[Strategy]:
    """The ring-attention counterpart of a K/V-gather option `s` of a self-attention with SP (same σ,
    t, FSDP, stream): K and V stay token-split on σ into the attention, whose ring circulates the
    chunks (`planner.ring` prices it); None for any other option (Ulysses, no σ, padded heads)."""
    if macro.kind != "attention" or not macro.self_attention or macro.sdpa is None:
        return None
    if not s.sigma or s.ulysses or s.ring or s.pad_heads:
        return None
    sdpa = graph[macro.sdpa]
    forced = dict(s.forced)
    for x in sdpa.inputs[1:3]:
        forced[x] = Layout(((), s.tp, s.sigma, ()))
    name = _name(macro, s.sigma, s.tp, False, s.fsdp, s.stream, ring=True)
    return dc_replace(s, name=name, forced=forced, ring=True)


def with_sources(graph: Graph, mesh: MeshSpec, macro: Macro, s: Strategy) -> tuple[Strategy, str]:
    """`s` with the source parameters of each packed weight of `macro` laid out like the packed
    value (planner.packing), and ""; or `s` and why the packing cannot keep its layout."""
    params = dict(s.params)
    for p in macro.packed:
        if is_padded(graph, p):
            params.update(padded_source_layouts(graph, p, s.params[p.node]))
            continue
        lays, why = source_layouts(graph, p, s.params[p.node], mesh)
        if why:
            return s, why
        params.update(lays)
    return dc_replace(s, params=params), ""


def _scales_projection(graph: Graph, macro: Macro, param: str) -> bool:
    """Is `param` the gamma of an RMSNorm over a q/k projection's output (norm_q, norm_k)?"""
    for u in graph.users(param):
        if u.op == "rms_norm" and u.name in macro.nodes:
            x = graph[u.inputs[0]]
            while x.op != "linear" and x.inputs and x.name in macro.nodes:
                x = graph[x.inputs[0]]
            if x.name in macro.qkv or x.name in macro.kv:
                return True
    return False


_RESHAPES = ("view", "reshape", "flatten", "unflatten", "squeeze", "unsqueeze")


def _reads_stream(graph: Graph, macro: Macro, lin: Node) -> bool:
    """True unless the linear reads the text states (cross-attention K/V: tokens never split)."""
    return macro.self_attention or lin.name not in macro.kv or lin.name == macro.qkv[0]


def _name(macro: Macro, sigma, tp, ulysses: bool, fsdp: bool, stream: Stream = ((), ()), ring: bool = False) -> str:
    s, t = "x".join(sigma), "x".join(tp)
    if ring:
        base = (f"head-TP({t})+" if tp else "") + f"SP({s})+ring"
    elif ulysses:
        base = f"Ulysses({'+'.join(tp + sigma)})"
    elif macro.kind == "attention":
        base = (
            f"head-TP({t})" + (f"+SP({s})" if sigma else "")
            if tp
            else (f"SP({s})+KV-gather" if sigma and macro.self_attention else f"SP({s})" if sigma else "replicated")
        )
    else:
        base = f"Megatron({t})" + (f"+SP({s})" if sigma else "") if tp else (f"SP({s})" if sigma else "replicated")
    suffix = ""
    if stream[1]:
        suffix = f"+hidden({'x'.join(stream[1])})"
    elif tuple(stream[0]) != tuple(sigma):
        suffix = f"+seq({'x'.join(a for a in stream[0] if a not in sigma)})"
    return base + ("+FSDP" if fsdp else "") + suffix
