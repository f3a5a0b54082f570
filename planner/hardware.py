"""Hardware profiles as data: every figure carries its source (and whether it is inferred).

Sources are the keys of ``docs/hardware-figures.md`` (A–T), which gives the full
citations; the important ones:

- A/B: Tenstorrent Wormhole / Blackhole spec pages (docs.tenstorrent.com);
- D: tt-metal ``tech_reports/GEMM_FLOPS`` + ``matrix_engine`` (per-core FLOP/cycle by fidelity);
- E/F/G: tt-metal CCL reports: WH LoudBox α–β fits per collective (F), BH Galaxy busbw (G);
- J: tt-metal fabric mesh-graph descriptors (topology, links per neighbour);
- P/Q: Google TPU docs, jax-ml scaling-book; R/S/T: H100 figures, NCCL issue #1264, NCCL tuning.cc.

Per mesh axis a profile gives an `AxisLink`: the topology of that axis (line / ring / switch) and,
per collective kind, a fit ``T = a + b·hops + bytes_term/bw`` (tt-metal's form, source F): ``hops``
is n−1 on a line, n/2 on a ring, 1 on a switch. Compute is a roofline with a launch floor
(autoparallel's form); memory is per device.

Figures for bf16. Where a figure had to be derived (per-chip bf16 peak from per-core rates, Galaxy
link bandwidth as F's one-link fit × links per neighbour) the `Figure` says ``inferred=True``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Union

from planner.errors import PlanError

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")


# How a figure is known: a vendor's spec or a paper's number, a benchmark someone ran, or a factor this
# project fitted to published end-to-end timings (`planner.calibration`, bench/bench_calibration.py)
PROVENANCE = ("published", "measured", "fitted", "assumed")


@dataclass(frozen=True)
class Figure:
    value: float
    source: str
    inferred: bool = False  # derived from the source's numbers, not stated by it
    note: str = ""
    kind: str = "published"  # one of PROVENANCE

    def __float__(self) -> float:
        return float(self.value)


@dataclass(frozen=True)
class CollectiveFit:
    """``T = a + b·hops + bytes_term / bw`` (seconds, seconds per hop, bytes per second)."""

    a: Figure
    b: Figure
    bw: Figure


@dataclass(frozen=True)
class AxisLink:
    topology: str  # line | ring | switch
    fits: Mapping[str, CollectiveFit]
    links: int = 1
    note: str = ""

    def fit(self, kind: str) -> CollectiveFit:
        if kind in self.fits:
            return self.fits[kind]
        return self.fits["all-gather"]  # collective-permute: a neighbour transfer priced like a gather step


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    description: str
    mesh_shape: tuple[int, ...]
    axes: tuple[AxisLink, ...]  # one per mesh axis (row-major, as the mesh)
    peak_flops: Figure  # bf16 dense, per device
    dram_bw: Figure  # bytes/s per device
    dram_bytes: Figure  # per device
    launch_floor: Figure  # seconds per kernel
    efficiency: Figure = field(
        default_factory=lambda: Figure(
            0.7, "autoparallel cost_models/compute_estimation.py (0.7 of peak)", True, kind="assumed"
        )
    )
    # the bytes term of every collective runs at this fraction of the link fits' bandwidth (the fits are
    # CCL microbenchmarks; inside a model, tt-metal #35952 saw ~50 % of link roofline on Wan shapes)
    link_efficiency: Figure = field(default_factory=lambda: Figure(1.0, "the link fits as measured", kind="assumed"))
    # seconds every kernel adds on top of its roofline (dispatch, a program's setup): additive, where the
    # launch floor is a minimum
    op_overhead: Figure = field(default_factory=lambda: Figure(0.0, "none beyond the launch floor", kind="assumed"))
    # elementwise glue fused into its neighbours (XLA): it pays its output bytes, no kernel; False (TTNN:
    # one kernel per op): every op that moves data is a kernel reading its inputs from DRAM and writing back
    fuses_glue: bool = True
    tile: int = 1  # token granularity the kernels want per device (TT tiles are 32x32)
    vendor: str = ""  # "tenstorrent": compiled by tt-mlir (planner.targets.default_target)
    # collective kinds the partitioner the plan is for cannot lower (planner.targets.Target.profile):
    # priced prohibitively (cost_model.UNLOWERABLE_S)
    unlowerable: tuple[str, ...] = ()

    def axis(self, index: int, size: int) -> AxisLink:
        """The link of mesh axis `index`; a mesh that differs from the profile's native shape uses
        the profile's axis of the same size if there is one, else its last axis."""
        if index < len(self.axes) and index < len(self.mesh_shape) and self.mesh_shape[index] == size:
            return self.axes[index]
        for i, n in enumerate(self.mesh_shape):
            if n == size:
                return self.axes[i]
        return self.axes[-1]

    def figures(self) -> dict[str, Figure]:
        out = {
            "peak_flops": self.peak_flops,
            "dram_bw": self.dram_bw,
            "dram_bytes": self.dram_bytes,
            "launch_floor": self.launch_floor,
            "efficiency": self.efficiency,
            "link_efficiency": self.link_efficiency,
            "op_overhead": self.op_overhead,
        }
        for i, ax in enumerate(self.axes):
            for kind, f in ax.fits.items():
                out[f"axis{i}.{kind}.a"], out[f"axis{i}.{kind}.b"], out[f"axis{i}.{kind}.bw"] = f.a, f.b, f.bw
        return out


