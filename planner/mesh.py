"""Logical device meshes and partition specs, as plain data.

A mesh is a shape and one name per axis ("8x4" -> shape (8, 4), axes ("batch", "model") as tt-xla
names them). A partition spec says, for each tensor dim, which mesh axes shard it: ``None``
(replicated), one axis name, or a tuple of axis names (major axis first), exactly the vocabulary of
``torch_xla.distributed.spmd.mark_sharding`` — but this module never imports torch_xla, so plans can
be made and checked on a laptop.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Sequence, Union

from planner.errors import Error
from planner.records import Record

AxisEntry = Union[None, str, tuple[str, ...]]
PartitionSpec = tuple[AxisEntry, ...]

# Only 1-D and 2-D meshes have default names (tt-xla's); a 3-D mesh must be named (no invented axes).
DEFAULT_AXIS_NAMES = {1: ("model",), 2: ("batch", "model")}


class MeshError(Error, ValueError):
    """A mesh description that cannot be used; the message says how to fix it."""


@dataclass(frozen=True)
class MeshSpec(Record):
    """Shape and axis names of a logical device mesh (row-major device ids)."""

    shape: tuple[int, ...]
    axis_names: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.shape) != len(self.axis_names):
            raise MeshError(
                f"mesh shape {self.shape} has {len(self.shape)} axes but axis_names "
                f"{self.axis_names} names {len(self.axis_names)}; give one name per axis"
            )
        if any(not isinstance(n, int) or n < 1 for n in self.shape):
            raise MeshError(f"mesh shape {self.shape}: every axis size must be a positive integer")
        if len(set(self.axis_names)) != len(self.axis_names):
            raise MeshError(f"mesh axis names {self.axis_names} must be distinct")

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def axis_size(self, axis: str) -> int:
        return self.shape[self.axis_index(axis)]

    def axis_index(self, axis: str) -> int:
        try:
            return self.axis_names.index(axis)
        except ValueError:
            raise MeshError(f"unknown mesh axis {axis!r}; this mesh has axes {self.axis_names}") from None

    def entry_size(self, entry: AxisEntry) -> int:
        """Number of shards a spec entry produces (product of the sizes of its axes)."""
        return math.prod(self.axis_size(a) for a in entry_axes(entry))

    def coords(self, device: int) -> tuple[int, ...]:
        """Mesh coordinates of a (row-major) device id."""
        out = []
        for n in reversed(self.shape):
            out.append(device % n)
            device //= n
        return tuple(reversed(out))

    def __str__(self) -> str:
        return "x".join(map(str, self.shape))


_MESH_RE = re.compile(r"^\s*\d+(\s*[x×,*]\s*\d+)*\s*$")


def parse_mesh(mesh: Union[str, Sequence[int], MeshSpec], axis_names: Sequence[str] | None = None) -> MeshSpec:
    """Read "8x4", "8,4", (8, 4) or a MeshSpec; default axis names as tt-xla uses them.

    >>> parse_mesh("2x4")
    MeshSpec(shape=(2, 4), axis_names=('batch', 'model'))
    """
    if isinstance(mesh, MeshSpec):
        return mesh if axis_names is None else MeshSpec(mesh.shape, tuple(axis_names))
    if isinstance(mesh, str):
        if not _MESH_RE.match(mesh):
            raise MeshError(
                f"cannot parse mesh {mesh!r}: write the axis sizes separated by 'x', e.g. '8x4' "
                f"(Galaxy), '2x4' (LoudBox), '1x2' (n300) or '8'"
            )
        shape = tuple(int(p) for p in re.split(r"[x×,*]", mesh.replace(" ", "")))
    else:
        try:
            shape = tuple(int(n) for n in mesh)
        except (TypeError, ValueError):
            raise MeshError(f"cannot read mesh {mesh!r}: give a string like '8x4' or a tuple like (8, 4)") from None
    if not shape or any(n < 1 for n in shape):
        raise MeshError(f"mesh {mesh!r}: every axis size must be a positive integer")
    if axis_names is None:
        if len(shape) not in DEFAULT_AXIS_NAMES:
            raise MeshError(
                f"mesh {mesh!r} has {len(shape)} axes, and only 1-D and 2-D meshes have default axis names; "
                f"name its axes (axis_names, e.g. {('data', 'batch', 'model')[-len(shape) :] if len(shape) <= 3 else '...'}) "
                "or use a 2-D mesh such as '8x4'"
            )
        axis_names = DEFAULT_AXIS_NAMES[len(shape)]
    return MeshSpec(shape, tuple(axis_names))


def entry_axes(entry: AxisEntry) -> tuple[str, ...]:
    """The mesh axes of one spec entry, major first."""
    if entry is None:
        return ()
    if isinstance(entry, str):
        return (entry,)
    return tuple(entry)


def normalize_spec(spec: Sequence[AxisEntry]) -> PartitionSpec:
    """Canonical form: 1-tuples become plain names, empty tuples become None; lists become tuples."""
    out: list[AxisEntry] = []
    for e in spec:
        axes = entry_axes(tuple(e) if isinstance(e, list) else e)
        out.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return tuple(out)


def spec_axes(spec: PartitionSpec) -> tuple[str, ...]:
    return tuple(a for e in spec for a in entry_axes(e))
