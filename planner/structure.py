"""The DiT's block structure: which ops are the repeated block, its macros, prologue and epilogue.

A DiT block is found by structure, not by name lists: inside the repeated block, a child module that
runs ``scaled_dot_product_attention`` is an **attention** macro (its to_q/k/v, norm_q/k, RoPE, SDPA and
to_out all switch together); a child with two linears and no attention is an **MLP** macro (a
col -> row Megatron pair); root modules with exactly two linears (the time/text embedders) are MLP
macros too. Everything else in the block (norms, adaLN modulation, residual adds) is glue that follows
the stream layout of the next macro — Alpa's follower merging, by construction. An attention's
projections are found by dataflow too (each SDPA operand walked back to the linear producing it), so
the ``qkv`` rewrite's fused projections plan like the three they replace; their packed weights are
laid out as parameters (`planner.packing`). Further block stacks (VACE's ``vace_blocks``) are
`Family` records of the `Structure`. The options of each macro are `planner.strategies`'.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from planner.errors import Error
from planner.graph import Graph, Node
from planner.macros import Macro
from planner.packing import packed_operand


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


class StructureError(Error, ValueError):
    """A module structure the planner cannot read as blocks; the message says where."""


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