US, GB = 1e-6, 1e9

# --- Wormhole ------------------------------------------------------------------------------------------
# F: WH LoudBox fits, T = a + b·hops + bytes/BW (1 link per direction). Line / ring columns.
_F = "F (tt-metal CCL SUMMARY_wormhole_b0_bfloat16_6144 @3a4ad18)"
_WH_FIT = {  # kind: (a µs, b line µs, b ring µs, bw line GB/s, bw ring GB/s)
    "all-gather": (4.47, 1.91, 2.50, 11.8, 20.8),
    "reduce-scatter": (3.23, 3.97, 3.06, 11.1, 16.7),
    "all-reduce": (9.07, 5.82, 5.25, 10.9, 18.4),
    "all-to-all": (2.99, 2.14, 3.40, 7.6, 16.5),
}


def _wh_axis(topology: str, links: int) -> AxisLink:
    ring = topology == "ring"
    fits = {}
    for kind, (a, bl, br, wl, wr) in _WH_FIT.items():
        bw = (wr if ring else wl) * links
        fits[kind] = CollectiveFit(
            Figure(a * US, _F, kind="measured"),
            Figure((br if ring else bl) * US, _F, kind="measured"),
            Figure(
                bw * GB,
                _F,
                inferred=links > 1,
                note=f"{links} links per neighbour x the one-link fit" if links > 1 else "",
                kind="measured",
            ),
        )
    return AxisLink(topology, fits, links)


_WH_PEAK = Figure(128e12, "D (64 cores x 2 TFLOPS BF16 HiFi2)", True, "per-chip bf16 from per-core rate")
_WH_DRAM_BW = Figure(288 * GB, "A (n150: 12 GB GDDR6, 288 GB/s)")
_WH_DRAM = Figure(12 * GB, "A (n300: 24 GB for 2 chips)")
_TT_LAUNCH = Figure(0.0, "none: the fitted per-op overhead is added to every kernel instead", kind="fitted")

# --- Blackhole -----------------------------------------------------------------------------------------
_G = "G (tt-metal CCL SUMMARY_blackhole_bfloat16_8192 @1080d1c)"
# G gives busbw plateaus (2 links) and smallest-message times for n = 2/4/8; a = smallest n=2 time,
# b = (t(n=8) - t(n=2)) / (hops(8) - hops(2)) on a ring (inferred split of the latency).
_BH_FIT = {  # kind: (t2 µs, t8 µs, bw line GB/s (n=4), bw ring GB/s (n=8))
    "all-gather": (4.3, 12.2, 48.0, 94.5),
    "reduce-scatter": (4.7, 12.3, 39.1, 79.8),
    "all-reduce": (9.2, 23.3, 43.1, 86.2),
    "all-to-all": (3.1, 10.6, 35.8, 29.7),
}


