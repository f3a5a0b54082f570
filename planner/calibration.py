"""Calibration: the cost model held against published timings of Wan 2.2 A14B on Tenstorrent.

The rows are `planner.published`'s (`PUBLISHED`: each figure with its `Scheme` and software stack,
re-exported here). A row is priced the way the planner prices a plan: the scheme written as a plan
for the full-size model (`scheme_plan`), one DiT forward is evaluated by the op rules
(`planner.autoplan.evaluate_forward`) and taken apart into the terms the free factors scale (`Terms`):

    forward = roofline / compute_eff + kernels x op_overhead + latency + transfer / link_eff
              + Σ overlapped sites

where ``roofline`` is every op's roofline at the chip's peak, ``latency`` and ``transfer`` the
collectives' α and bytes terms under the measured link fits (sources F, G), and a site the stack
overlaps (ring attention: a K/V chunk's transfer under each ring step's attention; tt-metal's fused
all-gather + matmul and matmul + reduce-scatter) costs the larger of its transfer and its compute
(`planner.cost_model.ring_attention_seconds`, `fused_gather_matmul_seconds`). A row's prediction
multiplies the forward by the forwards it ran (40 steps x 2: CFG as two sequential forwards) and adds
what else it timed (`Part`: the text encoder, the VAE decode) priced alike.

A forward on tt-xla's stack is priced one of two ways (`PRICINGS`): per planner op that moves data (one kernel
with a DRAM round trip, views free: what the planner prices, `planner.autoplan.price_plan`), or by what TTNN runs
(``"ttnn"``: a block's launches counted by `planner.ttnn_kernels`, its reshapes, permutes and layout copies
among them, each a DRAM round trip at a move efficiency, ``move_s``). The move efficiency is not fitted: the
end-to-end rows cannot pin it, so each explanation of them (`move_rates`: DRAM bandwidth, or as slow as tt-xla's
PERF_AUDIT profiled data movement) is fitted on its own and reported.

`fit` chooses the three `Factors` (the only free numbers; none per row) minimising the squared log
error over the rows, on a grid for the two efficiencies with the overhead solved for each;
`leave_one_out` refits without each row in turn and predicts it. The fitted factors are data
(`planner/calibration.json`, written by ``bench/bench_calibration.py --write``) that the Tenstorrent
profiles read (`planner.hardware`).

Why one module of ~480 lines: the terms a row is taken apart into (`forward_terms`, `vae_terms`,
`text_terms`) and the fit over them (`fit`, `leave_one_out`) are one model — the three `Factors` are
defined by which terms they scale, and every term exists to be scaled by one of them. The rows themselves
are data in `planner.published`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping, Optional, Sequence

import numpy as np

from planner.cost_model import collective_terms
from planner.graph import Graph, Node
from planner.hardware import Figure, HardwareProfile, get_profile
from planner.mesh import MeshSpec
from planner.published import (
    AUDIT,
    NUM_BLOCKS,
    PUBLISHED,
    STACKS,
    UMT5_XXL,
    DeviceProfile,
    Row,
    Scheme,
    Stack,
    TextEncoder,
    profile_mesh,
    scheme_only,
    scheme_plan,
)

__all__ = ["NUM_BLOCKS", "PUBLISHED", "STACKS", "UMT5_XXL", "Row", "Scheme", "Stack", "TextEncoder"]
__all__ += ["profile_mesh", "scheme_only", "scheme_plan"]

CALIBRATION_FILE = Path(__file__).with_name("calibration.json")

# tt-metal PR #36711: all_gather_minimal_matmul costs ~10 % over the matmul alone
FUSED_MATMUL_OVERHEAD = Figure(
    0.10, "tt-metal PR #36711 (all_gather_minimal_matmul vs minimal_matmul)", kind="measured"
)

# ops that only re-view their input: no data moves through a kernel, an all-gather flows through them
_VIEWS = frozenset(
    {"permute", "transpose", "view", "reshape", "unflatten", "flatten", "contiguous", "getitem", "expand", "unsqueeze"}
)


@dataclass(frozen=True)
class Factors:
    """The free numbers of the cost model on Tenstorrent."""

    compute_efficiency: float
    link_efficiency: float
    op_overhead: float  # seconds per kernel
    # the fraction of DRAM bandwidth a data-movement kernel achieves (`Terms.move_s`; the TTNN pricing only): not
    # fitted, each explanation of the rows (`move_rates`) carries its own
    move_efficiency: float = 1.0


@dataclass(frozen=True)
class Overlap:
    """A site the stack overlaps: `transfer` (latency, bytes term at full bandwidth) under `compute`
    (roofline at peak) — ring attention over `n` devices, or a fused matmul + collective."""

    kind: str  # "ring" | "fused"
    compute_s: float
    latency_s: float
    transfer_s: float
    n: int
    times: int

    def seconds(self, f: Factors):
        """Under `f` (numbers, or numpy arrays of them: the fit prices a grid at once); the same
        formulas as `planner.cost_model.ring_attention_seconds` / `fused_gather_matmul_seconds`."""
        compute = self.compute_s / f.compute_efficiency
        move = self.latency_s + self.transfer_s / f.link_efficiency
        if self.kind == "ring":
            step = compute / self.n
            return (step + (self.n - 1) * np.maximum(step, move)) * self.times
        return np.maximum(move, compute * (1 + float(FUSED_MATMUL_OVERHEAD))) * self.times


@dataclass(frozen=True)
class Terms:
    """One priced piece of work taken apart into what the factors scale."""

    roofline_s: float = 0.0
    kernels: float = 0.0
    latency_s: float = 0.0
    transfer_s: float = 0.0
    overlaps: tuple[Overlap, ...] = ()
    move_s: float = 0.0  # the data-movement kernels' DRAM round trips at full bandwidth (TTNN pricing)

    def seconds(self, f: Factors) -> float:
        plain = (
            self.roofline_s / f.compute_efficiency
            + self.kernels * f.op_overhead
            + self.latency_s
            + self.transfer_s / f.link_efficiency
            + self.move_s / f.move_efficiency
        )
        return plain + sum(o.seconds(f) for o in self.overlaps)

    def __add__(self, other: "Terms") -> "Terms":
        return Terms(
            self.roofline_s + other.roofline_s,
            self.kernels + other.kernels,
            self.latency_s + other.latency_s,
            self.transfer_s + other.transfer_s,
            self.overlaps + other.overlaps,
            self.move_s + other.move_s,
        )

    def times(self, k: float) -> "Terms":
        return Terms(
            self.roofline_s * k,
            self.kernels * k,
            self.latency_s * k,
            self.transfer_s * k,
            tuple(replace(o, times=o.times * k) for o in self.overlaps),
            self.move_s * k,
        )


def neutral(hw: HardwareProfile, stack: Stack) -> HardwareProfile:
    """`hw` with every free factor neutral (efficiencies 1, no overhead, no floor) and the stack's glue."""
    one = Figure(1.0, "neutral (calibration)", kind="assumed")
    zero = Figure(0.0, "neutral (calibration)", kind="assumed")
    return replace(
        hw, efficiency=one, link_efficiency=one, op_overhead=zero, launch_floor=zero, fuses_glue=stack.fuses_glue
    )


