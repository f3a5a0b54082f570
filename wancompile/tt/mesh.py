"""The chips' mesh tt-mlir compiles a plan's mesh on, and the committed system that holds it.

tt-mlir partitions over a fixed list of 2-D mesh shapes (`planner.targets` ``meshes``); a plan for a shape
it lacks whose transpose it has (4x2) is made on the transpose (`Target.runs_on`: ``["model"=2,
"batch"=4]``); a saved plan on such a shape is written that way (`sdy_mesh`). TTNN's ``cluster_axis``
counts the axes as written (`chip_mesh`).
"""

from __future__ import annotations

from typing import Optional

from planner.mesh import MeshSpec
from planner.targets import TARGETS


def chip_mesh(mesh: MeshSpec) -> MeshSpec:
    """The chips' mesh TTNN's ``cluster_axis`` counts for a plan on `mesh`: `mesh` itself, except that a
    line (one axis of size > 1) runs as 1 x n (measured: an 8x1 plan's collectives have cluster_axis 1)
    and a shape tt-mlir lacks runs transposed where it has that (`sdy_mesh`)."""
    shape, names = tuple(mesh.shape), tuple(mesh.axis_names)
    if len(shape) == 2 and shape[0] > 1 and shape[1] == 1:
        return MeshSpec((1, shape[0]), (names[1], names[0]))
    return TARGETS["tt-mlir"].runs_on(mesh)


def sdy_mesh(mesh: MeshSpec) -> MeshSpec:
    """The ``sdy.mesh`` a program on `mesh` is written with: its axes in the order tt-mlir accepts (a
    transposed shape where only that is supported; lines as they are: tt-mlir folds size-1 axes itself)."""
    return TARGETS["tt-mlir"].runs_on(mesh)


def system_for(mesh: MeshSpec) -> Optional[str]:
    """The smallest committed Blackhole descriptor a plan on `mesh` compiles for (on its first chips): one
    whose rows and columns hold the chips' mesh (`chip_mesh`), or with enough chips for a line (1 x n,
    n x 1); None where there is none (a 2x2 or 1x4 mesh compiles on the 2x4 system's first four)."""
    shapes = {"bh-p150": (1, 1), "bh-p300": (1, 2), "bh-2x4": (2, 4), "bh-galaxy": (8, 4)}
    chips = chip_mesh(mesh)
    line = len(mesh.shape) == 2 and 1 in mesh.shape
    for name, (rows, cols) in shapes.items():
        fits = len(chips.shape) == 2 and chips.shape[0] <= rows and chips.shape[1] <= cols
        if fits or (line and mesh.size <= rows * cols):
            return name
    return None
