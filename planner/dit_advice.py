"""The DiT family's words for a failed solve: what is planned, and the larger meshes that would plan.

A mixin of `planner.dit_family.DitFamily`: its methods read the family's state (``self.g``, ``self.st``, ``self.mesh`` ...) and call its other parts by name.
"""

from __future__ import annotations

import math

from planner.dit_state import DitState
from planner.hardware import PROFILES
from planner.ilp import Infeasible
from planner.mesh import MeshSpec
from planner.plan import (
    PlanError,
)


def _system_meshes(mesh: MeshSpec) -> list[MeshSpec]:
    """Native meshes of the hardware profiles with more devices than `mesh` (smallest first), named
    like `mesh` when it is 2-D: the meshes that exist to suggest."""
    shapes = sorted(
        {p.mesh_shape for p in PROFILES.values() if math.prod(p.mesh_shape) > mesh.size},
        key=lambda s: (math.prod(s), s),
    )
    names = mesh.axis_names if len(mesh.shape) == 2 else None
    return [MeshSpec(tuple(s), tuple(names) if names else ("batch", "model")) for s in shapes]


class DitAdvice(DitState):
    """`engine.Family.subject` and `advice` of the DiT: re-plans the larger system meshes."""

    @property
    def subject(self) -> str:
        return f"{self.model or 'this model'} x{self.copies} weight set(s)"

    def advice(self, budget: float) -> tuple[str, tuple[str, ...]]:
        meshes = self._larger_meshes(budget)
        if meshes:
            text = ", or use a larger mesh: " + "; ".join(
                f"{m} ({m.size} devices) plans within {need:.6g} GB" for m, need in meshes
            )
        elif _system_meshes(self.mesh):
            text = (
                "; no larger system mesh (" + ", ".join(str(m) for m in _system_meshes(self.mesh)) + ") fits it either"
            )
        else:
            text = ""
        return text, tuple(str(m) for m, _ in meshes)

    def _larger_meshes(self, budget: float) -> list[tuple[MeshSpec, float]]:
        """(mesh, smallest budget that plans there) for the system meshes larger than this one whose
        smallest plan fits `budget`; at most the two smallest."""
        out = []
        for m in _system_meshes(self.mesh):
            try:
                need = self.on(m).problem().need_gb(5.0)
            except (PlanError, Infeasible):
                continue
            if need * 1e9 <= budget:
                out.append((m, need))
            if len(out) == 2:
                break
        return out