def forward_terms(
    graph: Graph, plan, hw: HardwareProfile, stack: Stack, scheme: Scheme, num_blocks: int, pricing: str = "planner"
) -> Terms:
    """One DiT forward of `graph` under `plan` on `hw`, as `Terms` for `stack`, under `pricing` (`PRICINGS`)."""
    from planner.autoplan import evaluate_forward

    nhw = neutral(hw, stack)
    fwd = evaluate_forward(graph, plan, nhw, num_blocks=num_blocks)
    g, mesh = fwd.graph, plan.mesh
    by_loc = {str(n.location): n for n in g}
    names = mesh.axis_names
    sp = (names[scheme.sp],) if scheme.sp is not None else ()
    tp = (names[scheme.tp],)
    # keyed by (part, node): a block range under its own decisions is another part naming the same ops
    per_op: dict[tuple[int, str], tuple[float, bool, int]] = {}
    for i, (ev, times) in enumerate(fwd.parts):
        for name, (roof, kernel) in ev.per_op.items():
            per_op[i, name] = (roof, kernel, times)
    overlapped: dict[tuple[int, str], list] = {}  # (part, compute node) -> [kind, latency, transfer, n, times]
    latency = transfer = 0.0
    for e, times, part in fwd.events:
        node = by_loc.get(e.where)
        site = _overlap_site(g, node, e, stack, sp, tp) if node is not None else None
        lat, xfer = collective_terms(e.kind, e.bytes, e.axes, mesh, nhw)
        if site is None:
            latency += lat * times
            transfer += xfer * times
            continue
        kind, at = site
        if kind == "ring":
            n = mesh.axis_size(sp[0])
            lat, xfer = collective_terms("collective-permute", e.bytes / n, sp, mesh, nhw)
        else:
            n = 1
        acc = overlapped.setdefault((part, at.name), [kind, 0.0, 0.0, n, times])
        acc[1] = max(acc[1], lat)  # K and V travel together: one latency, their bytes summed
        acc[2] += xfer
    overlaps = []
    roofline = kernels = moves = 0.0
    ttnn = pricing == "ttnn" and not stack.fuses_glue
    if ttnn:
        kernels, moves = _ttnn_blocks(graph, plan, hw, num_blocks)
    for key, (roof, kernel, times) in per_op.items():
        if not (ttnn and 0 < key[0] < len(fwd.parts) - 1):  # a block's launches are TTNN's count
            kernels += kernel * times
        if key in overlapped:
            kind, lat, xfer, n, t = overlapped[key]
            overlaps.append(Overlap(kind, roof, lat, xfer, n, t))
        else:
            roofline += roof * times
    terms = Terms(roofline, kernels, latency, transfer, tuple(overlaps), moves)
    if scheme.kv_slices:
        terms = terms + _slices(g, plan.mesh, hw, scheme.kv_slices)
    return terms


