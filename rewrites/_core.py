"""What every pass shares: the context and report types, and the FX plumbing that keeps capture's meta.

Capture reads two fields off every node: ``meta["example_value"]`` (a FakeTensor, or a real or meta
tensor, whose shape and dtype it records) and ``meta["nn_module_stack"]`` (the module path). Nodes a
pass creates go through `Emitter`, which computes the first by running the op on its inputs' example
values (under their FakeTensorMode when they are fake, on the meta device otherwise) and copies the
second from the node being replaced.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Union

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils import _pytree as pytree


@dataclass(frozen=True)
class RewriteContext:
    """What the passes need to know about the target that the graph cannot tell them."""

    sp_multiple: int = 1  # sp_pad pads the token dim to a multiple of this; 1 turns it off
    # the target's compiler runs a rotate-half RoPE on [B, heads, tokens, head_dim] as one kernel (tt-mlir:
    # ttnn.rotary_embedding), so rope writes that form
    rotary_kernel: bool = False
    # how sp_pad keeps self-attention off the padded keys (`planner.targets.Target.padded_keys`): "mask" (a boolean
    # key mask as attn_mask) or "slice" (K and V cut back to the real tokens in each self-attention, no mask)
    padded_keys: str = "mask"


@dataclass(frozen=True)
class RewriteReport:
    """What one pass did: ``count`` sites rewritten, at module paths ``where`` (one entry per site,
    so ``len(where) == count``), and the reason for each candidate it left alone."""

    name: str
    count: int
    where: tuple[str, ...]
    skipped: tuple[str, ...]


class Skip(Exception):
    """A candidate's preconditions could not be proven; the message says which, for `RewriteReport.skipped`."""


def note(path: str, why: object) -> str:
    """One `RewriteReport.skipped` entry: where, and why."""
    return f"{path or '<root>'}: {why}"


def report(name: str, where: Iterable[str], skipped: Iterable[str]) -> RewriteReport:
    where = tuple(where)
    return RewriteReport(name=name, count=len(where), where=where, skipped=tuple(skipped))


# --- reading nodes ----------------------------------------------------------------------------------

LINEAR = (torch._C._nn.linear, torch.nn.functional.linear)
SDPA = (torch._C._nn.scaled_dot_product_attention, torch.nn.functional.scaled_dot_product_attention)
RMS_NORM = (torch.rms_norm, torch.nn.functional.rms_norm)
CONV = {
    torch.conv1d: 1,
    torch.conv2d: 2,
    torch.conv3d: 3,
    torch.nn.functional.conv1d: 1,
    torch.nn.functional.conv2d: 2,
    torch.nn.functional.conv3d: 3,
}


def calls(node: fx.Node, targets: Union[Callable, tuple, dict]) -> bool:
    """True for a call_function node of one of ``targets``."""
    if node.op != "call_function":
        return False
    if isinstance(targets, (tuple, dict)):
        return node.target in targets
    return node.target is targets


def calls_method(node: fx.Node, name: str) -> bool:
    return node.op == "call_method" and node.target == name


def value(node: Any) -> Any:
    """The example value of a node (a tensor, a tuple of them, ...), or the argument itself if not a node."""
    if not isinstance(node, fx.Node):
        return node
    if "example_value" not in node.meta:
        raise Skip(f"node {node.name} has no example_value")
    return node.meta["example_value"]


def shape(node: fx.Node) -> tuple:
    v = value(node)
    if not isinstance(v, torch.Tensor):
        raise Skip(f"node {node.name} is not a tensor")
    return tuple(v.shape)


def static(dims: Iterable) -> bool:
    return all(isinstance(d, int) for d in dims)


_GETATTR = re.compile(r"getattr\(([^()]*), '([^']+)'\)")
_MODULES = re.compile(r"\._modules\['([^']+)'\]")
_KEY = re.compile(r"\['([^']*)'\]")
_INDEX = re.compile(r"\[(\d+)\]")
_ROOT = re.compile(r"^([LG]\['[^']+'\]|L__(?:self|fn)__)")


def stack_path(entry: str) -> str:
    """Dotted module path of an ``nn_module_stack`` entry:
    ``L['self']._modules['blocks']._modules['1'].attn2.to_k`` -> ``blocks.1.attn2.to_k``
    (``getattr(x, 'a')`` and ``[0]`` read as ``.a`` and ``.0``). The root is whatever dynamo named the
    outermost module: the compiled module (``L['self']``, ``L__self__``) or the local or global a compiled
    function called (``L['model']``, ``G['vae']``)."""
    path = _ROOT.sub("", entry)
    while _GETATTR.search(path):
        path = _GETATTR.sub(r"\1.\2", path)
    path = _MODULES.sub(r".\1", path)
    path = _KEY.sub(r".\1", path)
    return _INDEX.sub(r".\1", path).lstrip(".")


