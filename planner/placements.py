"""Sharding states: how one tensor is laid out over the mesh.

Two equivalent views of the same state:

- per mesh axis (DTensor's vocabulary): `Replicate` ``R``, `Shard` ``S(d)``, `Partial` ``P(sum)``;
  printed as ``(S(1), R)`` for a 2-D mesh;
- per tensor dim (torch_xla's PartitionSpec): which mesh axes split dim d, major first.

`Layout` stores the per-dim view, because order matters when two axes split one dim (Ulysses needs
``("model", "batch")``, not ``("batch", "model")``, DESIGN.md §4) and because that is what the lowering
writes. ``partial`` names the axes over which the values are unreduced partial sums.

Divisibility is decided by `divides`: ints are checked, symbolic (sympy) dims cannot be decided and
are returned as a `Guard` the plan records (e.g. "tokens % 8 == 0"), DESIGN.md §5.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

import sympy

from planner.mesh import MeshSpec, PartitionSpec, entry_axes

Dim = Union[int, sympy.Expr]


@dataclass(frozen=True)
class Replicate:
    def __str__(self) -> str:
        return "R"


@dataclass(frozen=True)
class Shard:
    dim: int

    def __str__(self) -> str:
        return f"S({self.dim})"


@dataclass(frozen=True)
class Partial:
    op: str = "sum"

    def __str__(self) -> str:
        return f"P({self.op})"


Placement = Union[Replicate, Shard, Partial]


@dataclass(frozen=True)
class Guard:
    """A divisibility the plan assumes of a symbolic dim: ``expr % divisor == 0``."""

    expr: str
    divisor: int
    what: str = ""

    def holds(self, values: dict[str, int]) -> bool:
        e = sympy.sympify(self.expr)
        v = e.subs({s: values[s.name] for s in e.free_symbols if s.name in values})
        if not v.is_number:
            raise ValueError(f"guard {self} needs values for {sorted(map(str, v.free_symbols))}")
        return int(v) % self.divisor == 0

    def __str__(self) -> str:
        return f"{self.expr} % {self.divisor} == 0" + (f" ({self.what})" if self.what else "")


def divides(n: int, dim: Dim) -> Union[bool, Guard]:
    """True/False for ints; for symbolic dims, whatever sympy can prove, else a Guard to record."""
    if n == 1:
        return True
    if isinstance(dim, int):
        return dim % n == 0
    expr = sympy.sympify(dim)
    if expr.is_number:
        return int(expr) % n == 0
    rem = sympy.Mod(expr, n)
    if rem == 0:
        return True
    return Guard(str(expr), n)


@dataclass(frozen=True)
class Layout:
    """Sharding of one tensor: ``dims[d]`` = mesh axes splitting dim d (major first); ``partial`` =
    axes over which the values still need a sum."""

    dims: tuple[tuple[str, ...], ...]
    partial: tuple[str, ...] = ()

    @classmethod
    def replicated(cls, ndim: int) -> "Layout":
        return cls(((),) * ndim)

    @classmethod
    def from_spec(cls, spec: PartitionSpec) -> "Layout":
        return cls(tuple(entry_axes(e) for e in spec))

    def to_spec(self) -> PartitionSpec:
        return tuple(None if not a else a[0] if len(a) == 1 else a for a in self.dims)

    @property
    def ndim(self) -> int:
        return len(self.dims)

    @property
    def axes(self) -> tuple[str, ...]:
        return tuple(a for d in self.dims for a in d)

    @property
    def is_replicated(self) -> bool:
        return not self.axes and not self.partial

    def with_dim(self, d: int, axes: Sequence[str]) -> "Layout":
        dims = list(self.dims)
        dims[d] = tuple(axes)
        return Layout(tuple(dims), self.partial)

    def without_partial(self) -> "Layout":
        return Layout(self.dims)

    def placements(self, mesh: MeshSpec) -> tuple[Placement, ...]:
        out: list[Placement] = []
        for axis in mesh.axis_names:
            if axis in self.partial:
                out.append(Partial())
                continue
            dim = next((d for d, axes in enumerate(self.dims) if axis in axes), None)
            out.append(Replicate() if dim is None else Shard(dim))
        return tuple(out)

    def show(self, mesh: MeshSpec) -> str:
        return "(" + ", ".join(map(str, self.placements(mesh))) + ")"

    def __str__(self) -> str:
        parts = ["-" if not a else "+".join(a) for a in self.dims]
        return "[" + ", ".join(parts) + "]" + (f" P({'+'.join(self.partial)})" if self.partial else "")


def shard_count(mesh: MeshSpec, axes: Sequence[str]) -> int:
    n = 1
    for a in axes:
        n *= mesh.axis_size(a)
    return n


def local_shape(shape: Sequence[Dim], layout: Optional[Layout], mesh: MeshSpec) -> tuple[Dim, ...]:
    """Per-device shape (ceil for ints, exact division for symbolic dims)."""
    if layout is None:
        return tuple(shape)
    out: list[Dim] = []
    for n, axes in zip(shape, layout.dims):
        k = shard_count(mesh, axes)
        if isinstance(n, int):
            out.append(-(-n // k))
        else:
            out.append(n / k)
    return tuple(out)


def numel(shape: Sequence[Dim]) -> Dim:
    n: Dim = 1
    for d in shape:
        n = n * d
    return n


def as_number(x: Dim, values: Optional[dict[str, int]] = None) -> float:
    """A float for cost arithmetic; symbolic dims take `values` (the example sizes)."""
    if isinstance(x, (int, float)):
        return float(x)
    expr = sympy.sympify(x)
    if values:
        expr = expr.subs({s: values[s.name] for s in expr.free_symbols if s.name in values})
    if not expr.is_number:
        raise ValueError(
            f"cannot cost symbolic size {x}; pass example values for {sorted(map(str, expr.free_symbols))}"
        )
    return float(expr)
