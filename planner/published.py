"""The published timings of Wan 2.2 A14B on Tenstorrent, each with the configuration that ran it.

`PUBLISHED` holds every published end-to-end figure we have (docs/hardware-figures.md §5, seed 000):
per `Row` the figure, what it covers and how an ambiguous source is read; its `Scheme` (the parallel
configuration) and the software stack that ran it (`STACKS`: tt-metal's hand-written model with its
fused kernels, or tt-xla's compiler path). `scheme_plan` writes a scheme as a plan for the full-size
model (`NUM_BLOCKS`: tt-metal's SP x TP axes and FSDP through the planner's ``only=``; tt-xla's hand
specs); `UMT5_XXL` is the text encoder some rows also timed; `AUDIT` the one per-op device profile published
(tt-xla's PERF_AUDIT of a one-block A14B forward), by the kernel classes of `planner.ttnn_kernels`. Data only: `planner.calibration` prices
and fits these rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

from planner.graph import Graph
from planner.hardware import HardwareProfile
from planner.mesh import MeshSpec


@dataclass(frozen=True)
class Stack:
    """What a software stack lowers, as far as the price of a forward goes."""

    name: str
    description: str
    fuses_glue: bool  # elementwise glue fused into the kernels around it (else one kernel per op)
    ring_attention: bool  # SP self-attention as ring SDPA (K/V chunks circulate under the compute)
    fused_matmul_collectives: bool  # all-gather + matmul and matmul + reduce-scatter as one kernel


STACKS = {
    s.name: s
    for s in (
        Stack(
            "tt-metal",
            "tt-metal's hand-written Wan 2.2 (models/tt_dit, sources K, M): ring_joint_sdpa, "
            "all_gather_minimal_matmul, matmul + strided reduce-scatter with the gated residual fused, "
            "fused RMSNorm + RoPE",
            fuses_glue=True,
            ring_attention=True,
            fused_matmul_collectives=True,
        ),
        Stack(
            "tt-xla",
            "tt-xla: diffusers' model compiled by tt-mlir (seed 000): one TTNN op per op, no overlap",
            fuses_glue=False,
            ring_attention=False,
            fused_matmul_collectives=False,
        ),
    )
}


@dataclass(frozen=True)
class Scheme:
    """A source's parallel configuration."""

    stack: str
    sp: Optional[int]  # mesh axis index of sequence parallelism (None: no SP)
    tp: int  # mesh axis index of tensor parallelism
    fsdp: bool = False  # weights also split over the SP axis, gathered per use
    hand: str = ""  # "tt-xla": the seed's hand plan, the tt-xla preset (`planner.hand_plans.tt_xla_plan`)
    kv_slices: int = 0  # static slices per forward the source added (tt-xla's SP padding: K/V slice-backs)


@dataclass(frozen=True)
class Row:
    """One published figure and what produced it."""

    source: str
    system: str  # hardware profile
    mesh: str
    resolution: str
    what: str  # what the figure covers, e.g. "denoising, 40 steps"
    published_s: float
    scheme: Scheme
    forwards: int  # DiT forwards the figure covers (40 steps x 2: CFG as two sequential forwards)
    parts: tuple[str, ...] = ()  # what else it timed: "text", "vae"
    frames: int = 81
    reading: str = ""  # how an ambiguous source is read
    # what the source did that the model cannot see, where that keeps the row out of the fit
    unseen: str = ""
    blocks: int = 0  # DiT blocks the forward ran (0: all of them, `NUM_BLOCKS`)
    # the pricings (`planner.calibration.PRICINGS`) that do see what `unseen` names: the row is fitted under those
    seen_by: tuple[str, ...] = ()

    @property
    def fitted(self) -> bool:
        return self.fitted_under("planner")

    def fitted_under(self, pricing: str) -> bool:
        return not self.unseen or pricing in self.seen_by

    @property
    def num_blocks(self) -> int:
        return self.blocks or NUM_BLOCKS


_K = "tt-metal Wan2_2.md (K)"
_SEED = "tt-xla seed 000"
_AUDIT = "tt-xla PERF_AUDIT_2026_05_13"
_CFG2 = 80  # 40 steps x (cond + uncond), as tt-metal's combined_step runs them (M)

