"""Targets: what the partitioner that really runs does with a plan's layouts, one record per partitioner.

A plan is compiled by one of two partitioners (DESIGN.md §5 "Targets"):

- ``gspmd``: XLA's SPMD partitioner (CPU, GPU, TPU). The op rules (`planner.propagate`) model it;
  its partitioned HLO is the ground truth (`wancompile.hlo`), and the plan's ``collectives`` are in its
  terms: one all-reduce over ``(batch, model)`` is one instruction.
- ``tt-mlir``: Tenstorrent's compiler. tt-xla hands it the annotated, unpartitioned program; it
  partitions with Shardy and lowers to TTNN, whose final IR is the ground truth
  (`wancompile.tt.ttnn`). Measured on its compile-only mode (docs/tenstorrent.md):

  * Shardy fills every layout a plan leaves open, differently from GSPMD, so plans for it are pinned
    (`planner.pins`): every decided layout is a constraint;
  * a TTNN collective runs over one mesh axis (``cluster_axis``): a reduction or gather over two axes
    is one op per axis;
  * all-to-all and collective-permute become ``ttnn.point_to_point`` transfers, one per (sender,
    receiver) pair, and only between chips of one mesh row or column (tt-mlir PR #6286); Shardy's own
    collective-permute is not lowered at all (tt-mlir #3370);
  * a convolution's spatial dims are pass-through for Shardy: a spatially split conv gets no halo
    exchange (tt-mlir #8216) — each chip would pad its own tile with zeros, a silently wrong result, so
    for this target the lowering writes the halo into the program (`wancompile.halo`: every tile's edge
    rows all-gathered, the tiles moved into the batch of an unpadded conv), and the conv rule prices that;
  * one tensor dim split over two mesh axes is refused in some positions ("Fail to determine
    shardDims") — recorded by tt-check when it happens, not modelled;
  * no ring attention: its SDPA has no ring lowering (tt-mlir #7598), so ``ring_attention`` is False
    and the planner only reports what ring would buy (`planner.ring`); GSPMD has none either.

`planner.pins.target_collectives` predicts a pinned plan's collectives with the target's reshards
(`planner.reshard.redistribute`'s ``target``); `Target.lower` turns them (GSPMD's terms, as the op rules emit them) into
the target's: identity for ``gspmd``, TTNN ops for ``tt-mlir`` (``ttnn.point_to_point`` counted as
``collective-permute``, as ``plan.json``'s ``predicted_by_partitioner`` records them).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Optional

from planner.collective import Collective
from planner.hardware import HardwareProfile
from planner.mesh import MeshSpec


@dataclass(frozen=True)
class Target:
    name: str
    partitioner: str  # for people: what runs
    pinned: bool  # plans for it pin every decided layout (planner.pins)
    per_axis: bool  # a collective over several mesh axes runs as one op per axis
    point_to_point: bool  # all-to-all and collective-permute run as point-to-point transfers
    # a spatially split convolution gets its halo exchanged by the partitioner; False: the program carries it
    spatial_halo: bool
    # a value already split on some axis that gains a split over another moves data: an all-to-all over
    # the added axes (measured on tt-mlir: (model) -> (model, batch) on one dim, or a new split on another
    # dim, compile to ttnn.point_to_point; only a split of a replicated value is a local slice)
    slice_split_by_all_to_all: bool = False
    # an all-reduce whose result is sliced right after is one reduce-scatter even where a constraint keeps
    # the reduced value whole in between (GSPMD: the pair is read as one; tt-mlir: the all-reduce, then a slice)
    fuses_across_constraints: bool = True
    # mesh axes of size > 1 a program may name (tt-mlir: "Pass expects a 0D, 1D, or 2D mesh"; sub-axis
    # shardings are refused too), so a CFG split that makes a third one is not offered
    max_mesh_axes: Optional[int] = None
    # collective kinds its partitioner cannot lower: tt-mlir has no lowering for Shardy's collective-permute
    # (tt-mlir #3370), which is what GSPMD's reorder of a split's devices needs
    unlowerable: tuple[str, ...] = ()
    # a program result split on one dim over several mesh axes must name them in mesh order (tt-mlir:
    # "Fail to determine shardDims" for {devices=[1,1,1,1,8]<=[2,4]T(1,0)}, W over (model, batch))
    results_in_mesh_order: bool = False
    # attention with K/V circulating around the SP devices (`planner.ring`): offered to the solver only where the
    # target lowers it; elsewhere priced and reported (`Decision.ring`) with `no_ring_attention` as the reason
    ring_attention: bool = False
    no_ring_attention: str = ""
    # the 2-D mesh shapes its partitioner accepts (None: any); tt-mlir's fixed list (its SupportedMeshes,
    # include/ttmlir/Dialect/StableHLO/Utils/ShardingUtils.h, tt-mlir #4668): any other is "Mesh is not valid"
    meshes: Optional[frozenset] = None
    # the op rules (`planner.propagate`) model its partitioner's reshards exactly (GSPMD): the plan's predicted
    # collectives are its own, with no pins and no separate prediction for the target (`planner.pins`)
    modelled_by_rules: bool = False
    # with a dump_dir, the backend writes each program's Shardy export for this target's compiler (`wancompile.tt.export`)
    exports_shardy: bool = False
    # its compiler runs these op families as one fused kernel each when the program hands them over as composites
    # (`wancompile.composites`: tt-mlir's tenstorrent.* composites -> ttnn.scaled_dot_product_attention, ...)
    composites: tuple[str, ...] = ()
    # and partitions those composites only in a program with a split argument or result (tt-mlir 0.1.3 flattens
    # them for Shardy only where `isShardedModule`, which reads the arguments and results: elsewhere a composite
    # keeps its decomposition at whole shapes while its operands are split, and is refused), so a program that
    # splits values inside but keeps every argument and result whole hands its fused ops over decomposed
    composites_need_split_boundary: bool = False
    # its compiler fuses a rotate-half RoPE on [B, heads, tokens, head_dim] into one kernel (tt-mlir's
    # RoPERotateHalfFusingPattern -> ttnn.rotary_embedding), so the `rope` rewrite writes that form
    rotary_kernel: bool = False
    # how attention ignores the keys `sp_pad` adds (`rewrites.RewriteContext.padded_keys`): "mask", a boolean
    # [1, 1, 1, L + P] key mask as SDPA's attn_mask; "slice", K and V cut back to the L real tokens before each
    # self-attention, no mask. tt-mlir: TTNN's fused attention takes a mask only as [B, 1|H, L_q, L_k] in DRAM
    # (tt-metal's sdpa_device_operation.cpp: "Mask sequence length must match Q sequence length"), so tt-mlir
    # repeats a key mask to each chip's L_q x L_k (A14B 480p on bh-2x4: [1, 1, 8192, 32768] bf16, 537 MB per chip,
    # read by every self-attention); K and V of L tokens, not whole tiles, the kernel masks in L1 itself
    # (sdpa_program_factory.cpp's ``use_padded_mask``)
    padded_keys: str = "mask"
    # the graph rewrites (`rewrites.PASS_NAMES`) a compile for it runs where the user names none (the backend's
    # ``rewrites`` option, ``--rewrites``), each with why: (pass, reason) in pass order. A user's choice wins.
    default_rewrites: tuple[tuple[str, str], ...] = ()

    def halos_as(self, name: str) -> bool:
        """Whether target `name` gets a spatially split convolution's halo the way this one does (`spatial_halo`)."""
        return TARGETS[name].spatial_halo == self.spatial_halo

    def profile(self, hw: HardwareProfile) -> HardwareProfile:
        """`hw` as the planner prices it for this target: what it cannot lower priced out."""
        return replace(hw, unlowerable=self.unlowerable) if self.unlowerable else hw

    def runs_on(self, mesh: MeshSpec) -> MeshSpec:
        """The mesh a plan for `mesh` is made and compiled on: `mesh`, or where the partitioner accepts only
        its transpose (tt-mlir: 2x4, not 4x2), the transpose with the axes named as before (``batch`` keeps
        its 4 chips, ``model`` its 2). Axes are named, so every layout reads the same on it."""
        shape = tuple(mesh.shape)
        if self.meshes is None or len(shape) != 2 or 1 in shape or shape in self.meshes:
            return mesh
        if shape[::-1] in self.meshes:
            return MeshSpec(shape[::-1], tuple(mesh.axis_names)[::-1])
        return mesh

    def lower(self, collectives: Iterable[Collective], mesh: MeshSpec) -> tuple[Collective, ...]:
        """The predicted collectives as this target's compiled program holds them (count per call)."""
        out: list[Collective] = []
        for c in collectives:
            if self.point_to_point and c.kind == "all-to-all" and self.per_axis and len(c.axes) > 1:
                # measured (one-op modules, 2x4): Shardy moves each axis with its own all-to-all
                out.extend(p for a in c.axes for p in _point_to_point(replace(c, axes=(a,)), mesh))
            elif self.point_to_point and c.kind in ("all-to-all", "collective-permute"):
                out.extend(_point_to_point(c, mesh))
            elif self.per_axis and len(c.axes) > 1:
                out.extend(replace(c, axes=(a,), seconds=None) for a in c.axes)
            else:
                out.append(c)
        return tuple(out)


