"""The seam between capture and planning: a plain annotated dataflow graph.

Capture (``wancompile.capture``) turns a dynamo FX graph into a `Graph`; the planner reads nothing
else. Every node carries its op kind, output shapes and dtypes, module path, the fully qualified name
of the parameter or buffer it holds (placeholders only), the repeated block it belongs to (its family
— the stack prefix, ``blocks`` or ``vace_blocks`` — and its index in that stack), and a `Location` — module path + op + occurrence — that names it stably across recompiles
(dynamo's node names change when the graph does; module paths do not).

Shapes hold ints, or sympy expressions when a dim is symbolic (``dynamic=True``).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Optional, Union

if TYPE_CHECKING:
    import sympy


# graph.json: 2 added "version", "families" and each node's "family"; "block" is the index within
# that family (version 1 counted blocks across all stacks in graph order).
GRAPH_JSON_VERSION = 2

TUPLE_OPS = ("chunk", "split", "unbind", "tensor_split")  # ops whose value is a tuple of tensors

# sympy is imported where a symbolic dim is handled, not here: reading a plan.json needs none (wancompile explain)
Dim = Union[int, "sympy.Expr"]


@dataclass(frozen=True, order=True)
class Location:
    """Where an op sits in the model, independent of dynamo's node names.

    ``occurrence`` counts ops of the same kind in the same module, in graph order. Printed as
    ``blocks.0.attn1:linear#2``.
    """

    module: str
    op: str
    occurrence: int = 0

    def __str__(self) -> str:
        return f"{self.module}:{self.op}#{self.occurrence}"

    @classmethod
    def parse(cls, text: str) -> "Location":
        try:
            module, rest = text.rsplit(":", 1)
            op, occ = rest.rsplit("#", 1)
            return cls(module, op, int(occ))
        except ValueError:
            raise ValueError(
                f"bad location {text!r}: expected 'module.path:op#occurrence', e.g. 'blocks.0.attn1:linear#0'"
            ) from None


@dataclass(frozen=True)
class TensorMeta:
    shape: tuple[Dim, ...]
    dtype: str

    @property
    def numel(self) -> Dim:
        n: Dim = 1
        for d in self.shape:
            n = n * d
        return n

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES.get(self.dtype, 4)

    @property
    def nbytes(self) -> Dim:
        return self.numel * self.itemsize

    @property
    def is_symbolic(self) -> bool:
        return any(not isinstance(d, int) for d in self.shape)


DTYPE_BYTES = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "complex64": 8,
    "complex128": 16,
}


@dataclass(frozen=True)
class BlockFamily:
    """One stack of repeated blocks: the children ``prefix.<int>`` of a module list found in the graph.

    Attributes:
        prefix: the stack's module path (``blocks``, ``vace_blocks``, ``decoder.up_blocks.0.resnets``).
        indices: the block indices captured in this graph (a planner captures 1-2 blocks of a
            full-size model: ``(0, 1)`` of 40), ascending.
        odd: the members whose parameters differ from the family's most common set (VACE's
            ``vace_blocks.0`` has an input projection the others lack); empty when all match.
    """

    prefix: str
    indices: tuple[int, ...]
    odd: tuple[int, ...] = ()


@dataclass(frozen=True)
class Node:
    """One op of the captured program.

    Attributes:
        name: unique within this graph (dynamo's node name; not stable across recompiles).
        op: op kind: ``placeholder``, ``output``, or the function/method name (``linear``, ``add``,
            ``scaled_dot_product_attention``, ``view``, ``getitem`` ...).
        inputs: names of the nodes whose values this op reads, in argument order.
        outputs: metadata of each output (one for most ops; several for tuple-valued ones).
        module: dotted module path of the innermost module that ran the op ("" for the root).
        location: stable name of this op (see `Location`).
        param: fully qualified parameter/buffer name for weight placeholders, else None.
        block: index of the repeated block the op belongs to within its family (``blocks.3`` -> 3,
            ``vace_blocks.1`` -> 1), else None.
        attrs: the op's non-tensor arguments in JSON-friendly form (dims, sizes, flags); tensor
            arguments appear as ``{"node": name}``.
        family: the stack prefix of that block (``blocks``, ``vace_blocks``), else None.
    """

    name: str
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[TensorMeta, ...]
    module: str
    location: Location
    param: Optional[str] = None
    block: Optional[int] = None
    attrs: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    family: Optional[str] = None

    @property
    def out(self) -> TensorMeta:
        """The single output's metadata."""
        return self.outputs[0]

    @property
    def is_param(self) -> bool:
        return self.param is not None

    def arg(self, i: int, key: str, default: Any = None) -> Any:
        """The op's argument named `key`, else its `i`-th positional argument, else `default`."""
        kwargs = self.attrs.get("kwargs", {})
        if key in kwargs:
            return kwargs[key]
        args = self.attrs.get("args", [])
        return args[i] if i < len(args) else default


@dataclass
class Graph:
    """Nodes in topological order, plus lookups.

    ``families`` are the stacks of repeated blocks (`BlockFamily`); ``block_prefixes`` their prefixes.
    """

    nodes: list[Node]
    model: str = ""
    block_prefixes: tuple[str, ...] = ()
    families: tuple[BlockFamily, ...] = ()

    def __post_init__(self) -> None:
        self._by_name = {n.name: n for n in self.nodes}
        self._by_location_text = {str(n.location): n for n in self.nodes}
        self._users: dict[str, list[str]] = {n.name: [] for n in self.nodes}
        for n in self.nodes:
            for i in n.inputs:
                self._users[i].append(n.name)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, name: str) -> Node:
        return self._by_name[name]

    def users(self, name: str) -> list[Node]:
        return [self._by_name[u] for u in self._users[name]]

    def params(self) -> list[Node]:
        return [n for n in self.nodes if n.is_param]

    def block_root(self, node: Node) -> Optional[str]:
        """The module path of `node`'s block (``blocks.3``), None outside the block stack."""
        if node.block is None:
            return None
        if node.family is not None:
            return f"{node.family}.{node.block}"
        for prefix in self.block_prefixes:
            root = f"{prefix}.{node.block}"
            if node.module == root or node.module.startswith(root + "."):
                return root
        return None

    def in_block(self, node: Node, name: str, k: Union[int, str]) -> str:
        """`name` (the module path, parameter name or location text of `node` or of anything under
        its block) as it reads in block `k` of the stack (``"*"``: the block-generic name a plan
        writes for what every block shares); unchanged outside the blocks."""
        root = self.block_root(node)
        if root is None or not (name == root or name.startswith((root + ".", root + ":"))):
            return name
        return f"{root.rsplit('.', 1)[0]}.{k}{name[len(root) :]}"

    def generic(self, where: str) -> str:
        """A location text (a collective's ``where``) as a plan writes it: an op of a block under
        its block-generic name (``blocks.*.attn1:linear#0``), anything else unchanged."""
        node = self._by_location_text.get(where)
        return self.in_block(node, where, "*") if node is not None else where

    def block_location(self, node: Node, k: Union[int, str]) -> Location:
        """`node`'s location in block `k` of the stack (see `in_block`)."""
        loc = node.location
        return Location(self.in_block(node, loc.module, k), loc.op, loc.occurrence)

    def picks(self, node: Node) -> Optional[int]:
        """The output index a ``getitem`` takes from a tuple-valued op (``chunk``, ``split``,
        ``unbind``, ...); None for any other node, tensor indexing included."""
        if node.op != "getitem" or not node.inputs:
            return None
        src = self[node.inputs[0]]
        if len(src.outputs) > 1 or src.op in TUPLE_OPS:
            return int(node.attrs["args"][1])
        return None

    def picker(self, name: str, k: int) -> Optional[Node]:
        """The ``getitem`` taking output `k` of the tuple-valued op `name` (None if nothing reads it)."""
        return next((u for u in self.users(name) if self.picks(u) == k), None)

    def by_location(self) -> dict[Location, Node]:
        return {n.location: n for n in self.nodes}

    def blocks(self, family: Optional[str] = None) -> list[int]:
        """The captured block indices, of one family (stack prefix) or of all."""
        return sorted({n.block for n in self.nodes if n.block is not None and family in (None, n.family)})

    def without_families(self, prefixes: Iterable[str]) -> "Graph":
        """This graph with the blocks of the families under `prefixes` read as plain ops (no block
        index, no family): a planner that does not plan those stacks as blocks plans their ops one
        by one, like any op outside the stacks. Node names and locations are unchanged."""
        drop = set(prefixes) & set(self.block_prefixes)
        if not drop:
            return self
        nodes = [replace(n, block=None, family=None) if n.family in drop else n for n in self.nodes]
        return replace(
            self,
            nodes=nodes,
            block_prefixes=tuple(p for p in self.block_prefixes if p not in drop),
            families=tuple(f for f in self.families if f.prefix not in drop),
        )

    def family(self, prefix: str) -> BlockFamily:
        """The family of blocks under `prefix` (``blocks``, ``vace_blocks``)."""
        found = next((f for f in self.families if f.prefix == prefix), None)
        if found is None:
            raise KeyError(f"no block family {prefix!r} in graph {self.model!r}; it has {list(self.block_prefixes)}")
        return found

    def op_counts(self) -> Counter:
        return Counter(n.op for n in self.nodes)

    def summary(self) -> str:
        """One line a person can read: node, op, param and block counts."""
        params = self.params()
        numel = 0
        for p in params:
            v = p.out.numel
            numel += int(v) if isinstance(v, int) else 0
        blocks = self.blocks()
        return (
            f"{self.model or 'graph'}: {len(self.nodes)} nodes, {len(self.op_counts())} op kinds, "
            f"{len(params)} parameters ({numel / 1e9:.2f} B elements), {len(blocks)} blocks"
        )

    def to_json(self) -> str:
        def meta(t: TensorMeta) -> dict:
            return {"shape": [d if isinstance(d, int) else str(d) for d in t.shape], "dtype": t.dtype}

        return json.dumps(
            {
                "version": GRAPH_JSON_VERSION,
                "model": self.model,
                "families": [
                    {"prefix": f.prefix, "indices": list(f.indices), "odd": list(f.odd)} for f in self.families
                ],
                "nodes": [
                    {
                        "name": n.name,
                        "op": n.op,
                        "inputs": list(n.inputs),
                        "outputs": [meta(t) for t in n.outputs],
                        "module": n.module,
                        "location": str(n.location),
                        "param": n.param,
                        "block": n.block,
                        "family": n.family,
                    }
                    for n in self.nodes
                ],
            },
            indent=1,
        )
