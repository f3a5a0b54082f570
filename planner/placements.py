"""Sharding states: how one tensor is laid out over the mesh, and the one way a layout is printed.

Two equivalent views of the same state:

- per mesh axis (DTensor's vocabulary): `Replicate` ``R``, `Shard` ``S(d)``, `Partial` ``P(sum)``;
- per tensor dim (torch_xla's PartitionSpec): which mesh axes split dim d, major first.

`Layout` stores the per-dim view, because order matters when two axes split one dim (Ulysses needs
``("model", "batch")``, not ``("batch", "model")``, DESIGN.md §4) and because that is what the lowering
writes. ``partial`` names the axes over which the values are unreduced partial sums.

The notation (`Layout.show`, `show_spec`): everything printed for people — plan.md, plan.html,
``wancompile explain`` and ``diff``, decisions, and plan-checking errors — writes a layout this way and
no other. One placement per mesh axis, in the mesh's axis order, in parentheses::

    (S(1), R)          mesh (batch, model): tokens (dim 1) split over batch, replicated over model
    (R, S(0))          a column-parallel weight split on its rows over model
    (S(1), P(sum))     split over batch, partial sums over model
    (S(1), S(1))       dim 1 split over both axes, batch major (DTensor's order: mesh order)
    (S(1), S(1))[1: model>batch]
                       the same dim split model major, batch minor

As in DTensor, axes that split one dim are applied in mesh order (the earlier mesh axis is major);
where the plan uses another order, a suffix ``[d: a>b]`` names dim d's axes major first (``; ``
between several such dims). plan.json's ``params`` and ``activations`` keep the per-dim partition
specs (the lowering's input, DESIGN.md §2); this notation is for reading only and is never parsed.

Divisibility is decided by `divides`: ints are checked, symbolic (sympy) dims cannot be decided and
are returned as a `Guard` the plan records (e.g. "tokens % 8 == 0"), DESIGN.md §5; `check_spec`
refuses a partition spec that cannot split a tensor evenly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence, Union

if TYPE_CHECKING:
    import sympy


from planner.mesh import MeshError, MeshSpec, PartitionSpec, entry_axes, spec_axes

# sympy is imported where a symbolic dim is handled, not here: reading a plan.json needs none (wancompile explain)
Dim = Union[int, "sympy.Expr"]


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
        import sympy

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
    import sympy

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
        """The layout in the project's one notation (module docstring): ``(S(1), R)``."""
        text = "(" + ", ".join(map(str, self.placements(mesh))) + ")"
        order = {a: i for i, a in enumerate(mesh.axis_names)}
        unusual = [
            f"{d}: {'>'.join(axes)}"
            for d, axes in enumerate(self.dims)
            if len(axes) > 1 and list(axes) != sorted(axes, key=lambda a: order.get(a, len(order)))
        ]
        return text + (f"[{'; '.join(unusual)}]" if unusual else "")


def show_spec(spec: PartitionSpec, mesh: MeshSpec) -> str:
    """A partition spec in the one notation: ``("model", None)`` on mesh (batch, model) -> ``(R, S(0))``."""
    return Layout.from_spec(spec).show(mesh)


def check_spec(spec: PartitionSpec, shape: Sequence[Dim], mesh: MeshSpec, what: str) -> None:
    """Raise a MeshError naming `what` if `spec` cannot shard a tensor of `shape` evenly on `mesh`.
    A spec that is no layout at all (wrong length, an axis used twice) is quoted as written."""
    if len(spec) != len(shape):
        raise MeshError(f"{what}: spec {list(spec)} has {len(spec)} entries for a {len(shape)}-d tensor {tuple(shape)}")
    used = spec_axes(spec)
    for axis in used:
        mesh.axis_index(axis)
    if len(set(used)) != len(used):
        raise MeshError(f"{what}: spec {list(spec)} uses a mesh axis twice")
    for dim, (entry, n) in enumerate(zip(spec, shape)):
        parts = mesh.entry_size(entry)
        if isinstance(n, int) and n % parts:
            raise MeshError(
                f"{what}: dim {dim} of size {n} cannot be split {parts} ways over {'+'.join(entry_axes(entry))} by "
                f"{show_spec(spec, mesh)} on mesh {mesh} {mesh.axis_names}; choose a spec whose axes divide it, "
                "or a mesh whose axis sizes do"
            )


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
    import sympy

    expr = sympy.sympify(x)
    if values:
        expr = expr.subs({s: values[s.name] for s in expr.free_symbols if s.name in values})
    if not expr.is_number:
        raise ValueError(
            f"cannot cost symbolic size {x}; pass example values for {sorted(map(str, expr.free_symbols))}"
        )
    return float(expr)
