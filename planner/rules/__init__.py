"""Op rules: for each op kind, what input layouts it needs and what output layout it gives.

A rule is a thin function registered for one or more op kinds (the names `planner.graph.Node.op`
uses: ``linear``, ``add``, ``view``, ``scaled_dot_product_attention`` ...)::

    @register_rule("rms_norm")
    def rms_norm_rule(op: OpView) -> RuleResult: ...

It sees the node with its *actual* input layouts and answers with a `RuleResult`: the layouts it
*requires* of its inputs (the propagation engine charges the redistribution from actual to required
— all-gather, all-to-all, all-reduce, or a free local slice), the layouts of its outputs, the
collectives the op itself runs (a row-parallel linear's all-reduce, a sharded norm's statistics
all-reduce), and its per-device FLOPs and bytes for the roofline.

One op family per module: `pointwise`, `view`, `index` (getitem/chunk/split/unbind/cat/setitem),
`matmul`, `attention`, `norm`, `conv`. An op kind with no rule gets `conservative_rule` (gather every
input, compute replicated) and a warning the plan carries — a new op never crashes the planner.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from planner.graph import Node, TensorMeta
from planner.mesh import MeshSpec
from planner.placements import Dim, Guard, Layout, local_shape, numel


@dataclass(frozen=True)
class InOpComm:
    """A collective the op itself runs, on a tensor of per-device ``shape`` (HLO byte convention:
    result for all-gather, operand for all-reduce / reduce-scatter / all-to-all).

    Not a `planner.collective.Collective`: it is the rule's request, stated as a (possibly symbolic)
    per-device shape and an item size, before the example sizes that turn it into bytes and the cost
    model that prices it are applied; `planner.propagate.evaluate` makes the `Collective` from it."""

    kind: str
    axes: tuple[str, ...]
    shape: tuple[Dim, ...]
    itemsize: int
    reason: str


@dataclass(frozen=True)
class RuleResult:
    required: tuple[Optional[Layout], ...]  # per input occurrence; None = take whatever comes
    outputs: tuple[Layout, ...]
    comm: tuple[InOpComm, ...] = ()
    flops: Dim = 0
    bytes: Dim = 0
    kernel: bool = False  # a real kernel launch (matmul, attention, norm, conv): pays the launch floor
    note: str = ""
    guards: tuple[Guard, ...] = ()


@dataclass
class OpView:
    """What a rule sees: the node, its actual input layouts, the mesh."""

    node: Node
    ins: list[Optional[Layout]]
    in_metas: list[Optional[TensorMeta]]
    mesh: MeshSpec
    guards: list[Guard] = field(default_factory=list)
    wanted: Optional[Layout] = None  # the layout the plan constrains the output to, if any
    # the partitioner exchanges a spatially split conv's halo (GSPMD); False: the lowering writes it into
    # the program (`wancompile.halo`, for tt-mlir: `planner.targets.Target.spatial_halo`)
    halo: bool = True

    # --- arguments --------------------------------------------------------------------------------

    @property
    def args(self) -> list[Any]:
        return list(self.node.attrs.get("args", []))

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.node.attrs.get("kwargs", {}))

    def arg(self, i: int, key: str, default: Any = None) -> Any:
        return self.node.arg(i, key, default)

    def input_index(self, ref: Any) -> Optional[int]:
        """Index in `ins` of a tensor argument given as ``{"node": name}`` (first occurrence)."""
        if isinstance(ref, dict) and "node" in ref:
            try:
                return self.node.inputs.index(ref["node"])
            except ValueError:
                return None
        return None

    def tensor_arg(self, i: int, key: str) -> Optional[int]:
        return self.input_index(self.arg(i, key))

    # --- shapes -----------------------------------------------------------------------------------

    @property
    def out(self) -> TensorMeta:
        return self.node.outputs[0]

    def shape(self, i: int) -> tuple[Dim, ...]:
        meta = self.in_metas[i]
        return meta.shape if meta is not None else ()

    def local(self, shape: Sequence[Dim], layout: Optional[Layout]) -> tuple[Dim, ...]:
        return local_shape(shape, layout, self.mesh)

    def local_bytes(self, meta: Optional[TensorMeta], layout: Optional[Layout]) -> Dim:
        if meta is None:
            return 0
        return numel(self.local(meta.shape, layout)) * meta.itemsize

    def ndim(self, i: int) -> int:
        return len(self.shape(i))

    def keep(self, i: int) -> Optional[Layout]:
        """The actual layout of input i, with partial sums resolved."""
        lay = self.ins[i]
        return None if lay is None else lay.without_partial()


RuleFn = Callable[[OpView], RuleResult]
RULES: dict[str, RuleFn] = {}


def register_rule(*ops: str) -> Callable[[RuleFn], RuleFn]:
    def deco(fn: RuleFn) -> RuleFn:
        for op in ops:
            if op in RULES:
                raise ValueError(f"op {op!r} already has a rule ({RULES[op].__name__}); one rule per op kind")
            RULES[op] = fn
        return fn

    return deco


def conservative_rule(op: OpView) -> RuleResult:
    """No rule known: gather every tensor input and compute replicated (correct for any op)."""
    required = tuple(None if lay is None else Layout.replicated(lay.ndim) for lay in op.ins)
    outs = tuple(Layout.replicated(len(m.shape)) for m in op.node.outputs)
    nbytes = sum(m.nbytes for m in op.node.outputs)
    return RuleResult(required, outs, bytes=nbytes, note=f"no sharding rule for op {op.node.op!r}: computed replicated")


def rule_for(op: str) -> tuple[RuleFn, bool]:
    """The rule of an op kind, and whether it is a real one (False: the conservative fallback)."""
    _load()
    fn = RULES.get(op)
    return (fn, True) if fn is not None else (conservative_rule, False)


def norm_dim(d: int, ndim: int) -> int:
    return d + ndim if d < 0 else d


_LOADED = False


def _load() -> None:
    global _LOADED
    if not _LOADED:
        import importlib
        import pkgutil

        for module in pkgutil.iter_modules(__path__):  # every op-family module registers its rules on import
            importlib.import_module(f"{__name__}.{module.name}")

        _LOADED = True
