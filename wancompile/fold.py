"""Constant folding of parameter-only subgraphs: computed once per parameter version, not per call.

Some ops of a captured graph read nothing but parameters/buffers (placeholders with a
``planner.graph.Node.param``) and literals: the ``qkv`` rewrite's weight packing
(``unflatten``/``cat``/``flatten`` of ``to_q/to_k/to_v`` weights), a slice or dtype cast of a buffer.
Lazy tracing re-runs them on every call, so on a device the packing is real work every step
(3 × 5120² elements per attention for A14B). `split_parameter_subgraphs` cuts the (lowered) graph in
two:

* the *fold program*: the parameter-only nodes, taking the parameters it reads and returning the
  values the rest of the graph uses (the boundary);
* the *main program*: the original graph with each boundary value read from a new placeholder
  (appended after the original ones, so the call signature only grows) and the folded nodes gone.

`FoldedValues` runs the fold program on the parameters' XLA copies (already sharded as the plan says),
syncs, and hands the results to every later call with the same parameters. It keeps one entry per
*parameter set* — the identity and ``_version`` of every parameter the fold program reads (like
`wancompile.params.ParamCache`) — so one compiled graph that serves several modules with the same
code (the two Wan 2.2 experts: dynamo passes parameters as inputs, so both run one graph) folds once
per module, not on every switch. An entry goes when a parameter of its set is updated in place
(newer ``_version``) or freed, and beyond `FoldedValues.max_sets` sets the least recently used one
goes; each entry holds its folded values on the device (no more than the parameters they read).
The fold program is its own SPMD computation:
GSPMD propagates the input shardings through it to its outputs, which is what it does to the same
ops in-graph (they sit upstream of everything else), so the main program sees the same shardings.

What is folded — a call node is foldable when
  * every node it reads is a parameter placeholder or foldable (literals are fine), so at least one
    parameter is an ancestor: pure-constant ops (``arange`` masks) stay in-graph for XLA to fold;
  * it is pure and deterministic: no in-place op or ``inplace=``/``out=``, no ``setitem``, nothing
    random (``rand*``, ``dropout``, ``bernoulli``, ``normal``, ...), not a sharding constraint;
  * it moves nothing between host and device (``.to(device)``, ``.cpu()``, ``.item()``, ...) and
    is not a materializing broadcast (``expand``, ``repeat``, ...: XLA fuses those in-graph);
  * no parameter it (transitively) reads is mutated anywhere in the graph;
and a folded value handed to the main program must be a tensor no larger than the parameters it
reads plus the zeros its constant ``pad`` ops add (the ``pad_heads`` rewrite's padded weights; no folded
``expand``/broadcast materializing more than the weights: XLA fuses those), and, for a target that refuses
a program result split over several mesh axes out of mesh order (tt-mlir), not pinned so.
Views of one parameter (``.t()``, ``.float()``, a slice) fold under the same rules. A sharding
constraint on a folded value (the auto plan pins a packed projection weight, planner/packing.py)
moves into the fold program with it, so the value leaves the fold program with the plan's layout
and the main program reads exactly that sharding, not what GSPMD propagated.
"""

from __future__ import annotations

import operator
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch
import torch.fx as fx

from wancompile.constraints import constrain, weight_read

_RANDOM = (
    "rand",
    "dropout",
    "bernoulli",
    "normal",
    "uniform",
    "multinomial",
    "poisson",
    "exponential",
    "cauchy",
    "geometric",
    "seed",
)