def _ttnn_blocks(graph: Graph, plan, hw: HardwareProfile, num_blocks: int) -> tuple[float, float]:
    """The blocks of one forward as TTNN runs them (`planner.ttnn_kernels.plan_kernels`): their kernel launches
    (collectives apart: their latency prices them) and their data movement's DRAM round trips at full bandwidth."""
    from planner.ttnn_kernels import plan_kernels

    blocks = plan_kernels(graph, plan, num_blocks).values()
    launches = sum(k.total - k.collective for k in blocks)
    return float(launches), sum(2 * k.move_bytes for k in blocks) / float(hw.dram_bw)


def _overlap_site(graph: Graph, node: Node, e, stack: Stack, sp, tp) -> Optional[tuple[str, Node]]:
    """(kind, the compute op it hides under) where `stack` overlaps collective `e` made at `node`."""
    # the K/V gather itself (at the attention or at a view of its operand), not a weight gathered for a
    # projection whose output happens to reach an attention
    kv = node.op in _VIEWS or node.op == "scaled_dot_product_attention"
    if stack.ring_attention and kv and e.kind == "all-gather" and tuple(e.axes) == sp:
        sdpa = _reaches(graph, node, {"scaled_dot_product_attention"})
        if sdpa:
            return "ring", sdpa[0]
    if stack.fused_matmul_collectives and tuple(e.axes) == tp:
        if e.kind == "reduce-scatter" and node.op == "linear":
            return "fused", node
        if e.kind == "all-gather":
            mm = _reaches(graph, node, {"linear"}, through=_VIEWS | {"type_as", "to", "float"})
            if mm:
                return "fused", mm[0]
    return None


def _reaches(graph: Graph, node: Node, ops: set, through: frozenset = _VIEWS) -> list[Node]:
    """The ops of kind `ops` that read `node`'s value through views only (itself, if it is one)."""
    if node.op in ops:
        return [node]
    out, todo, seen = [], [node], {node.name}
    while todo:
        for u in graph.users(todo.pop().name):
            if u.name in seen:
                continue
            seen.add(u.name)
            if u.op in ops:
                out.append(u)
            elif u.op in through:
                todo.append(u)
    return out


