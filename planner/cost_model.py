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

Compute: ``max(flops / peak, bytes / dram_bw) / eff`` per op; a real kernel (matmul, attention, norm,
conv) is floored at the launch floor and pays the per-op overhead on top. Where the compiler fuses
glue (XLA: ``HardwareProfile.fuses_glue``) elementwise ops pay their output bytes and no launch;
where it does not (TTNN), every op that moves data is a kernel with a DRAM round trip
(`planner.propagate`). Views are free. The bytes term of a collective runs at the profile's
``link_efficiency`` of the fit's bandwidth.

Overlap, for the lowerings that have it (`ring_attention_seconds`, `fused_gather_matmul_seconds`):
a transfer hidden behind compute costs the larger of the two, not the sum.
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
    if kind in hw.unlowerable and axis_devices(mesh, axes) > 1 and nbytes > 0:
        return UNLOWERABLE_S
    latency, transfer = collective_terms(kind, nbytes, axes, mesh, hw)
    return latency + transfer / float(hw.link_efficiency)


def collective_terms(
    kind: str, nbytes: float, axes: Sequence[str], mesh: MeshSpec, hw: HardwareProfile
) -> tuple[float, float]:
    """One call's ``(a + b·hops, bytes_term / bw)``: its latency and its transfer at the fit's full
    bandwidth (`collective_seconds` divides the transfer by the profile's link efficiency)."""
    n = axis_devices(mesh, axes)
    if n <= 1 or nbytes <= 0:
        return 0.0, 0.0
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
    return float(fit.a) + float(fit.b) * hops, term / float(fit.bw)


def roofline_seconds(flops: float, nbytes: float, hw: HardwareProfile) -> float:
    """One op's roofline at the profile's peak (no efficiency factor, no launch cost)."""
    return max(flops / float(hw.peak_flops), nbytes / float(hw.dram_bw))


def op_seconds(flops: float, nbytes: float, kernel: bool, hw: HardwareProfile) -> float:
    """Time of one op on one device: its roofline at the profile's efficiency; a kernel also pays the
    launch floor (a minimum) and the per-op overhead (added)."""
    t = roofline_seconds(flops, nbytes, hw) / float(hw.efficiency)
    if kernel:
        t = max(t, float(hw.launch_floor)) + float(hw.op_overhead)
    return t


def ring_attention_seconds(attention_s: float, step_transfer_s: float, n: int) -> float:
    """Ring attention over `n` devices: each of the n steps computes attention against the K/V chunk it
    holds (``attention_s / n``) while the next chunk arrives from the neighbour (``step_transfer_s``);
    a transfer is hidden behind its step's compute up to the smaller of the two, the first chunk is
    local."""
    if n <= 1:
        return attention_s
    step = attention_s / n
    return step + (n - 1) * max(step, step_transfer_s)


def fused_gather_matmul_seconds(gather_s: float, matmul_s: float, overhead: float) -> float:
    """An all-gather fused into the matmul that reads it (tt-metal's ``all_gather_minimal_matmul``): the
    transfer runs under the matmul, which pays `overhead` (a fraction) for sharing the cores."""
    return max(gather_s, matmul_s * (1 + overhead))


def to_ns(seconds: float) -> int:
    """Integer nanoseconds for the ILP (CP-SAT needs integer coefficients)."""
    return int(round(seconds * 1e9))