@dataclass
class FoldSplit:
    """A graph cut into its parameter-only part and the rest."""

    fold: fx.GraphModule  # fold(*args[i] for i in sources) -> tuple of folded values
    main: fx.GraphModule  # main(*args, *folded values)
    sources: list[int]  # argument positions the fold program reads
    main_reads: list[bool]  # per original argument: does the main program still read it
    folded: list[str] = field(default_factory=list)  # boundary node names, in fold output order
    nodes: list[str] = field(default_factory=list)  # every folded node's name

    def sources_of(self, params: Sequence[Optional[str]]) -> list[tuple[str, ...]]:
        """Per folded value, in output order: the names in `params` (per original argument) of the
        arguments it is computed from."""
        placeholders = [n for n in self.fold.graph.nodes if n.op == "placeholder"]
        name = {ph: params[i] for ph, i in zip(placeholders, self.sources)}
        (out,) = [n for n in self.fold.graph.nodes if n.op == "output"]
        result = []
        for value in out.args[0]:
            seen, stack, found = set(), [value], []
            while stack:
                n = stack.pop()
                if not isinstance(n, fx.Node) or n in seen:
                    continue
                seen.add(n)
                if n in name and name[n]:
                    found.append(name[n])
                stack.extend(n.all_input_nodes)
            result.append(tuple(sorted(set(found))))
        return result


def _name(node: fx.Node) -> str:
    return node.target if node.op == "call_method" else getattr(node.target, "__name__", str(node.target))


def _mutates(node: fx.Node) -> bool:
    if node.op not in ("call_function", "call_method"):
        return False
    if node.target is operator.setitem or node.kwargs.get("inplace") is True or node.kwargs.get("out") is not None:
        return True
    name = _name(node)
    return name.endswith("_") and not name.startswith("_")


# Materializing broadcasts: folded, they would store more than the weights (XLA fuses them in-graph).
_BROADCASTS = {"expand", "expand_as", "broadcast_to", "repeat", "tile", "repeat_interleave"}
# Host/device transfers and host reads: they must stay where the graph put them.
_TRANSFERS = {"cpu", "cuda", "numpy", "tolist", "item", "pin_memory"}


def moves_to_host(node: fx.Node) -> bool:
    """Does this FX node copy a value off the XLA device (``.cpu()``, ``.item()``, ``.to(<device>)``, ...)?"""
    return node.op in ("call_method", "call_function") and (_name(node) in _TRANSFERS or _moves_device(node))


def _moves_device(node: fx.Node) -> bool:
    if node.op == "call_method" and node.target in ("to", "type"):
        return "device" in node.kwargs or any(isinstance(a, (torch.device, str)) for a in node.args[1:])
    return False


def _pure(node: fx.Node) -> bool:
    if node.op not in ("call_function", "call_method") or node.target in (constrain, weight_read) or _mutates(node):
        return False
    if _name(node) in _BROADCASTS or _name(node) in _TRANSFERS or _moves_device(node):
        return False
    name = _name(node).lower()
    return not any(word in name for word in _RANDOM)


def _numel(node: fx.Node) -> Optional[int]:
    v = node.meta.get("example_value")
    if not isinstance(v, torch.Tensor):
        return None
    try:
        return int(v.numel())
    except Exception:  # symbolic size
        return None


def _zero_pad(node: fx.Node) -> bool:
    """A constant zero ``F.pad`` (rewrites/pad_heads.py pads weights with zero heads)."""
    if _name(node) != "pad" or node.op != "call_function":
        return False
    mode = node.kwargs.get("mode", node.args[2] if len(node.args) > 2 else "constant")
    value = node.kwargs.get("value", node.args[3] if len(node.args) > 3 else None)
    return mode == "constant" and value in (None, 0, 0.0)


def _allowed(sources: set, pads: set) -> int:
    """Elements a folded value may hold: its parameters', plus the zeros its constant pads add."""
    zeros = sum((_numel(p) or 0) - (_numel(p.args[0]) or 0) for p in pads)
    return sum(_numel(s) or 0 for s in sources) + zeros


def _out_of_order(node: fx.Node, axis_names: Sequence[str]) -> bool:
    """Whether a constraint of `node` splits a dim over several mesh axes out of mesh order."""
    order = {a: i for i, a in enumerate(axis_names)}
    return any(
        isinstance(axes, tuple) and list(axes) != sorted(axes, key=lambda a: order.get(a, -1))
        for u in node.users
        if u.target is constrain
        for axes in u.args[2]
    )