def _slices(graph: Graph, mesh: MeshSpec, hw: HardwareProfile, count: int) -> Terms:
    """`count` static slices of the gathered K/V (one kernel each, a DRAM round trip)."""
    from planner.hand_plans import tp_sp_axes

    sdpa = next(n for n in graph if n.op == "scaled_dot_product_attention")
    k = graph[sdpa.inputs[1]].out
    tp, _ = tp_sp_axes(mesh)
    nbytes = math.prod(int(d) for d in k.shape) * k.itemsize / mesh.axis_size(tp)
    return Terms(roofline_s=count * 2 * nbytes / float(hw.dram_bw), kernels=count)


# --- fitting ----------------------------------------------------------------------------------------

COMPUTE_GRID = tuple(0.05 * 1.04**i for i in range(80) if 0.05 * 1.04**i <= 1.0)
LINK_GRID = tuple(0.05 * 1.04**i for i in range(100) if 0.05 * 1.04**i <= 1.5)
# The rows cannot pin the per-op overhead down (without BH Galaxy 480p the best fit puts it at 0.3 ms,
# with it at 0): it is fitted inside the dispatch cost tt-metal measured per TTNN op, 3k to 9k cycles
# at the AI clock (1 GHz Wormhole, 1.35 GHz Blackhole): 2.2 to 9 µs
DISPATCH = Figure(
    4e-6, "tt-metal #12074 (traced TTNN ops: ~4k cycles of dispatch each, 3k-6k, outliers 8-9k)", kind="measured"
)
OVERHEAD_GRID = tuple(2.2e-6 * 1.05**i for i in range(30) if 2.2e-6 * 1.05**i <= 9e-6)


@dataclass(frozen=True)
class Priced:
    """A row with its work taken apart: the prediction is ``Σ terms.seconds(factors) x times``."""

    row: Row
    pieces: tuple[tuple[str, Terms, float], ...]  # (part, terms, times)
    pricing: str = "planner"

    @property
    def fitted(self) -> bool:
        return self.row.fitted_under(self.pricing)

    def seconds(self, f: Factors) -> float:
        return sum(t.seconds(f) * k for _, t, k in self.pieces)

    def part_seconds(self, f: Factors) -> dict[str, float]:
        out: dict[str, float] = {}
        for part, t, k in self.pieces:
            out[part] = out.get(part, 0.0) + t.seconds(f) * k
        return out


# The factor each stack has its own of; the others are shared by every row. The two stacks run the
# same chips and the same TTNN matmul / SDPA kernels, but not the same collectives: tt-metal's are its
# asynchronous fabric CCLs, fused into the matmuls, on every link (the fits F, G measure those);
# tt-xla's are what tt-mlir lowers its all-reduces and all-gathers to.
PER_STACK = ("link_efficiency",)
_AXES = ("compute_efficiency", "link_efficiency", "op_overhead")


@dataclass(frozen=True)
class Fit:
    factors: Mapping[str, Factors]  # stack -> its factors
    rms_log_error: float

    def of(self, row: Row) -> Factors:
        return self.factors[row.scheme.stack]


def load() -> Optional[Fit]:
    """The fit ``bench/bench_calibration.py --write`` wrote (`planner/calibration.json`): each stack's
    factors and the fit's RMS log error (as written: rounded to 4 places); None before any fit."""
    if not CALIBRATION_FILE.exists():
        return None
    d = json.loads(CALIBRATION_FILE.read_text())
    return Fit({stack: Factors(**f) for stack, f in d["factors"].items()}, d["rms_log_error"])