def _bh_axis(topology: str) -> AxisLink:
    ring = topology == "ring"
    fits = {}
    for kind, (t2, t8, wl, wr) in _BH_FIT.items():
        hops8, hops2 = (4, 1) if ring else (7, 1)
        fits[kind] = CollectiveFit(
            Figure(t2 * US, _G, kind="measured"),
            Figure((t8 - t2) / (hops8 - hops2) * US, _G, True, "latency per hop from n=2 vs n=8 times", "measured"),
            Figure((wr if ring else wl) * GB, _G, kind="measured"),
        )
    return AxisLink(topology, fits, 2)


_BH_PEAK = Figure(332e12, "D (120 cores x 4096 FLOP/cycle x 1.35 GHz, HiFi2 bf16)", True, "derived in the figures note")
_BH_DRAM_BW = Figure(512 * GB, "B (p150: 512 GB/s)")
_BH_DRAM = Figure(32 * GB, "B (p150: 32 GB GDDR6)")


# --- comparison --------------------------------------------------------------------------------------------
def _uniform_link(topology: str, base: Figure, per_hop: Figure, bandwidth: Figure, note: str) -> AxisLink:
    """A link with one fit for every collective kind but the permute (vendor figures, not measured)."""
    return AxisLink(topology, {k: CollectiveFit(base, per_hop, bandwidth) for k in KINDS[:4]}, note=note)


# (topology, base latency, per hop, bandwidth, note): the comparison systems' one-fit links
_NVLINK, _ICI = (
    _uniform_link(*row)
    for row in (
        (
            "switch",
            Figure(8.4 * US, "T (NCCL ring/simple base)", kind="measured"),
            Figure(3.4 * US, "T (per step)", kind="measured"),
            Figure(370 * GB, "S (NCCL all-reduce busbw ~370 GB/s)", kind="measured"),
            "NVSwitch: one hop between any two GPUs",
        ),
        (
            "line",
            Figure(1 * US, "Q (~1 µs per ICI hop)"),
            Figure(1 * US, "Q"),
            Figure(90 * GB, "Q (v6e ICI 90 GB/s per link one-way)"),
            "v6e-8 has no wraparound (only axes of 16 do, Q)",
        ),
    )
)


_WH = (_WH_PEAK, _WH_DRAM_BW, _WH_DRAM)
_BH = (_BH_PEAK, _BH_DRAM_BW, _BH_DRAM)


# The factors fitted to every published Wan 2.2 timing on Tenstorrent (`planner.calibration`, written by
# bench/bench_calibration.py --write): a Tenstorrent profile prices what tt-xla runs, the stack whose
# programs the planner emits (tt-metal's own factors are in the file, for comparison)
CALIBRATION_FILE = Path(__file__).with_name("calibration.json")
CALIBRATED_STACK = "tt-xla"


def _fitted() -> dict[str, Figure]:
    data = json.loads(CALIBRATION_FILE.read_text())
    f = data["factors"][CALIBRATED_STACK]
    src = f"fitted to {data['rows']} published timings ({CALIBRATED_STACK} factors; {data['written_by']} @{data['commit']})"
    return {
        "efficiency": Figure(f["compute_efficiency"], src, kind="fitted"),
        "link_efficiency": Figure(f["link_efficiency"], src, kind="fitted"),
        "op_overhead": Figure(
            f["op_overhead"], src + ", inside tt-metal #12074's measured dispatch range", kind="fitted"
        ),
    }


_TT_FITTED = _fitted()


def _tenstorrent(name: str, description: str, shape, axes, chip) -> HardwareProfile:
    """A Tenstorrent system: its mesh and links, the chip's (peak, DRAM bandwidth, DRAM), 32x32 tiles,
    the calibrated factors, one TTNN kernel per op (no glue fusion)."""
    return HardwareProfile(
        name,
        description,
        shape,
        axes,
        *chip,
        _TT_LAUNCH,
        **_TT_FITTED,
        fuses_glue=False,
        tile=32,
        vendor="tenstorrent",
    )


