"""Constants in the Shardy module: each reader reads its own replicated copy (`pin`), in the worker process
(jaxlib, no torch); `walk` visits a module's ops."""

from __future__ import annotations


def _splat_like(o) -> bool:
    """A value with no data of its own: a constant, an iota, or a scalar broadcast to a shape. Identical
    ones are merged by tt-mlir's canonicalisation however far apart their readers are."""
    from jaxlib.mlir import ir

    if o.name in ("stablehlo.constant", "stablehlo.iota"):
        return True
    return o.name == "stablehlo.broadcast_in_dim" and ir.RankedTensorType(o.operands[0].type).rank == 0


def pin(root) -> int:
    """Every reader of a constant (or another splat-like value, `_splat_like`) reads it through its
    own replicated, closed constraint. torch_xla
    shares one splat constant between unrelated ops (the ``2.0`` of every ``x.pow(2)``) and tt-mlir's
    canonicalisation merges copies again; Shardy gives a value one sharding, so a split one reader
    wants (q's hidden over ``model`` in ``norm_q``) reached every other reader through the constant — a
    LayerNorm on a token-split hidden state was computed split over ``model`` too, with an all-to-all and
    an all-gather no plan has; in the VAE a broadcast scalar (``F.normalize``'s clamp bound) shared by
    every resblock carried a channel split into the replicated ones. Replicated at each use, such a value
    is sliced locally where its reader is split (``ttnn.mesh_partition``). A composite's decomposition is
    left alone: tt-mlir flattens composites for Shardy and outlines them again afterwards, and a constraint
    inside the group keeps it from being outlined (measured: a pinned ``tenstorrent.gelu_tanh`` or
    ``tenstorrent.layer_norm`` was lowered as its decomposition, unpinned each is one TTNN kernel). Returns
    how many uses were pinned."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import sdy

    pinned = 0
    for o in list(_outside_composites(root)):
        if not _splat_like(o):
            continue
        rank = ir.RankedTensorType(o.results[0].type).rank
        if rank == 0:
            continue
        replicated = sdy.TensorShardingAttr.get("mesh", [sdy.DimensionShardingAttr.get([], True)] * rank)
        for use in list(o.results[0].uses):
            owner, index = use.owner, use.operand_number
            if owner.name == "sdy.sharding_constraint":
                continue
            with ir.InsertionPoint(owner):
                c = sdy.ShardingConstraintOp(o.results[0], replicated)
            owner.operands[index] = c.result
            pinned += 1
    return pinned


def _outside_composites(module):
    """Every op of `module` but those of the functions its ``stablehlo.composite`` ops decompose into."""
    from jaxlib.mlir import ir

    decompositions = {
        ir.FlatSymbolRefAttr(o.attributes["decomposition"]).value
        for o in walk(module)
        if o.name == "stablehlo.composite"
    }
    for fn in module.regions[0].blocks[0].operations:
        fn = fn.operation
        if fn.name == "func.func" and ir.StringAttr(fn.attributes["sym_name"]).value in decompositions:
            continue
        yield fn
        yield from walk(fn)


def walk(op):
    """Every op nested in `op`, in order."""
    for region in op.regions:
        for block in region.blocks:
            for o in block.operations:
                yield o.operation
                yield from walk(o.operation)