PUBLISHED: tuple[Row, ...] = (
    Row(_K, "wh-loudbox", "2x4", "480p", "video, 40 steps", 735, Scheme("tt-metal", 0, 1, fsdp=True), _CFG2,
        ("text", "vae"), reading="s/video: text encoder + denoising + VAE decode; experts loaded dynamically"),
    Row(_K, "bh-quietbox", "2x2", "480p", "video, 40 steps", 466, Scheme("tt-metal", 0, 1, fsdp=True), _CFG2,
        ("text", "vae"), reading="s/video: text encoder + denoising + VAE decode"),
    Row(_K, "bh-loudbox", "2x4", "480p", "video, 40 steps", 207, Scheme("tt-metal", 1, 0), _CFG2,
        ("text", "vae"), reading="s/video: text encoder + denoising + VAE decode"),
    Row(_K, "wh-galaxy", "4x8", "720p", "video, 40 steps", 354, Scheme("tt-metal", 1, 0, fsdp=True), _CFG2,
        ("text", "vae"), reading="s/video: text encoder + denoising + VAE decode"),
    Row(_K, "bh-galaxy", "4x8", "480p", "denoising, 40 steps", 45.3, Scheme("tt-metal", 1, 0), _CFG2,
        reading="uncached baseline, denoising only"),
    Row(_K, "bh-galaxy", "4x8", "720p", "denoising, 40 steps", 142.4, Scheme("tt-metal", 1, 0), _CFG2,
        reading="uncached baseline, denoising only"),
    Row(_SEED, "wh-loudbox", "1x4", "480p", "warm forward", 77, Scheme("tt-xla", None, 1, hand="tt-xla"), 1,
        reading="'warm time' read as one DiT forward (81 frames, batch 1) on Wormhole LoudBox chips"),
    Row(_SEED, "wh-loudbox", "2x4", "480p", "warm forward", 41, Scheme("tt-xla", 0, 1, hand="tt-xla"), 1,
        reading="'warm time' read as one DiT forward (81 frames, batch 1) on a Wormhole LoudBox"),
    Row(_SEED, "wh-galaxy", "8x4", "480p", "warm forward", 5.6, Scheme("tt-xla", 0, 1, hand="tt-xla"), 1,
        reading="'s/iter' read as one DiT forward (81 frames, batch 1) on a Wormhole Galaxy"),
    Row(_SEED, "wh-galaxy", "8x4", "480p", "warm forward, SP padding", 8.9,
        Scheme("tt-xla", 0, 1, hand="tt-xla", kv_slices=81), 1,
        reading="as the 5.6 s row plus the 81 static slices the seed counted (40 blocks x K, V + the output)",
        unseen="the seed measured +3.3 s for 81 ttnn.slice_static (41 ms each, ~70x a DRAM round trip of the "
               "gathered K/V); the model prices a static slice as one kernel with a DRAM round trip"),
    Row(_AUDIT, "bh-quietbox", "1x4", "480p", "warm forward, 1 block", 1.031, Scheme("tt-xla", None, 1, hand="tt-xla"),
        1, reading="test_wan_dit_480p_sharded, MAX_BLOCKS=1, BH 4-chip, with its patchify and half-rotation RoPE "
                   "fixes (1,255 ms before them); the heads over the 4 chips as the seed's hand plan splits them",
        unseen="data movement: the audit's profile has reshape, permute, transpose and tilize at 36 % of device time "
               "(`AUDIT`); the planner-op pricing prices views free", blocks=1, seen_by=("ttnn",)),
)  # fmt: skip


@dataclass(frozen=True)
class KernelClass:
    """One class of TTNN kernels in a device profile: its device time and launches per forward."""

    ms: float
    count: float


@dataclass(frozen=True)
class DeviceProfile:
    """A published per-op device profile of one forward, by the classes of `planner.ttnn_kernels`."""

    source: str
    row: str  # the `Row.what` of the forward it profiles
    program: str  # what ran, where it differs from the row's program
    forwards: int  # forwards the profile's totals cover (how that is known: `reading`)
    classes: Mapping[str, KernelClass]  # class -> per forward
    device_ms: float  # all device time per forward
    reading: str
    # device time per forward that fixes made after the profile saved from one class (class -> ms), where the row
    # times the fixed program
    fixed: Mapping[str, float] = field(default_factory=dict)

    def share(self, cls: str) -> float:
        return self.classes[cls].ms / self.device_ms