def _errors(priced: Sequence[Priced], move_efficiency: float = 1.0) -> dict[str, np.ndarray]:
    """Per stack: Σ log(predicted / published)² of its rows at every grid point (compute x link x overhead)."""
    grid = Factors(
        np.asarray(COMPUTE_GRID)[:, None, None],
        np.asarray(LINK_GRID)[None, :, None],
        np.asarray(OVERHEAD_GRID)[None, None, :],
        move_efficiency,
    )
    out: dict[str, np.ndarray] = {}
    for p in priced:
        err = np.log(p.seconds(grid) / p.row.published_s) ** 2
        out[p.row.scheme.stack] = out.get(p.row.scheme.stack, 0) + err
    return out


def fit(priced: Sequence[Priced], per_stack: Sequence[str] = PER_STACK, move_efficiency: float = 1.0) -> Fit:
    """The factors minimising Σ log(predicted / published)² over the fitted rows of `priced` (a grid
    search: the shared factors are one grid point, each stack's own factors the best for it there)."""
    rows = [p for p in priced if p.fitted]
    errors = _errors(rows, move_efficiency)
    own = tuple(_AXES.index(a) for a in per_stack)
    total = sum(e.min(axis=own, keepdims=True) if own else e for e in errors.values())
    shared = np.unravel_index(int(np.argmin(total)), total.shape)
    factors = {}
    for stack, e in errors.items():
        at = tuple(slice(None) if a in own else shared[a] for a in range(3))
        best = np.unravel_index(int(np.argmin(e[at])), e[at].shape)
        idx = list(shared)
        for a, b in zip(own, best):
            idx[a] = b
        factors[stack] = Factors(COMPUTE_GRID[idx[0]], LINK_GRID[idx[1]], OVERHEAD_GRID[idx[2]], move_efficiency)
    fitted = Fit(factors, 0.0)
    err = [math.log(p.seconds(fitted.of(p.row)) / p.row.published_s) ** 2 for p in rows]
    return Fit(factors, math.sqrt(sum(err) / len(err)))


def leave_one_out(priced: Sequence[Priced], move_efficiency: float = 1.0) -> list[tuple[Priced, float]]:
    """Each row predicted by the factors fitted on the others: (row, predicted seconds). A row the fit
    leaves out (`Priced.fitted` False) is predicted by the fit on all fitted rows."""
    return [(p, float(p.seconds(f.of(p.row)))) for p, f in zip(priced, held_out_fits(priced, move_efficiency))]


def held_out_fits(priced: Sequence[Priced], move_efficiency: float = 1.0) -> list[Fit]:
    """The fit without each row in turn (the spread of the factors the rows allow)."""
    return [fit([q for q in priced if q is not p], move_efficiency=move_efficiency) for p in priced]


def price_all(graphs: Mapping[str, Graph], vaes: Mapping[str, Graph], pricing: str = "planner") -> list[Priced]:
    """Every published row priced: `graphs` / `vaes` are the DiT / VAE decode captured per resolution."""
    return [price(r, graphs[r.resolution], vaes.get(r.resolution), pricing) for r in PUBLISHED]


# How a forward on the TTNN stack is priced (`forward_terms`): "planner" — one kernel per planner op that moves
# data, with its DRAM round trip, views free (what `planner.autoplan.price_plan` prices); "ttnn" — a block's
# launches as TTNN runs them (`planner.ttnn_kernels`: fused attention and norms one kernel each, views as the
# reshapes, permutes and layout copies tt-mlir emits, each a DRAM round trip at the move efficiency)
PRICINGS = ("planner", "ttnn")


def move_rates(priced: Sequence[Priced], audit: DeviceProfile = AUDIT) -> dict[str, float]:
    """The explanations of the rows that the end-to-end times cannot tell apart, as the move efficiency each
    carries: data movement at DRAM bandwidth; or as slow as the audit profiled it, where the audited forward's
    moves (`priced` under the "ttnn" pricing, the audit's row among them) take the device time the audit measured
    for them — in the program the row timed (the profile less what its fixes saved), or in the profile's own."""
    p = next(p for p in priced if p.row.source == audit.source and p.row.what == audit.row)
    move_s = sum(t.move_s * k for _, t, k in p.pieces)
    measured = audit.classes["move"].ms / 1e3
    return {
        "DRAM bandwidth": 1.0,
        "audit, fixed program": move_s / (measured - audit.fixed.get("move", 0.0) / 1e3),
        "audit profile": move_s / measured,
    }


