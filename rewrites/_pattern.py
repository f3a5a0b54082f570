"""Pattern + replacement: a pass over a fixed subgraph, matched and spliced by ``torch.fx.subgraph_rewriter``.

A pass states the subgraph as a traceable function of its inputs (`Pattern.match`), the preconditions
the structure cannot state (`Pattern.check`: raise `Skip` with the reason, which goes to
`RewriteReport.skipped`; return False for "not this pattern", which is silent), and per match the
replacement, a function of the same arguments (`Pattern.replace`, given the `Match` so a replacement can
read shapes and literals off it). `rewrite_patterns` runs a pass's patterns in order and gives every new
node what capture reads: ``example_value`` (its op run on its inputs' example values, under their
FakeTensorMode) and the ``nn_module_stack``/``stack_trace`` of the match's first op.

Literal arguments (a conv's stride, a norm's dim, a scale) are pattern arguments too: a placeholder
matches any literal, so one pattern covers every value and ``check`` decides which are allowed.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch
import torch.fx as fx
from torch.fx.passes.utils.matcher_utils import InternalMatch
from torch.fx.subgraph_rewriter import replace_pattern_with_filters

from ._core import RewriteReport, Skip, evaluate, fake_mode_of, finish, module_path, note, report, value


class Match:
    """One found subgraph: ``m["x"]`` is the graph node (or literal) bound to the pattern's argument or
    op named ``x`` (FX names: arguments by name, ops as traced, e.g. ``normalize``, ``mul_1``)."""

    def __init__(self, internal: InternalMatch, pattern: fx.Graph) -> None:
        self._by_name = {pn.name: gn for pn, gn in internal.nodes_map.items()}
        ops = [pn for pn in pattern.nodes if pn.op not in ("placeholder", "output")]
        self.nodes = [internal.nodes_map[pn] for pn in ops]
        self.first = self.nodes[0]  # the new nodes' module: where the subgraph starts
        self.inputs = list(internal.placeholder_nodes)

    def __getitem__(self, name: str) -> Any:
        return self._by_name[name]

    def has(self, name: str) -> bool:
        """Whether the pattern has an argument or op called ``name`` (patterns that differ by one op)."""
        return name in self._by_name

    @property
    def path(self) -> str:
        return module_path(self.first)


@dataclass(frozen=True)
class Pattern:
    """A fixed subgraph (``match``), when it may be replaced (``check``), and by what (``replace``)."""

    match: Callable[..., Any]
    replace: Callable[[Match], Callable[..., Any]]
    check: Callable[[Match], Optional[bool]] = lambda m: None


def named(proxy: fx.Proxy, name: str) -> fx.Proxy:
    """In a replacement function: call the node ``proxy`` stands for ``name`` (FX dedups it) in the graph."""
    proxy.node._rename(name)
    return proxy


def rewrite_patterns(gm: fx.GraphModule, name: str, patterns: Sequence[Pattern]) -> RewriteReport:
    """Replace every match of each of ``patterns`` in turn (a subgraph already replaced or left alone is
    not looked at again by a later pattern); report the sites and the reasons."""
    where: list[str] = []
    skipped: list[str] = []
    decided: set[fx.Node] = set()
    for pattern in patterns:
        graph = _as_called(fx.symbolic_trace(pattern.match).graph)

        def accept(internal: InternalMatch, _g, _p, pattern=pattern, graph=graph) -> bool:
            m = Match(internal, graph)
            if decided.intersection(m.nodes):
                return False
            try:
                if pattern.check(m) is False:
                    return False
            except Skip as why:
                skipped.append(note(m.path, why))
                decided.update(m.nodes)
                return False
            where.append(m.path)
            return True

        def build(internal: InternalMatch, _g, _p, pattern=pattern, graph=graph) -> fx.Graph:
            m = Match(internal, graph)
            return _replacement(_trace(pattern.replace(m), graph), m)

        replace_pattern_with_filters(gm, graph, match_filters=[accept], replacement_callback=build)
    finish(gm)
    return report(name, where, skipped)


def _as_called(graph: fx.Graph) -> fx.Graph:
    """The traced pattern as dynamo records the call: without the literal keyword arguments the tracer
    filled in with their defaults (``F.normalize(x, dim=d)`` traces as ``normalize(x, p=2.0, dim=d,
    eps=1e-12, out=None)``; dynamo keeps ``normalize(x, dim=1)``). A literal the pattern cares about is
    one of its arguments."""
    for node in graph.nodes:
        if node.op == "call_function" and node.kwargs:
            node.kwargs = {k: v for k, v in node.kwargs.items() if isinstance(v, fx.Node)}
    return graph


def _trace(replacement: Callable[..., Any], pattern: fx.Graph) -> fx.Graph:
    """The replacement's graph, its placeholders the pattern's (same names, same order): the function is
    called with them as keyword arguments, so it names the ones it reads and takes the rest as ``**_``."""
    tracer = fx.Tracer()
    tracer.graph = graph = fx.Graph()
    tracer.root = torch.nn.Module()
    inputs = {n.name: fx.Proxy(graph.placeholder(n.name), tracer) for n in pattern.nodes if n.op == "placeholder"}
    graph.output(tracer.create_arg(replacement(**inputs)))
    for node in graph.nodes:
        if node.op == "call_function" and node.kwargs:
            node.args, node.kwargs = _positional(node.target, node.args, node.kwargs)
    return graph


def _positional(target: Callable, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``args, kwargs`` with the keyword arguments that can be positional made so, as the replacement's
    code reads (``F.rms_norm(x, shape, w, eps)`` traces through ``__torch_function__`` as
    ``rms_norm(x, shape, weight=w, eps=eps)``)."""
    try:
        params = list(inspect.signature(target).parameters.values())
    except (TypeError, ValueError):
        return args, kwargs
    args, kwargs = list(args), dict(kwargs)
    for p in params[len(args) :]:
        if p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD or p.name not in kwargs:
            break
        args.append(kwargs.pop(p.name))
    return tuple(args), kwargs


def _replacement(graph: fx.Graph, m: Match) -> fx.Graph:
    """``graph`` with each op's meta filled in for the match (FX copies meta when it splices it)."""
    stack = dict(m.first.meta.get("nn_module_stack") or {})
    trace = m.first.meta.get("stack_trace")
    mode = fake_mode_of(m.first.meta.get("example_value"))
    values: dict[fx.Node, Any] = {}
    placeholders = iter(m.inputs)
    for node in graph.nodes:
        if node.op == "placeholder":
            values[node] = value(next(placeholders))
        elif node.op in ("call_function", "call_method"):
            values[node] = evaluate(node.op, node.target, node.args, node.kwargs, lambda a: values.get(a, a), mode)
            node.meta["example_value"] = values[node]
            node.meta["nn_module_stack"] = dict(stack)
            if trace is not None:
                node.meta["stack_trace"] = trace
    return graph
