"""torch_xla meshes for plans: built from a `MeshSpec`, reshaped for a CFG-split plan, read back.

This module owns the correspondence between the planner's `MeshSpec` (shape and axis names) and
torch_xla's ``Mesh`` (the same plus the device order), and the check that the runtime has the
devices a mesh names.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from planner.mesh import MeshSpec
from planner.plan import PlanError


def xla_mesh(spec: MeshSpec):
    """A torch_xla Mesh with row-major device ids, checked against the runtime's device count."""
    import torch_xla.distributed.spmd as xs

    from wancompile import runtime

    n = runtime.device_count()
    if n != spec.size:
        raise PlanError(
            f"mesh {spec} needs {spec.size} devices but the XLA runtime has {n}. Use a mesh whose axis sizes "
            f"multiply to {n}, or start the process with PJRT_DEVICE=CPU CPU_NUM_DEVICES={spec.size} (virtual CPU devices)."
        )
    return xs.Mesh(np.arange(spec.size), spec.shape, spec.axis_names)


def mesh_for_plan(mesh: Any, spec: MeshSpec):
    """The torch_xla Mesh whose axes a plan's specs name: `mesh` itself, or for a CFG-split plan (whose
    mesh refines the user's, planner.cfg.split_mesh) the same devices in the same row-major order,
    reshaped to the plan's shape and axis names."""
    import torch_xla.distributed.spmd as xs

    if tuple(int(n) for n in mesh.mesh_shape) == spec.shape and tuple(mesh.axis_names) == spec.axis_names:
        return mesh
    ids = np.asarray(mesh.device_ids).reshape(-1)
    if ids.size != spec.size:
        raise PlanError(f"plan mesh {spec} {spec.axis_names} has {spec.size} devices, the compile's mesh {ids.size}")
    return xs.Mesh(ids, spec.shape, spec.axis_names)


def mesh_spec_of(mesh: Any) -> MeshSpec:
    """MeshSpec of a torch_xla Mesh."""
    return MeshSpec(tuple(int(n) for n in mesh.mesh_shape), tuple(mesh.axis_names))


def mesh_key(mesh: Any) -> str:
    """A literal naming `mesh` (shape, axes, device order): what FX code, which embeds only literals, can carry."""
    ids = tuple(int(d) for d in np.asarray(mesh.device_ids).ravel())
    return f"{tuple(mesh.mesh_shape)}|{tuple(mesh.axis_names)}|{ids}"
