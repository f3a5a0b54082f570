"""The cost model: one entry point per collective, and a roofline for compute.

``collective_seconds(kind, nbytes, axes, mesh, hw)`` prices one collective call. ``nbytes`` follows
the HLO convention (`wancompile.hlo`): per device and per call, the *result* for all-gather, the
operand for all-reduce, reduce-scatter, all-to-all and collective-permute. With n devices on the
axis and the axis' fit ``T = a + b·hops + bytes_term/bw`` (`planner.hardware`):

==================  =========================  ==========================================
kind                bytes_term                 why
==================  =========================  ==========================================
all-gather          (n−1)/n · result           each device receives the n−1 shards it lacks
reduce-scatter      (n−1)/n · operand          ring reduce-scatter
all-reduce          2(n−1)/n · operand         reduce-scatter + all-gather
all-to-all          ⌊n/2⌋⌈n/2⌉/n · operand     bisection bound on a line (F's bytes term);
                    ÷2 on a ring, (n−1)/n      on a switch
collective-permute  halo bytes                 one neighbour transfer
==================  =========================  ==========================================

``hops`` = n−1 on a line, ⌈n/2⌉ on a ring, 1 on a switch. A collective over several mesh axes (a
gather over ``("batch", "model")``) runs over the product group; it is priced on the slowest of
its axes' links with n = the product (special case: no 2-D collective fits exist).

Compute: ``max(flops / (peak·eff), bytes / dram_bw)`` per op, plus the launch floor for real
kernels (matmul, attention, norm, conv). Elementwise ops are assumed fused by XLA: they pay their
output bytes and no launch floor (special case). Views are free.
"""

from __future__ import annotations

import math
from typing import Sequence

from planner.hardware import HardwareProfile
from planner.mesh import MeshSpec


def axis_devices(mesh: MeshSpec, axes: Sequence[str]) -> int:
    return math.prod(mesh.axis_size(a) for a in axes)


# The price of a collective the profile's compiler cannot lower (`HardwareProfile.unlowerable`): so high
# that the solver takes any plan without it; a plan that still needs one shows it in its prediction.
UNLOWERABLE_S = 1e3


def collective_seconds(kind: str, nbytes: float, axes: Sequence[str], mesh: MeshSpec, hw: HardwareProfile) -> float:
    """Seconds for one call of collective `kind` moving `nbytes` (HLO convention) over `axes`."""
    n = axis_devices(mesh, axes)
    if n <= 1 or nbytes <= 0:
        return 0.0
    if kind in hw.unlowerable:
        return UNLOWERABLE_S
    links = [hw.axis(mesh.axis_index(a), mesh.axis_size(a)) for a in axes]
    link = min(links, key=lambda ln: float(ln.fit(kind).bw))
    fit = link.fit(kind)
    topo = "line" if len(axes) > 1 and link.topology == "ring" else link.topology
    hops = {"line": n - 1, "ring": math.ceil(n / 2), "switch": 1}[topo]
    if kind == "all-gather" or kind == "reduce-scatter":
        term = (n - 1) / n * nbytes
    elif kind == "all-reduce":
        term = 2 * (n - 1) / n * nbytes
    elif kind == "all-to-all":
        if topo == "switch":
            term = (n - 1) / n * nbytes
        else:
            term = (n // 2) * ((n + 1) // 2) / n * nbytes / (2 if topo == "ring" else 1)
    elif kind == "collective-permute":
        term, hops = nbytes, 1
    else:
        raise ValueError(f"unknown collective kind {kind!r}")
    return float(fit.a) + float(fit.b) * hops + term / float(fit.bw)


def op_seconds(flops: float, nbytes: float, kernel: bool, hw: HardwareProfile) -> float:
    """Roofline time of one op on one device."""
    t = max(flops / (float(hw.peak_flops) * float(hw.efficiency)), nbytes / (float(hw.dram_bw) * float(hw.efficiency)))
    if kernel:
        t = max(t, float(hw.launch_floor))
    return t


def to_ns(seconds: float) -> int:
    """Integer nanoseconds for the ILP (CP-SAT needs integer coefficients)."""
    return int(round(seconds * 1e9))