_AUDIT_FORWARDS = 6


def _per_forward(us: float, count: int) -> KernelClass:
    return KernelClass(us / 1e3 / _AUDIT_FORWARDS, count / _AUDIT_FORWARDS)


# tt-xla PERF_AUDIT_2026_05_13.md, its stacked report (perf-dit14.txt): device µs and launches per op class, summed
# over the profiled forwards; ReshapeView 1,263,602 µs is 17.99 % of all device time
AUDIT = DeviceProfile(
    _AUDIT,
    "warm forward, 1 block",
    "the audit's baseline (1,255 ms warm): diffusers' strided RoPE writes lowered to an embedding chain, "
    "the patchify conv3d output permuted twice",
    _AUDIT_FORWARDS,
    {
        "move": _per_forward(1_263_602 + 817_145 + 111_625 + 304_471, 197 + 82 + 48 + 154),
        "eltwise": _per_forward(1_204_497, 328),
        "fused": _per_forward(855_751, 12),
        "matmul": _per_forward(368_786, 84),
        "typecast": _per_forward(294_939, 211),
    },
    1_263_602 / 0.1799 / 1e3 / _AUDIT_FORWARDS,
    "6 forwards: the profile counts 6 patch conv3d (one per forward) and 12 SDPA (two per block); moves are "
    "ReshapeView, Permute, Transpose and TilizeWithValPadding; fused is SDPA (its norms and GELU are not among the "
    "nine classes it lists)",
    # the row's 1,031 ms has the patchify (-34 ms) and RoPE half-rotation (-190 ms) fixes; the audit's IR diffs show
    # both as data movement gone (permutes, reshapes, a retile; the embedding chain's permutes, reshapes, tilize)
    {"move": 34 + 190},
)


@dataclass(frozen=True)
class TextEncoder:
    """An encoder-only transformer priced from its configuration (no graph: the planner plans DiTs)."""

    name: str
    d_model: int
    d_ff: int  # gated: two input projections
    layers: int
    d_attn: int  # heads x head dim
    tokens: int
    prompts: int  # cond + uncond
    source: str


UMT5_XXL = TextEncoder("umt5-xxl", 4096, 10240, 24, 4096, 512, 2, "google/umt5-xxl config.json (Wan 2.2 text encoder)")


def profile_mesh(row: Row) -> MeshSpec:
    from planner.mesh import parse_mesh

    return parse_mesh(row.mesh)


def scheme_only(scheme: Scheme, mesh: MeshSpec) -> Mapping[str, str]:
    """The planner's `only=` that makes its block macros the scheme's (tt-metal: head-TP on the TP axis,
    SP on the SP axis, the stream split on the TP axis between ops: STATE B; FSDP over the SP axis)."""
    names = mesh.axis_names
    tp = names[scheme.tp]
    sp = names[scheme.sp] if scheme.sp is not None else None
    fsdp = r"\+FSDP" if scheme.fsdp else ""
    spp = rf"\+SP\({sp}\)" if sp else ""
    return {
        "attn1": rf"^head-TP\({tp}\){spp}{fsdp}\+hidden\({tp}\)$",
        "attn2": rf"^head-TP\({tp}\){spp}{fsdp}\+hidden\({tp}\)$",
        "ffn": rf"^Megatron\({tp}\){spp}{fsdp}\+hidden\({tp}\)$",
    }


def scheme_plan(graph: Graph, row: Row, hw: HardwareProfile):
    """The row's configuration as a plan for `graph` (the planner under `only=`, or the hand plan)."""
    from planner.autoplan import plan_graph
    from planner.hand_plans import tt_xla_plan
    from planner.mesh import parse_mesh

    mesh = parse_mesh(row.mesh)
    if row.scheme.hand == "tt-xla":
        return tt_xla_plan(graph, mesh, hw, num_blocks=row.num_blocks)  # the tt-xla preset, whatever its memory
    # the source ran it: price its time whatever its memory (the planner's budget is not the question)
    return plan_graph(graph, mesh, hw, num_blocks=NUM_BLOCKS, memory_gb=1e6, only=scheme_only(row.scheme, mesh))


NUM_BLOCKS = 40  # Wan 2.2 A14B
