"""Macro-strategies: the choices the ILP makes, one per Megatron pair or attention.

A macro (`planner.macros.Macro`) is an attention or a two-linear MLP of the DiT's block structure,
found by dataflow in `planner.structure` (its names are re-exported here for existing callers).

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
from planner.packing import is_padded, padded_source_layouts, source_layouts
from planner.placements import Guard, Layout, divides, shard_count
from planner.plan import Exclusion
from planner.structure import Family, Structure, StructureError, block_stack_entry, dit_graph, family_of, find_structure

__all__ = ["Family", "Macro", "Structure", "StructureError", "block_stack_entry", "dit_graph", "family_of"]
__all__ += ["find_structure", "Strategy", "axis_sets", "family_strategies", "ring_variant", "strategies"]
__all__ += ["stream_state", "undivided", "with_sources"]

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