PROFILES: dict[str, HardwareProfile] = {
    p.name: p
    for p in [
        _tenstorrent(
            "wh-n300",
            "Wormhole n300 card: 2 chips, 1 usable link between them (H)",
            (1, 2),
            (_wh_axis("line", 1), _wh_axis("line", 1)),
            _WH,
        ),
        _tenstorrent(
            "wh-loudbox",
            "Wormhole LoudBox/T3000: 2x4 mesh of 4 n300s, 1 link per direction (H, I, J)",
            (2, 4),
            (_wh_axis("line", 1), _wh_axis("line", 1)),
            _WH,
        ),
        _tenstorrent(
            "wh-galaxy",
            "Wormhole Galaxy: 8x4 mesh, 4 links per neighbour, ring (torus) axes (J, L)",
            (8, 4),
            (_wh_axis("ring", 4), _wh_axis("ring", 4)),
            _WH,
        ),
        _tenstorrent(
            "bh-quietbox",
            "Blackhole QuietBox: 2x2 p150, 2 links per neighbour (B2, J, K)",
            (2, 2),
            (_bh_axis("line"), _bh_axis("line")),
            _BH,
        ),
        _tenstorrent(
            "bh-loudbox",
            "Blackhole LoudBox: 2x4 p150b, descriptor [LINE, RING] (B2, J)",
            (2, 4),
            (_bh_axis("line"), _bh_axis("ring")),
            _BH,
        ),
        _tenstorrent(
            "bh-galaxy",
            "Blackhole Galaxy: 8x4 torus XY [RING, RING], 2 links per neighbour (J)",
            (8, 4),
            (_bh_axis("ring"), _bh_axis("ring")),
            _BH,
        ),
        HardwareProfile(
            "h100x8",
            "8x H100 SXM on NVSwitch (comparison)",
            (1, 8),
            (_NVLINK, _NVLINK),
            Figure(989.4e12, "R, Q"),
            Figure(3.35e12, "R, Q"),
            Figure(80 * GB, "R, Q"),
            Figure(7 * US, "autoparallel compute_estimation.py", kind="assumed"),
        ),
        HardwareProfile(
            "tpu-v6e-8",
            "8x TPU v6e, 2x4 ICI mesh (comparison)",
            (2, 4),
            (_ICI, _ICI),
            Figure(918e12, "P"),
            Figure(1638 * GB, "P"),
            Figure(32 * GB, "P"),
            Figure(2 * US, "Q (~1 µs/hop; XLA fuses, 2 µs per op assumed)", True, kind="assumed"),
        ),
    ]
}


# The one default-hardware rule, used by every entry point (backend, `wancompile plan`, plan_graph,
# plan_vae): the Tenstorrent system whose native mesh has this shape, else FALLBACK_HARDWARE.
DEFAULT_FOR_MESH = {
    (1, 2): "wh-n300",
    (2, 2): "bh-quietbox",
    (2, 4): "wh-loudbox",
    (8, 4): "wh-galaxy",
    (4, 8): "wh-galaxy",
}
FALLBACK_HARDWARE = "wh-loudbox"


def default_hardware(mesh) -> str:
    """Profile name for a mesh (a `MeshSpec` or a shape) when none is given."""
    shape = tuple(getattr(mesh, "shape", mesh))
    return DEFAULT_FOR_MESH.get(shape, FALLBACK_HARDWARE)


class UnknownHardware(PlanError):
    """A hardware name that is not one of `PROFILES`."""


def get_profile(name: str) -> HardwareProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise UnknownHardware(
            f"unknown hardware profile {name!r}; choose one of {', '.join(sorted(PROFILES))}"
        ) from None


def resolve_hardware(hardware: Union[str, HardwareProfile, None], mesh) -> HardwareProfile:
    """The one way every entry point gets its profile: a `HardwareProfile` as given, a name looked up
    (`UnknownHardware` if it is not one), None the mesh's default (`default_hardware`)."""
    if isinstance(hardware, HardwareProfile):
        return hardware
    return get_profile(hardware or default_hardware(mesh))


def is_tenstorrent(name: str) -> bool:
    """Whether profile `name` is a Tenstorrent system (its programs are compiled by tt-mlir)."""
    return get_profile(name).vendor == "tenstorrent"