def module_path(node: fx.Node) -> str:
    """Dotted path of the innermost module that ran ``node`` (``blocks.0.attn1.to_q``); "" for the root."""
    stack = node.meta.get("nn_module_stack") or {}
    return stack_path(list(stack.values())[-1][0]) if stack else ""


def parent_stack(node: fx.Node) -> dict:
    """``node``'s nn_module_stack without its innermost module (the attention around a ``to_q``)."""
    stack = dict(node.meta.get("nn_module_stack") or {})
    if stack:
        stack.pop(list(stack)[-1])
    return stack


def linear_args(node: fx.Node) -> tuple[Any, Any, Any]:
    """(input, weight, bias) of a linear call; bias is None when absent."""
    args = list(node.args) + [None] * (3 - len(node.args))
    x = node.kwargs.get("input", args[0])
    w = node.kwargs.get("weight", args[1])
    b = node.kwargs.get("bias", args[2])
    return x, w, b


def only_user(node: fx.Node) -> Optional[fx.Node]:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


# --- writing nodes ----------------------------------------------------------------------------------


def fake_mode_of(example: Any):
    """The FakeTensorMode of the first FakeTensor in ``example`` (a tensor or a nest of them), else None."""
    fakes = [t for t in pytree.tree_leaves(example) if isinstance(t, FakeTensor)]
    return fakes[0].fake_mode if fakes else None


def evaluate(
    op: str, target: Any, args: tuple, kwargs: dict, lookup: Callable[[Any], Any] = value, mode: Any = None
) -> Any:
    """Run ``target`` on the example values of ``args`` (``lookup`` maps a node to its value): under
    their FakeTensorMode when they are fake (or ``mode`` when no argument is a tensor), on the meta
    device when they are real or meta tensors."""
    vargs, vkwargs = fx.node.map_aggregate((args, kwargs), lookup)
    leaves = pytree.tree_leaves((vargs, vkwargs))
    if any(isinstance(t, torch.Tensor) for t in leaves):
        mode = fake_mode_of(leaves)
    if mode is None:
        vargs, vkwargs = pytree.tree_map_only(torch.Tensor, lambda t: t.to("meta"), (vargs, vkwargs))
    run = (
        (lambda: getattr(vargs[0], target)(*vargs[1:], **vkwargs))
        if op == "call_method"
        else (lambda: target(*vargs, **vkwargs))
    )
    if mode is not None:
        with mode:
            return run()
    return run()


class Emitter:
    """Creates nodes before ``anchor`` (or after it, with ``after=True``), each with its example_value
    computed from its inputs and ``stack`` (default: ``origin``'s nn_module_stack) as its module stack.
    """

    def __init__(
        self, graph: fx.Graph, anchor: fx.Node, origin: fx.Node, *, after: bool = False, stack: Optional[dict] = None
    ) -> None:
        self.graph = graph
        self.cursor = anchor
        self.after = after
        self.stack = dict(origin.meta.get("nn_module_stack") or {}) if stack is None else stack
        self.stack_trace = origin.meta.get("stack_trace")
        self.mode = fake_mode_of(origin.meta.get("example_value"))

    def call(self, fn: Callable, *args: Any, name: Optional[str] = None, **kwargs: Any) -> fx.Node:
        return self._create("call_function", fn, args, kwargs, name)

    def method(self, method: str, *args: Any, name: Optional[str] = None, **kwargs: Any) -> fx.Node:
        return self._create("call_method", method, args, kwargs, name)

    def getitem(self, node: fx.Node, index: Any, name: Optional[str] = None) -> fx.Node:
        return self._create("call_function", operator.getitem, (node, index), {}, name)

    def _create(self, op: str, target: Any, args: tuple, kwargs: dict, name: Optional[str]) -> fx.Node:
        example = evaluate(op, target, args, kwargs, mode=self.mode)
        place = self.graph.inserting_after if self.after else self.graph.inserting_before
        with place(self.cursor):
            node = self.graph.create_node(op, target, args, kwargs, name=name)
        node.meta["nn_module_stack"] = dict(self.stack)
        node.meta["example_value"] = example
        if self.stack_trace is not None:
            node.meta["stack_trace"] = self.stack_trace
        if self.after:
            self.cursor = node
        return node


def replace(old: fx.Node, new: fx.Node) -> None:
    """Point every user of ``old`` at ``new`` and erase ``old``."""
    old.replace_all_uses_with(new)
    old.graph.erase_node(old)


def rewrite_each(gm: fx.GraphModule, name: str, candidates: Iterable[tuple[str, Callable[[], None]]]) -> RewriteReport:
    """A hand matcher's loop: for each candidate ``(module path, rewrite)`` run ``rewrite()``; one that
    raises `Skip` is left alone and its reason reported."""
    where, skipped = [], []
    for path, rewrite in candidates:
        try:
            rewrite()
            where.append(path)
        except Skip as why:
            skipped.append(note(path, why))
    finish(gm)
    return report(name, where, skipped)


def finish(gm: fx.GraphModule) -> fx.GraphModule:
    gm.graph.lint()
    gm.recompile()
    return gm
