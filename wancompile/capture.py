"""Capture: dynamo FX graph -> the planner's annotated `planner.graph.Graph`.

Dynamo hands a backend a flat FX graph whose parameters are placeholders with mangled names
(``L_self_modules_blocks_modules_0_modules_attn1_modules_to_q_parameters_weight_``) and whose nodes
carry ``meta["example_value"]`` (a FakeTensor, or a tuple of them) and ``meta["nn_module_stack"]``.
This module turns that into plain data: op kind, output shapes/dtypes (sympy for symbolic dims),
module path, fully qualified parameter names, the repeated block each op belongs to (its family, the
stack prefix, and its index there), and a stable `Location` per node.

Repeated blocks are found by structure, not by class name (`find_blocks`): a child ``prefix.<int>`` of
a module list is a block when attention runs inside it (``scaled_dot_product_attention``), or when it
is a residual block (an ``add`` in the child itself reading a convolution inside it: the Wan VAE's
``WanResidualBlock``, which the VAE planner finds by path). Its siblings in the graph are blocks of
the same family when their parameters match it up to the block index.

`capture_module` runs dynamo itself (``fullgraph=True``) and is how the CLI plans full-size models
on the meta device; the backend calls `annotate` on the graph it is given.
"""

from __future__ import annotations

import operator
import re
from collections import Counter, defaultdict
from typing import Any, Callable, Optional

import torch
import torch.fx as fx

from planner.errors import Error
from planner.graph import BlockFamily, Graph, Location, Node, TensorMeta
from rewrites._core import stack_path as module_path  # the one reading of an nn_module_stack entry

_PLACEHOLDER_KINDS = ("modules", "parameters", "buffers")


class CaptureError(Error, RuntimeError):
    """The model could not be captured as one graph; the message says what broke and what to do."""


# --- names -----------------------------------------------------------------------------------------


def param_fqn(placeholder_target: str) -> Optional[str]:
    """``L_self_modules_blocks_modules_0_modules_attn1_modules_to_q_parameters_weight_`` ->
    ``blocks.0.attn1.to_q.weight``; None for placeholders that are not parameters or buffers. Dynamo
    names the compiled module ``self``, or ``fn`` when it traces the module's call itself (an
    ``nn.Sequential``: ``L_fn_modules_0_parameters_weight_`` -> ``0.weight``)."""
    m = re.match(r"^L_(?:self|fn)_(.*)_$", placeholder_target)
    if not m:
        return None
    body = "_" + m.group(1)
    parts = re.split(r"_(modules|parameters|buffers)_", body)
    # re.split keeps the separators: ['', 'modules', 'blocks', 'modules', '0', ..., 'parameters', 'weight']
    if parts[0] != "" or len(parts) < 3 or parts[-2] not in ("parameters", "buffers"):
        return None
    return ".".join(parts[2::2])


def input_name(placeholder_target: str) -> str:
    """``L_args_0_`` -> ``args.0``, ``L_kwargs_encoder_hidden_states_`` -> ``kwargs.encoder_hidden_states``."""
    name = re.sub(r"^L_", "", placeholder_target).rstrip("_")
    m = re.match(r"^(args|kwargs)_(.*)$", name)
    return f"{m.group(1)}.{m.group(2)}" if m else name


# --- values ----------------------------------------------------------------------------------------


def _dim(d: Any) -> Any:
    if isinstance(d, torch.SymInt):
        expr = d.node.expr
        return int(expr) if expr.is_number else expr
    return int(d)