def _upstream(node: fx.Node, within: set) -> set:
    """`node` and the nodes of `within` it is computed from."""
    out, stack = set(), [node]
    while stack:
        n = stack.pop()
        if n not in out:
            out.add(n)
            stack.extend(i for i in n.all_input_nodes if i in within)
    return out


def split_parameter_subgraphs(
    gm: fx.GraphModule, params: Sequence[Optional[str]], results_in_order: Optional[Sequence[str]] = None
) -> Optional[FoldSplit]:
    """Cut `gm` (whose placeholders, in order, hold the parameters named in `params`, None for inputs)
    into a fold program and a main program; None when nothing can be folded (then use `gm` as is).
    `results_in_order`: the mesh's axis names, where the target's compiler refuses a program result split
    over several axes out of mesh order (`planner.targets.Target.results_in_mesh_order`; tt-mlir: "Failed to
    parse output sharding ... T(1,0)"): a value pinned so stays in the main program with all it is computed
    from, where that layout compiles (and tt-mlir computes a parameter-only value once itself, by const-eval)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(params):
        raise ValueError(f"{len(placeholders)} placeholders but {len(params)} parameter names")
    sources = {n for n, p in zip(placeholders, params) if p is not None}
    # A parameter mutated in-graph (directly or through a view) is not a constant.
    mutated = {n.args[0] for n in gm.graph.nodes if _mutates(n) and n.args and isinstance(n.args[0], fx.Node)}
    banned: set[fx.Node] = set()
    while True:
        foldable: set[fx.Node] = set()
        ancestors: dict[fx.Node, set[fx.Node]] = {}
        pads: dict[fx.Node, set[fx.Node]] = {}  # the zero pads among a folded value's ops
        for node in gm.graph.nodes:
            inputs = node.all_input_nodes
            if (
                _pure(node)
                and inputs
                and node not in banned
                and all(i in foldable or (i in sources and i not in banned) for i in inputs)
            ):
                foldable.add(node)
                ancestors[node] = set().union(*(ancestors.get(i, {i}) for i in inputs))
                pads[node] = set().union(*(pads.get(i, set()) for i in inputs)) | ({node} if _zero_pad(node) else set())
        bad_sources = {s for n in mutated for s in (ancestors.get(n, {n}) if (n in foldable or n in sources) else ())}
        moved = {u for n in foldable for u in n.users if u.target is constrain}  # constraints of folded values
        boundary = [
            n for n in gm.graph.nodes if n in foldable and any(u not in foldable and u not in moved for u in n.users)
        ]
        stay = [n for n in boundary if _numel(n) is None or _numel(n) > _allowed(ancestors[n], pads[n])]
        if results_in_order is not None:  # with all it is computed from: no part of it a result either
            stay += [u for n in boundary if _out_of_order(n, results_in_order) for u in _upstream(n, foldable)]
        if not (bad_sources - banned) and not stay:
            break
        banned |= bad_sources | set(stay)
    if not boundary:
        return None

    # The fold program: the source placeholders it reads, the foldable nodes, the boundary values out.
    fold_graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    read = sorted({s for n in boundary for s in ancestors[n]}, key=placeholders.index)
    for s in read:
        env[s] = fold_graph.placeholder(s.name)
        env[s].meta = dict(s.meta)
    for node in gm.graph.nodes:
        if node in foldable:
            env[node] = fold_graph.node_copy(node, lambda n: env[n])
        elif node in moved:
            fold_graph.node_copy(node, lambda n: env[n])
    fold_graph.output(tuple(env[n] for n in boundary))
    fold = fx.GraphModule(gm, fold_graph)

    # The main program: one placeholder per boundary value, after the original ones.
    main = fx.GraphModule(gm, gm.graph.__deepcopy__())
    by_name = {n.name: n for n in main.graph.nodes}
    last = [n for n in main.graph.nodes if n.op == "placeholder"][-1]
    for node in reversed(boundary):
        with main.graph.inserting_after(last):
            ph = main.graph.placeholder(f"folded_{node.name}")
        ph.meta = dict(node.meta)
        by_name[node.name].replace_all_uses_with(ph)
    folded_names = {n.name for n in foldable | moved}
    for node in reversed(list(main.graph.nodes)):
        if node.name in folded_names:
            main.graph.erase_node(node)
    main.graph.lint()
    main.recompile()
    main_placeholders = [n for n in main.graph.nodes if n.op == "placeholder"][: len(placeholders)]
    return FoldSplit(
        fold=fold,
        main=main,
        sources=[placeholders.index(s) for s in read],
        main_reads=[bool(n.users) for n in main_placeholders],
        folded=[n.name for n in boundary],
        nodes=[n.name for n in gm.graph.nodes if n in foldable],
    )


class FoldedValues:
    """The fold program's results, computed on the device once per parameter set and version."""

    max_sets = 4  # parameter sets kept (2 Wan 2.2 experts + headroom); least recently used goes first

    def __init__(self, split: FoldSplit) -> None:
        self.split = split
        # (id, _version) of each source argument -> (weak references to them, their folded values)
        self._sets: OrderedDict[tuple, tuple[list[weakref.ref], list[torch.Tensor]]] = OrderedDict()
        self._values: list[torch.Tensor] = []  # the values of the last call's set
        self.runs = 0  # how many times the fold program ran (tests, logs)
        self.graph_hash: Optional[bytes] = None  # XLA's compile-cache key of the last run (wancompile.hlo_record)

    def _key(self, args: Sequence[Any]) -> tuple:
        return tuple((id(args[i]), args[i]._version) for i in self.split.sources)

    def _alive(self, refs: list[weakref.ref], args: Sequence[Any]) -> bool:
        return all(ref() is args[i] for i, ref in zip(self.split.sources, refs))

    def get(
        self,
        args: Sequence[Any],
        device_arg: Callable[[int], torch.Tensor],
        sink: Optional[Callable[[list[torch.Tensor], list[torch.Tensor]], None]] = None,
    ) -> list[torch.Tensor]:
        """Folded values for the call's arguments `args` (host or XLA); `device_arg(i)` gives argument
        i on the device, sharded as the plan says; `sink` is handed the fold program's traced values and
        its inputs (those of `split.sources`) before they are computed (`ShardedProgram.stablehlo_sink`)."""
        key = self._key(args)
        hit = self._sets.get(key)
        if hit is not None and self._alive(hit[0], args):
            self._sets.move_to_end(key)
            self._values = hit[1]
            return hit[1]
        import torch_xla

        # Drop what can never hit again: sets with a freed parameter, older versions of this set.
        ids = {i for i, _ in key}
        for k, (refs, _) in list(self._sets.items()):
            if any(r() is None for r in refs) or {i for i, _ in k} == ids:
                del self._sets[k]
        inputs = [device_arg(i) for i in self.split.sources]
        # clone: a view (``flatten`` of the ``cat``) would keep its base alive as pending IR, which the
        # next sync would compute again as an extra output of the main program.
        values = [v.clone() for v in self.split.fold(*inputs)]
        if sink is not None:
            sink(values, inputs)
        self.graph_hash = torch_xla._XLAC._get_graph_hash(values)
        torch_xla._XLAC._xla_sync_multi(values, [], wait=True)
        self._sets[key] = ([weakref.ref(args[i]) for i in self.split.sources], values)
        while len(self._sets) > self.max_sets:
            self._sets.popitem(last=False)
        self._values = values
        self.runs += 1
        return values

    def cached_sets(self) -> int:
        """How many parameter sets have folded values cached now."""
        return len(self._sets)