def _point_to_point(c: Collective, mesh: MeshSpec) -> list[Collective]:
    """An all-to-all over axes A: every chip sends one chunk to each other chip of its group, one
    ``ttnn.point_to_point`` per (sender, receiver) pair, each along one axis when the group spans one;
    a collective-permute: one per pair it moves (every chip of the group, once)."""
    size = {a: n for a, n in zip(mesh.axis_names, mesh.shape)}
    n = 1
    for a in c.axes:
        n *= size[a]
    groups = mesh.size // n if n else 0
    pairs = groups * n * (n - 1) if c.kind == "all-to-all" else mesh.size
    chunk = c.bytes // n if c.kind == "all-to-all" and n else c.bytes
    return [replace(c, kind="collective-permute", bytes=chunk, count=c.count * pairs, seconds=None)]


TARGETS = {
    "gspmd": Target(
        "gspmd",
        "XLA GSPMD (CPU, GPU, TPU)",
        False,
        False,
        False,
        True,
        modelled_by_rules=True,
        no_ring_attention="no ring attention from GSPMD: sharding annotations make it all-gather K/V or all-to-all heads",
    ),
    "tt-mlir": Target(
        "tt-mlir",
        "Shardy inside tt-mlir (Tenstorrent, via tt-xla)",
        True,
        True,
        True,
        False,
        slice_split_by_all_to_all=True,
        fuses_across_constraints=False,
        max_mesh_axes=2,
        unlowerable=("collective-permute",),
        results_in_mesh_order=True,
        exports_shardy=True,
        composites=("attention", "layer_norm", "rms_norm", "gelu"),
        composites_need_split_boundary=True,
        rotary_kernel=True,
        padded_keys="slice",
        default_rewrites=(
            ("qkv", "q, k and v projected by one matmul on a weight packed once, not three per call"),
            ("rmsnorm", "the VAE's normalize-scale chain as one rms_norm, a fused TTNN kernel"),
            ("conv1x1", "a 1x1x1 conv3d as the linear it is: a matmul, no ttnn.conv3d"),
            (
                "patch_embed",
                "the patch-embed conv3d as a linear: a DiT with no conv3d is compiled at optimization_level 1, "
                "where attention is one fused ttnn.scaled_dot_product_attention (at level 0 it is decomposed and "
                "every score matrix is in DRAM: A14B 720p needs 108 GiB per chip)",
            ),
            ("rope", "RoPE in the rotate-half form tt-mlir fuses into one ttnn.rotary_embedding"),
            ("sp_pad", "tokens padded once where the SP split does not divide them, instead of no SP there"),
        ),
        no_ring_attention="no ring SDPA lowering in tt-mlir (tt-mlir #7598)",
        meshes=frozenset(
            {(1, 1), (1, 2), (1, 4), (1, 8), (1, 16), (1, 32), (1, 64), (2, 2), (2, 4), (2, 8), (4, 4), (4, 8)}
            | {(4, 16), (4, 32), (8, 4), (8, 8), (8, 16)}
        ),
    ),
}


DEFAULT = "gspmd"  # the target of a plan made without naming one


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise ValueError(f"unknown target {name!r}: choose one of {', '.join(TARGETS)}") from None


def default_target(hardware: Optional[str]) -> str:
    """``tt-mlir`` for a Tenstorrent profile (``wh-*``, ``bh-*``), else ``gspmd``; one rule for the
    backend, the CLI and the library."""
    from planner.hardware import is_tenstorrent

    return "tt-mlir" if hardware and is_tenstorrent(hardware) else "gspmd"