def _dtype(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def tensor_metas(value: Any) -> tuple[TensorMeta, ...]:
    if isinstance(value, torch.Tensor):
        return (TensorMeta(tuple(_dim(d) for d in value.shape), _dtype(value.dtype)),)
    if isinstance(value, (tuple, list)):
        return tuple(m for v in value for m in tensor_metas(v))
    return ()


def _jsonable(a: Any) -> Any:
    if isinstance(a, fx.Node):
        return {"node": a.name}
    if isinstance(a, (list, tuple)):
        return [_jsonable(x) for x in a]
    if isinstance(a, dict):
        return {str(k): _jsonable(v) for k, v in a.items()}
    if isinstance(a, slice):
        return {"slice": [_jsonable(a.start), _jsonable(a.stop), _jsonable(a.step)]}
    if a is Ellipsis:
        return "..."
    if isinstance(a, (bool, int, float, str)) or a is None:
        return a
    if isinstance(a, torch.SymInt):
        return str(_dim(a))
    if isinstance(a, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return str(a)
    return repr(a)


def _index_jsonable(index: Any) -> Any:
    """A getitem/setitem index as data. A Python list is an advanced index (``x[[0, -1]]`` takes rows 0
    and -1 of dim 0), a tuple one item per dim (``x[0, -1]``): the list is kept apart as
    ``{"list": [...]}`` (`planner.rules.index`), where `_jsonable` would make both the same list."""
    if isinstance(index, list):
        return {"list": _jsonable(index)}
    if isinstance(index, tuple):
        return [{"list": _jsonable(it)} if isinstance(it, list) else _jsonable(it) for it in index]
    return _jsonable(index)


def _args_jsonable(kind: str, args: tuple) -> Any:
    if kind in ("getitem", "setitem") and len(args) > 1:
        return [_jsonable(args[0]), _index_jsonable(args[1]), *(_jsonable(a) for a in args[2:])]
    return _jsonable(args)


_OP_ALIASES = {
    operator.getitem: "getitem",
    operator.setitem: "setitem",
    operator.add: "add",
    operator.sub: "sub",
    operator.mul: "mul",
    operator.truediv: "truediv",
    operator.floordiv: "floordiv",
    operator.neg: "neg",
    operator.pow: "pow",
    operator.iadd: "add",
    operator.imul: "mul",
    operator.matmul: "matmul",
}


def op_kind(node: fx.Node) -> str:
    """The op's kind: function or method name, normalised (``torch.nn.functional.linear`` -> ``linear``)."""
    if node.op in ("placeholder", "output", "get_attr"):
        return node.op
    if node.op == "call_method":
        return str(node.target)
    if node.op == "call_module":
        return f"module:{node.target}"
    target = node.target
    if target in _OP_ALIASES:
        return _OP_ALIASES[target]
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.name.split("::")[-1] + (
            "" if target._overloadname == "default" else f".{target._overloadname}"
        )
    return getattr(target, "__name__", str(target))


# --- the annotation pass -----------------------------------------------------------------------------


def annotate(gm: fx.GraphModule, model: str = "") -> Graph:
    """Build the planner's graph from a dynamo GraphModule (no execution, no weights needed)."""
    nodes = list(gm.graph.nodes)
    paths: dict[str, str] = {}
    for n in nodes:
        stack = list((n.meta.get("nn_module_stack") or {}).values())
        paths[n.name] = module_path(stack[-1][0]) if stack else ""
    params = {
        fqn: tensor_metas(n.meta.get("example_value", n.meta.get("val")))
        for n in nodes
        if n.op == "placeholder" and (fqn := param_fqn(str(n.target)))
    }
    families = find_blocks(
        [(n.name, op_kind(n), paths.get(n.name, ""), [a.name for a in n.all_input_nodes]) for n in nodes], params
    )
    roots = {f"{f.prefix}.{i}": (f.prefix, i) for f in families for i in f.indices}

    occurrences: dict[tuple[str, str], int] = defaultdict(int)
    out: list[Node] = []
    for n in nodes:
        kind = op_kind(n)
        param = param_fqn(str(n.target)) if n.op == "placeholder" else None
        if n.op == "placeholder":
            module = param.rsplit(".", 1)[0] if param and "." in param else ""
            attrs = {"input": input_name(str(n.target))} if param is None else {}
        else:
            module = paths[n.name]
            attrs = (
                {"args": _args_jsonable(kind, n.args), "kwargs": _jsonable(dict(n.kwargs))} if n.op != "output" else {}
            )
        family, block = _member_of(module, roots) if n.op != "output" else (None, None)
        loc_key = (module, kind)
        location = Location(module, kind, occurrences[loc_key])
        occurrences[loc_key] += 1
        inputs: list[str] = []
        fx.node.map_arg((n.args, n.kwargs), lambda a: inputs.append(a.name))  # noqa: B023 (called here)
        value = n.meta.get("example_value", n.meta.get("val"))
        if n.op == "output":
            value = [a.meta.get("example_value") for a in n.all_input_nodes]
        out.append(
            Node(n.name, kind, tuple(inputs), tensor_metas(value), module, location, param, block, attrs, family)
        )
    return Graph(out, model=model, block_prefixes=tuple(f.prefix for f in families), families=families)


# --- repeated blocks, by structure --------------------------------------------------------------------

_ATTENTION_OPS = frozenset({"scaled_dot_product_attention"})
_CONV_OPS = frozenset({"conv3d", "conv2d", "conv1d"})


def _roots(module: str) -> list[str]:
    """Every ``prefix.<int>`` the module path sits under, outermost first:
    ``decoder.up_blocks.0.resnets.1.conv2`` -> ``[decoder.up_blocks.0, decoder.up_blocks.0.resnets.1]``."""
    parts = module.split(".") if module else []
    return [".".join(parts[: i + 1]) for i in range(1, len(parts)) if parts[i].isdigit()]


def _under(module: str, root: str) -> bool:
    return module == root or module.startswith(root + ".")


def find_blocks(
    ops: list[tuple[str, str, str, list[str]]], params: dict[str, tuple[TensorMeta, ...]]
) -> tuple[BlockFamily, ...]:
    """The repeated-block families of a graph, from its ops ``(name, op kind, module path, input
    names)`` and its parameters (fully qualified name -> metadata).

    A child ``prefix.<int>`` is a block when attention runs inside it (the innermost such child), or
    when an ``add`` in the child itself reads a convolution inside it (a residual block). Its siblings
    whose parameters match it up to the block index (same relative names, shapes and dtypes) are
    blocks of the same family too (a block captured only in part, e.g. across a graph break).
    Members whose parameters differ from the family's most common set are listed in `BlockFamily.odd`
    (VACE's first ``vace_blocks`` entry has an input projection the others lack)."""
    module_of = {name: module for name, _, module, _ in ops}
    kind_of = {name: kind for name, kind, _, _ in ops}
    evidence: dict[str, str] = {}  # root -> "attention" | "residual"
    for _, kind, module, inputs in ops:
        roots = _roots(module)
        if kind in _ATTENTION_OPS and roots:
            evidence.setdefault(roots[-1], "attention")
        elif kind == "add" and roots and roots[-1] == module:
            if any(kind_of.get(i) in _CONV_OPS and _under(module_of[i], module) for i in inputs):
                evidence.setdefault(module, "residual")

    signatures: dict[str, set] = defaultdict(set)  # candidate root -> {(relative name, metadata)}
    for fqn, metas in params.items():
        for root in _roots(fqn.rsplit(".", 1)[0]):
            signatures[root].add((fqn[len(root) :], metas))
    candidates: dict[str, set[int]] = defaultdict(set)  # stack prefix -> indices seen in the graph
    for module in [*module_of.values(), *(f.rsplit(".", 1)[0] for f in params)]:
        for root in _roots(module):
            prefix, index = root.rsplit(".", 1)
            candidates[prefix].add(int(index))

    families: list[BlockFamily] = []
    for prefix in sorted({r.rsplit(".", 1)[0] for r in evidence}):
        sig = {i: frozenset(signatures.get(f"{prefix}.{i}", ())) for i in candidates[prefix]}
        shown = {i for i in candidates[prefix] if f"{prefix}.{i}" in evidence}
        alike = {sig[i] for i in shown if sig[i]}
        members = sorted(shown | {i for i in candidates[prefix] if sig[i] and sig[i] in alike})
        counts = Counter(sig[i] for i in members if sig[i])
        common = max(counts, key=lambda s: (counts[s], -min(i for i in members if sig[i] == s)), default=None)
        odd = tuple(i for i in members if sig[i] and sig[i] != common)
        families.append(BlockFamily(prefix, tuple(members), odd))
    return tuple(families)


def _member_of(module: str, roots: dict[str, tuple[str, int]]) -> tuple[Optional[str], Optional[int]]:
    """(family prefix, block index) of the innermost block `module` sits in, else (None, None)."""
    for root in reversed(_roots(module)):
        if root in roots:
            return roots[root]
    return None, None


# --- running dynamo ----------------------------------------------------------------------------------


def record_graphs(fn: Callable, *args: Any, fullgraph: bool = False, **kwargs: Any) -> list[fx.GraphModule]:
    """Every GraphModule dynamo hands a backend for `fn(*args, **kwargs)` (the recording backend
    runs them eagerly), in order; with graph breaks there are several."""
    graphs: list[fx.GraphModule] = []

    def record(gm: fx.GraphModule, example_inputs: list) -> Callable:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    try:
        with torch.no_grad():
            torch.compile(fn, backend=record, fullgraph=fullgraph, dynamic=False)(*args, **kwargs)
    finally:
        torch._dynamo.reset()
    return graphs


def capture_fx(fn: Callable, *args: Any, **kwargs: Any) -> fx.GraphModule:
    """Trace `fn(*args, **kwargs)` with dynamo into exactly one GraphModule. Raises CaptureError
    naming the graph break if dynamo cannot capture one graph."""
    try:
        graphs = record_graphs(fn, *args, fullgraph=True, **kwargs)
    except torch._dynamo.exc.Unsupported as e:
        raise CaptureError(
            f"dynamo could not capture {getattr(fn, '__qualname__', fn)!r} as one graph: {str(e).splitlines()[0]}. "
            "wan_autoshard plans whole graphs; remove the Python-side control flow that breaks the graph "
            "(for the VAE, call wancompile.enable_full_t(vae) first)."
        ) from e
    if len(graphs) != 1:
        raise CaptureError(f"expected one captured graph, got {len(graphs)}")
    return graphs[0]


def capture_module(module: torch.nn.Module, *args: Any, model: str = "", **kwargs: Any) -> tuple[Graph, fx.GraphModule]:
    """Capture `module(*args, **kwargs)` (tensors may live on the meta device) and annotate it."""
    gm = capture_fx(module, *args, **kwargs)
    graph = annotate(gm, model=model or type(module).__name__)
    _check_params(graph, module)
    return graph, gm


def _check_params(graph: Graph, module: torch.nn.Module) -> None:
    known = {n for n, _ in module.named_parameters()} | {n for n, _ in module.named_buffers()}
    unknown = [n.param for n in graph.params() if n.param not in known]
    if unknown:
        raise CaptureError(
            f"capture produced parameter names the module does not have: {unknown[:3]}; "
            "dynamo's placeholder naming changed — update wancompile.capture.param_fqn"
        )


def unannotated(graph: Graph) -> list[str]:
    """Nodes missing an annotation the planner needs (empty list when capture is complete)."""
    bad = []
    for n in graph:
        if n.op in ("output",):
            continue
        if n.op == "placeholder" and not n.outputs:
            bad.append(f"{n.name}: placeholder without tensor metadata")
        if n.op != "placeholder" and n.block is None and n.module.startswith(graph.block_prefixes or ("\0",)):
            bad.append(f"{n.name}: inside {n.module} but no block index")
    return bad
