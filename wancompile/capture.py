"""Capture: dynamo FX graph -> the planner's annotated `planner.graph.Graph`.

Dynamo hands a backend a flat FX graph whose parameters are placeholders with mangled names
(``L_self_modules_blocks_modules_0_modules_attn1_modules_to_q_parameters_weight_``) and whose nodes
carry ``meta["example_value"]`` (a FakeTensor, or a tuple of them) and ``meta["nn_module_stack"]``.
This module turns that into plain data: op kind, output shapes/dtypes (sympy for symbolic dims),
module path, fully qualified parameter names, the repeated block each op belongs to, and a stable
`Location` per node.

`capture_module` runs dynamo itself (``fullgraph=True``) and is how the CLI plans full-size models
on the meta device; the backend calls `annotate` on the graph it is given.
"""

from __future__ import annotations

import operator
import re
from collections import defaultdict
from typing import Any, Callable, Optional

import torch
import torch.fx as fx

from planner.graph import Graph, Location, Node, TensorMeta

# Modules whose instances repeat with identical structure; each instance is one "block" and the
# planner may share ILP variables across blocks of equal shape.
REPEATED_BLOCK_CLASSES = frozenset(
    {"WanTransformerBlock", "WanVACETransformerBlock", "WanResidualBlock", "WanAttentionBlock"}
)

_PLACEHOLDER_KINDS = ("modules", "parameters", "buffers")


class CaptureError(RuntimeError):
    """The model could not be captured as one graph; the message says what broke and what to do."""


# --- names -----------------------------------------------------------------------------------------


def param_fqn(placeholder_target: str) -> Optional[str]:
    """``L_self_modules_blocks_modules_0_modules_attn1_modules_to_q_parameters_weight_`` ->
    ``blocks.0.attn1.to_q.weight``; None for placeholders that are not parameters or buffers."""
    m = re.match(r"^L_self_(.*)_$", placeholder_target)
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


def module_path(stack_entry: str) -> str:
    """``L['self']._modules['blocks']._modules['1'].attn2.to_k`` -> ``blocks.1.attn2.to_k``."""
    s = re.sub(r"^L\['self'\]", "", stack_entry)
    s = re.sub(r"^L__self__", "", s)
    s = re.sub(r"\._modules\['([^']*)'\]", r".\1", s)
    s = re.sub(r"\['([^']*)'\]", r".\1", s)
    s = re.sub(r"getattr\(([^,]*), '([^']*)'\)", r"\1.\2", s)
    return s.lstrip(".")


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

    # Module path and repeated-block root for each op, from dynamo's nn_module_stack.
    paths: dict[str, str] = {}
    block_root: dict[str, str] = {}
    for n in nodes:
        stack = list((n.meta.get("nn_module_stack") or {}).values())
        paths[n.name] = module_path(stack[-1][0]) if stack else ""
        for entry, cls in stack:
            if getattr(cls, "__name__", str(cls)) in REPEATED_BLOCK_CLASSES:
                block_root[n.name] = module_path(entry)
                break
    block_index: dict[str, int] = {}  # numbered per family (blocks.N and vace_blocks.N each from 0)
    for n in nodes:
        root = block_root.get(n.name)
        if root is not None and root not in block_index and n.op != "placeholder":
            block_index[root] = sum(_block_prefix(r) == _block_prefix(root) for r in block_index)

    occurrences: dict[tuple[str, str], int] = defaultdict(int)
    out: list[Node] = []
    for n in nodes:
        kind = op_kind(n)
        param = param_fqn(str(n.target)) if n.op == "placeholder" else None
        if n.op == "placeholder":
            module = param.rsplit(".", 1)[0] if param and "." in param else ""
            block = _block_of(module, block_index)
            attrs = {"input": input_name(str(n.target))} if param is None else {}
        else:
            module = paths[n.name]
            root = block_root.get(n.name)
            block = block_index.get(root) if root is not None else None
            attrs = {"args": _jsonable(n.args), "kwargs": _jsonable(dict(n.kwargs))} if n.op != "output" else {}
        loc_key = (module, kind)
        location = Location(module, kind, occurrences[loc_key])
        occurrences[loc_key] += 1
        inputs: list[str] = []
        fx.node.map_arg((n.args, n.kwargs), lambda a: inputs.append(a.name))  # noqa: B023 (called here)
        value = n.meta.get("example_value", n.meta.get("val"))
        if n.op == "output":
            value = [a.meta.get("example_value") for a in n.all_input_nodes]
        out.append(Node(n.name, kind, tuple(inputs), tensor_metas(value), module, location, param, block, attrs))

    prefixes = tuple(sorted({_block_prefix(p) for p in block_index}))
    return Graph(out, model=model, block_prefixes=prefixes)


def _block_of(module: str, block_index: dict[str, int]) -> Optional[int]:
    for root, i in block_index.items():
        if module == root or module.startswith(root + "."):
            return i
    return None


def _block_prefix(root: str) -> str:
    return re.sub(r"\.\d+$", "", root)


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