def calibrated(hw: HardwareProfile, factors: Factors, source: str) -> HardwareProfile:
    """`hw` under fitted factors (a Tenstorrent profile as the planner prices it)."""
    return replace(
        hw,
        efficiency=Figure(factors.compute_efficiency, source, kind="fitted"),
        link_efficiency=Figure(factors.link_efficiency, source, kind="fitted"),
        op_overhead=Figure(factors.op_overhead, source, kind="fitted"),
        launch_floor=Figure(0.0, "replaced by the fitted per-op overhead", kind="fitted"),
    )


def price(row: Row, graph: Graph, vae: Optional[Graph] = None, pricing: str = "planner") -> Priced:
    """`row`'s work taken apart: its DiT forwards (on `graph`, the model captured at the row's
    resolution) and the other parts it timed (the VAE decode on `vae`, the decode graph captured at the
    row's resolution and frames; the text encoder from `UMT5_XXL`)."""
    hw = get_profile(row.system)
    stack = STACKS[row.scheme.stack]
    plan = scheme_plan(graph, row, neutral(hw, stack))
    forward = forward_terms(graph, plan, hw, stack, row.scheme, row.num_blocks, pricing)
    pieces = [("denoising", forward, float(row.forwards))]
    if "text" in row.parts:
        pieces.append(("text", text_terms(hw, profile_mesh(row), stack), 1.0))
    if "vae" in row.parts:
        if vae is None:
            raise ValueError(f"row {row.system} {row.resolution} timed the VAE decode: pass its decode graph")
        pieces.append(("vae", vae_terms(vae, hw, profile_mesh(row), stack), 1.0))
    return Priced(row, tuple(pieces), pricing)


def vae_terms(graph: Graph, hw: HardwareProfile, mesh: MeshSpec, stack: Stack) -> Terms:
    """The VAE decode as the sources run it (spatial split over the whole mesh, `preset="spatial"`),
    priced by the VAE planner: its roofline and collectives under the neutral profile, its kernel count
    as the change in compute that a per-op overhead of one millisecond makes (the same plan both times)."""
    from planner.vae_plan import plan_vae

    base = neutral(hw, stack)
    p0 = plan_vae(graph, mesh, base, preset="spatial", memory_gb=1e6)
    probe = replace(base, op_overhead=Figure(1e-3, "probe", kind="assumed"))
    p1 = plan_vae(graph, mesh, probe, preset="spatial", memory_gb=1e6)
    if p1.params != p0.params or p1.activations != p0.activations:
        raise RuntimeError("the VAE plan changed under the kernel-count probe; cannot take it apart")
    latency = transfer = 0.0
    for c in p0.collectives:
        lat, xfer = collective_terms(c.kind, c.bytes, c.axes, mesh, base)
        latency += lat * c.count
        transfer += xfer * c.count
    kernels = (p1.predicted.compute_seconds - p0.predicted.compute_seconds) / 1e-3
    return Terms(p0.predicted.compute_seconds, round(kernels), latency, transfer)


def text_terms(hw: HardwareProfile, mesh: MeshSpec, stack: Stack, enc: TextEncoder = UMT5_XXL) -> Terms:
    """The text encoder, tensor-parallel over the whole mesh (tt-metal runs UMT5 with TP, source K):
    its matmul FLOPs and weight reads spread over the devices, one kernel per matmul and attention."""
    per_layer = 4 * enc.d_model * enc.d_attn + 3 * enc.d_model * enc.d_ff  # q, k, v, o + gated FFN
    tokens = enc.tokens * enc.prompts
    flops = enc.layers * (2 * per_layer * tokens + 4 * tokens * enc.tokens * enc.d_attn)
    weights = enc.layers * per_layer * 2  # bf16
    d = mesh.size
    roof = max(flops / d / float(hw.peak_flops), weights / d / float(hw.dram_bw))
    return Terms(roofline_s=roof, kernels=enc.layers * 8)
