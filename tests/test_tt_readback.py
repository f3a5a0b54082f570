"""Reading back what tt-mlir compiled: the TTNN ops per part of the model (prologue, each block, epilogue),
told apart by the parameters they read, and the attention score matrices a fused attention never writes."""

from __future__ import annotations

import json

import pytest
import torch

# Two blocks over a 48-token stream: block 0's self-attention decomposed (its scores 1x4x24x48 on each chip
# of a 2-way SP split, then a softmax); the two blocks' K/V weights joined in one concat (parameters of two
# blocks: the prologue's), read by block 1's linear over the stream; proj_out last. Weights are %arg0
# (blocks.0), %arg1 + %arg2 (blocks.1), %arg3 (proj_out); %arg4 is the input.
TTNN_BLOCKS = """module {
  func.func @main(%arg0: tensor<64x64xbf16, #ttnn_layout>, %arg1: tensor<64x64xbf16, #ttnn_layout>, %arg2: tensor<64x64xbf16, #ttnn_layout>, %arg3: tensor<16x64xbf16, #ttnn_layout>, %arg4: tensor<48x64xbf16, #ttnn_layout>) -> tensor<48x16xbf16, #ttnn_layout> {
    %0 = "ttnn.get_device"() : () -> !ttnn.device loc(#loc1)
    %1 = "ttnn.concat"(%arg0, %arg2) <{dim = 0 : si32}> : (tensor<64x64xbf16, #ttnn_layout>, tensor<64x64xbf16, #ttnn_layout>) -> tensor<128x64xbf16, #ttnn_layout> loc(#loc1)
    %2 = "ttnn.linear"(%arg4, %arg0) <{transpose_a = false, transpose_b = true}> : (tensor<48x64xbf16, #ttnn_layout>, tensor<64x64xbf16, #ttnn_layout>) -> tensor<48x64xbf16, #ttnn_layout> loc(#loc1)
    %3 = "ttnn.reshape"(%2) <{shape = [1 : i32, 4 : i32, 24 : i32, 16 : i32]}> : (tensor<48x64xbf16, #ttnn_layout>) -> tensor<1x4x24x16xbf16, #ttnn_layout> loc(#loc1)
    %4 = "ttnn.matmul"(%3, %3) <{transpose_a = false, transpose_b = true}> : (tensor<1x4x24x16xbf16, #ttnn_layout>, tensor<1x4x48x16xbf16, #ttnn_layout>) -> tensor<1x4x24x48xbf16, #ttnn_layout> loc(#loc1)
    %5 = "ttnn.softmax"(%4) <{dimension = 3 : si32}> : (tensor<1x4x24x48xbf16, #ttnn_layout>) -> tensor<1x4x24x48xbf16, #ttnn_layout> loc(#loc1)
    "ttnn.deallocate"(%4) <{force = false}> : (tensor<1x4x24x48xbf16, #ttnn_layout>) -> () loc(#loc1)
    %6 = "ttnn.matmul"(%2, %arg1) <{transpose_a = false, transpose_b = false}> : (tensor<48x64xbf16, #ttnn_layout>, tensor<64x64xbf16, #ttnn_layout>) -> tensor<48x64xbf16, #ttnn_layout> loc(#loc1)
    %7 = "ttnn.linear"(%6, %1) <{transpose_a = false, transpose_b = true}> : (tensor<48x64xbf16, #ttnn_layout>, tensor<128x64xbf16, #ttnn_layout>) -> tensor<48x128xbf16, #ttnn_layout> loc(#loc1)
    %8 = "ttnn.slice_static"(%7) <{begins = [0 : i32, 0 : i32]}> : (tensor<48x128xbf16, #ttnn_layout>) -> tensor<48x64xbf16, #ttnn_layout> loc(#loc1)
    %9 = "ttnn.linear"(%8, %arg3) <{transpose_a = false, transpose_b = true}> : (tensor<48x64xbf16, #ttnn_layout>, tensor<16x64xbf16, #ttnn_layout>) -> tensor<48x16xbf16, #ttnn_layout> loc(#loc1)
    return %9 : tensor<48x16xbf16, #ttnn_layout> loc(#loc1)
  } loc(#loc1)
} loc(#loc1)
"""
NAMES = [
    ["blocks.0.attn1.to_q.weight"],
    ["blocks.1.attn1.to_out.0.weight"],
    ["blocks.1.attn2.to_k.weight"],
    ["proj_out.weight"],
    [],
]


def test_ttnn_ops_count_in_the_block_whose_parameters_they_read():
    """Ops reading block 0's weights (and what they make) are block 0's; block 1's matmul reads block 0's stream
    and its own weight: block 1's; a concat of two blocks' weights is computed once, before the blocks; the
    op reading proj_out, first read after every block, is the epilogue's; a deallocate counts where its value
    does."""
    from wancompile.tt.parts import by_part

    parts = {name: dict(ops) for name, ops in by_part(TTNN_BLOCKS, NAMES)}
    assert list(parts) == ["prologue", "blocks.0", "blocks.1", "epilogue"]
    assert parts["prologue"] == {"ttnn.get_device": 1, "ttnn.concat": 1}
    assert parts["blocks.0"] == {
        "ttnn.linear": 1,
        "ttnn.reshape": 1,
        "ttnn.matmul": 1,
        "ttnn.softmax": 1,
        "ttnn.deallocate": 1,
    }
    assert parts["blocks.1"] == {"ttnn.matmul": 1, "ttnn.linear": 1, "ttnn.slice_static": 1}
    assert parts["epilogue"] == {"ttnn.linear": 1}
    with pytest.raises(ValueError, match="5 arguments, the export named 4"):
        by_part(TTNN_BLOCKS, NAMES[:4])


def test_a_score_matrix_is_a_softmax_or_a_head_dim_contraction_over_query_and_key_tokens():
    """On a 2-way SP split of 48 tokens (head dim 16), the 1x4x24x48 QK^T and its softmax are score matrices;
    the 48x64 matmul over the 64-wide stream is not, though 64 tokens would match its shape."""
    from wancompile.tt.parts import score_matrices

    found = score_matrices(TTNN_BLOCKS, [(48, 48, 16)], [2, 4])
    assert [(x.value, x.op, x.type, x.bytes) for x in found] == [
        ("%4", "ttnn.matmul", "1x4x24x48xbf16", 4 * 24 * 48 * 2),
        ("%5", "ttnn.softmax", "1x4x24x48xbf16", 4 * 24 * 48 * 2),
    ]
    assert score_matrices(TTNN_BLOCKS, [(64, 64, 16)], [2, 4]) == []  # 48x64 contracts 64, not a head dim
    assert score_matrices(TTNN_BLOCKS, [(48, 48, 16)], [1]) == []  # whole queries: 48x48 nowhere


def test_a_matmul_that_reads_a_weight_is_a_projection_whatever_its_shape():
    """Block 1's 48x64 matmul contracts 64: an attention of 48 queries, 64 keys and 64-wide heads would match
    its shape, but it reads a weight (computed from parameters alone), so it is no score matrix."""
    from wancompile.tt.parts import from_parameters, score_matrices

    weights = from_parameters(TTNN_BLOCKS, NAMES)
    assert weights == {"%arg0", "%arg1", "%arg2", "%arg3", "%0", "%1"}
    assert [x.value for x in score_matrices(TTNN_BLOCKS, [(48, 64, 64)], [1])] == ["%6"]
    assert score_matrices(TTNN_BLOCKS, [(48, 64, 64)], [1], frozenset(weights)) == []


def test_a_score_matrix_refuses_the_program_only_where_its_attention_was_handed_over_fused():
    """A fused attention call is priced as one kernel that never writes its scores: finding them refuses
    the program. An fp32 call (not handed over) keeps its scores and the program stands; so does the VAE,
    whose budget holds its attention's scores."""
    from planner.mesh import MeshSpec
    from wancompile.composites import Site
    from wancompile.tt.check import ProgramCheck, _scores

    mesh = MeshSpec((2, 4), ("batch", "model"))
    fused = [Site("sdpa", "attention", "", 48, 48, 16)]
    decomposed = [Site("sdpa", "attention", "attention in fp32", 48, 48, 16)]
    found, unfused = _scores(TTNN_BLOCKS, fused, mesh)
    assert len(found) == len(unfused) == 2
    assert not ProgramCheck("p", "bh-2x4", True, score_matrices=found, unfused_scores=unfused).as_predicted
    found, unfused = _scores(TTNN_BLOCKS, decomposed, mesh)
    assert len(found) == 2 and unfused == ()
    assert ProgramCheck("p", "bh-2x4", True, score_matrices=found).as_predicted


def test_the_export_names_each_argument_of_the_module_by_the_parameters_it_holds(spmd, tmp_path):
    """``<name>.arguments.json`` lists, per argument of the exported module in its order, the parameter it
    holds (a folded value: the parameters it was computed from; an input: none): each names a parameter of
    the module's shape where it is one, and every block's parameters are there."""
    import re

    from wancompile.models import as_loaded, build_transformer, transformer_inputs

    model = as_loaded(build_transformer("tiny"), torch.bfloat16)
    inputs = {
        k: v.to(torch.bfloat16) if v.is_floating_point() else v
        for k, v in transformer_inputs("tiny", "tiny", 9).items()
    }
    options = {"mesh": "2x4", "target": "tt-mlir", "dump_dir": str(tmp_path), "rewrites": "all"}
    compiled = torch.compile(model, backend="wan_autoshard", options=options, fullgraph=True)
    with torch.no_grad():
        compiled(**inputs, return_dict=False)
    shapes = {n: tuple(t.shape) for n, t in [*model.named_parameters(), *model.named_buffers()]}
    for program in ("wan-dit", "wan-dit.fold"):
        names = json.loads((tmp_path / f"{program}.arguments.json").read_text())
        text = (tmp_path / f"{program}.gspmd.mlir").read_text()
        signature = re.search(r"func\.func (?:public )?@main\((.*?)\) ->", text).group(1)
        types = re.findall(r"%arg\d+: tensor<((?:\d+x)*)\w+>", signature)
        assert len(names) == len(types) > 20
        fold_sources = {n for x in json.loads((tmp_path / "wan-dit.fold.arguments.json").read_text()) for n in x}
        for held, dims in zip(names, types):
            assert all(n in shapes for n in held), held
            # a parameter the main program reads as itself (not a value folded from it) has its own shape
            if len(held) == 1 and (program == "wan-dit.fold" or held[0] not in fold_sources):
                assert shapes[held[0]] == tuple(int(d) for d in dims.split("x") if d), held
        assert {n.split(".")[1] for x in names for n in x if n.startswith("blocks.")} == {"0", "1"}


# One block's MLP, pinned row-parallel: its matmul is all-reduced before the bias is added (the bias cannot
# join the matmul as a linear), and the all-reduce takes a 4-D tensor (a reshape in, one out); one reshape
# more feeds nothing but the next op. Unannotated, tt-mlir runs one linear.
_PINNED = """module {
  func.func @main(%arg0: tensor<64x64xbf16, #l>, %arg1: tensor<64xbf16, #l>, %arg2: tensor<48x64xbf16, #l>) -> tensor<48x64xbf16, #l> {
    %0 = "ttnn.matmul"(%arg2, %arg0) <{transpose_a = false, transpose_b = true}> : (tensor<48x64xbf16, #l>, tensor<64x64xbf16, #l>) -> tensor<48x64xbf16, #l> loc(#loc1)
    %1 = "ttnn.reshape"(%0) <{shape = [1 : i32, 1 : i32, 48 : i32, 64 : i32]}> : (tensor<48x64xbf16, #l>) -> tensor<1x1x48x64xbf16, #l> loc(#loc1)
    %2 = "ttnn.all_reduce"(%1) <{cluster_axis = 1 : ui32}> : (tensor<1x1x48x64xbf16, #l>) -> tensor<1x1x48x64xbf16, #l> loc(#loc1)
    %3 = "ttnn.reshape"(%2) <{shape = [48 : i32, 64 : i32]}> : (tensor<1x1x48x64xbf16, #l>) -> tensor<48x64xbf16, #l> loc(#loc1)
    %4 = "ttnn.add"(%3, %arg1) : (tensor<48x64xbf16, #l>, tensor<64xbf16, #l>) -> tensor<48x64xbf16, #l> loc(#loc1)
    %5 = "ttnn.reshape"(%4) <{shape = [48 : i32, 64 : i32]}> : (tensor<48x64xbf16, #l>) -> tensor<48x64xbf16, #l> loc(#loc1)
    return %5 : tensor<48x64xbf16, #l> loc(#loc1)
  } loc(#loc1)
} loc(#loc1)
"""
_BARE = """module {
  func.func @main(%arg0: tensor<64x64xbf16, #l>, %arg1: tensor<64xbf16, #l>, %arg2: tensor<48x64xbf16, #l>) -> tensor<48x64xbf16, #l> {
    %0 = "ttnn.linear"(%arg2, %arg0, %arg1) <{transpose_a = false, transpose_b = true}> : (tensor<48x64xbf16, #l>, tensor<64x64xbf16, #l>, tensor<64xbf16, #l>) -> tensor<48x64xbf16, #l> loc(#loc1)
    return %0 : tensor<48x64xbf16, #l> loc(#loc1)
  } loc(#loc1)
} loc(#loc1)
"""
_MLP = [["blocks.0.ffn.net.2.weight"], ["blocks.0.ffn.net.2.bias"], []]


def test_what_the_pins_cost_is_explained_by_the_reshards_or_reported():
    """Against the unannotated program the pinned block lost its linear and gained three reshapes. The linear
    is explained (its matmul is reduced across chips before the bias), so are the two reshapes around the
    all-reduce; the third is not, and is reported."""
    from wancompile.tt.parts import pin_costs

    (cost,) = pin_costs(_PINNED, _BARE, _MLP)
    assert cost.part == "blocks.0"
    assert cost.kernels == {"ttnn.linear": (0, 1)} and cost.moves == {"ttnn.reshape": (3, 0)}
    assert cost.matmuls_before_reductions == 1 and cost.moves_at_reshards == {"ttnn.reshape": 2}
    assert cost.unexplained == {"moves": 1}
    (same,) = pin_costs(_BARE, _BARE, _MLP)
    assert same.unexplained == {}


# One block's q RMSNorm, its channels split over chips: each chip sums its squares (the reduced dim dropped),
# the all-reduce takes them 4-D (a reshape in, one out), the scaling by 1/N keeps their shape, and a reshape
# gives the statistic its reduced dim back before it meets the activations; the same reshape on a matmul's
# all-reduced result is no statistic's. Unannotated, tt-mlir takes the mean with the dim kept.
_STAT = """module {
  func.func @main(%arg0: tensor<64xbf16, #l>, %arg1: tensor<1x16x32xf32, #l>, %arg2: tensor<1x16xf32, #l>, %arg3: tensor<32x32xbf16, #l>) -> tensor<1x16x32xf32, #l> {
    %q = "ttnn.linear"(%arg1, %arg3) : (tensor<1x16x32xf32, #l>, tensor<32x32xbf16, #l>) -> tensor<1x16x32xf32, #l> loc(#loc1)
    %0 = "ttnn.multiply"(%q, %q) : (tensor<1x16x32xf32, #l>, tensor<1x16x32xf32, #l>) -> tensor<1x16x32xf32, #l> loc(#loc1)
    %1 = "ttnn.REDUCE"(%0) <{dim_arg = [2 : i32], keep_dim = false}> : (tensor<1x16x32xf32, #l>) -> tensor<1x16xf32, #l> loc(#loc1)
    %2 = "ttnn.reshape"(%1) <{shape = [1 : i32, 1 : i32, 1 : i32, 16 : i32]}> : (tensor<1x16xf32, #l>) -> tensor<1x1x1x16xf32, #l> loc(#loc1)
    %3 = "ttnn.all_reduce"(%2) <{cluster_axis = 1 : ui32}> : (tensor<1x1x1x16xf32, #l>) -> tensor<1x1x1x16xf32, #l> loc(#loc1)
    %4 = "ttnn.reshape"(%3) <{shape = [1 : i32, 16 : i32]}> : (tensor<1x1x1x16xf32, #l>) -> tensor<1x16xf32, #l> loc(#loc1)
    %5 = "ttnn.multiply"(%4, %arg2) : (tensor<1x16xf32, #l>, tensor<1x16xf32, #l>) -> tensor<1x16xf32, #l> loc(#loc1)
    %6 = "ttnn.reshape"(%5) <{shape = [1 : i32, 16 : i32, 1 : i32]}> : (tensor<1x16xf32, #l>) -> tensor<1x16x1xf32, #l> loc(#loc1)
    %7 = "ttnn.multiply"(%q, %6) : (tensor<1x16x32xf32, #l>, tensor<1x16x1xf32, #l>) -> tensor<1x16x32xf32, #l> loc(#loc1)
    %8 = "ttnn.multiply"(%7, %arg0) : (tensor<1x16x32xf32, #l>, tensor<64xbf16, #l>) -> tensor<1x16x32xf32, #l> loc(#loc1)
    return %8 : tensor<1x16x32xf32, #l> loc(#loc1)
  } loc(#loc1)
} loc(#loc1)
"""
_STAT_BARE = """module {
  func.func @main(%arg0: tensor<64xbf16, #l>, %arg1: tensor<1x64x64xf32, #l>, %arg2: tensor<1x16xf32, #l>, %arg3: tensor<64x64xbf16, #l>) -> tensor<1x64x64xf32, #l> {
    %q = "ttnn.linear"(%arg1, %arg3) : (tensor<1x64x64xf32, #l>, tensor<64x64xbf16, #l>) -> tensor<1x64x64xf32, #l> loc(#loc1)
    %0 = "ttnn.multiply"(%q, %q) : (tensor<1x64x64xf32, #l>, tensor<1x64x64xf32, #l>) -> tensor<1x64x64xf32, #l> loc(#loc1)
    %1 = "ttnn.mean"(%0) <{dim_arg = [2 : i32], keep_dim = true}> : (tensor<1x64x64xf32, #l>) -> tensor<1x64x1xf32, #l> loc(#loc1)
    %2 = "ttnn.multiply"(%q, %1) : (tensor<1x64x64xf32, #l>, tensor<1x64x1xf32, #l>) -> tensor<1x64x64xf32, #l> loc(#loc1)
    %3 = "ttnn.multiply"(%2, %arg0) : (tensor<1x64x64xf32, #l>, tensor<64xbf16, #l>) -> tensor<1x64x64xf32, #l> loc(#loc1)
    return %3 : tensor<1x64x64xf32, #l> loc(#loc1)
  } loc(#loc1)
} loc(#loc1)
"""


def test_a_split_statistic_may_get_its_reduced_dim_back_and_nothing_else_may():
    """The q RMSNorm's statistic, split by the plan: the two reshapes around its all-reduce and the one that
    restores its reduced dim past the scaling are what the split needs. Computed by a matmul instead (no
    statistic), the last reshape is reported."""
    from wancompile.tt.parts import pin_costs

    names = [["blocks.0.attn1.norm_q.weight"], [], [], ["blocks.0.attn1.to_q.weight"]]
    (cost,) = pin_costs(_STAT.replace("REDUCE", "sum"), _STAT_BARE, names)
    assert cost.moves == {"ttnn.reshape": (3, 0)} and cost.moves_at_reshards == {"ttnn.reshape": 3}
    assert cost.unexplained == {}
    (cost,) = pin_costs(_STAT.replace("REDUCE", "matmul"), _STAT_BARE, names)
    assert cost.moves_at_reshards == {"ttnn.reshape": 2} and cost.unexplained == {"moves": 1}


# A one-block program whose text embedding (a top-level module) is first read after the block's first weight:
# the block's self-attention runs before its cross-attention needs the text.
_ONE_BLOCK = """module {
  func.func @main(%arg0: tensor<64x64xbf16, #l>, %arg1: tensor<64x64xbf16, #l>, %arg2: tensor<64x64xbf16, #l>, %arg3: tensor<64x64xbf16, #l>, %arg4: tensor<48x64xbf16, #l>, %arg5: tensor<48x64xbf16, #l>) -> tensor<48x64xbf16, #l> {
    %0 = "ttnn.matmul"(%arg4, %arg0) : (tensor<48x64xbf16, #l>, tensor<64x64xbf16, #l>) -> tensor<48x64xbf16, #l> loc(#loc1)
    %1 = "ttnn.matmul"(%arg5, %arg1) : (tensor<48x64xbf16, #l>, tensor<64x64xbf16, #l>) -> tensor<48x64xbf16, #l> loc(#loc1)
    %2 = "ttnn.matmul"(%1, %arg2) : (tensor<48x64xbf16, #l>, tensor<64x64xbf16, #l>) -> tensor<48x64xbf16, #l> loc(#loc1)
    %3 = "ttnn.add"(%0, %2) : (tensor<48x64xbf16, #l>, tensor<48x64xbf16, #l>) -> tensor<48x64xbf16, #l> loc(#loc1)
    %4 = "ttnn.matmul"(%3, %arg3) : (tensor<48x64xbf16, #l>, tensor<64x64xbf16, #l>) -> tensor<48x64xbf16, #l> loc(#loc1)
    return %4 : tensor<48x64xbf16, #l> loc(#loc1)
  } loc(#loc1)
} loc(#loc1)
"""


def test_a_top_level_module_read_inside_the_only_block_is_no_epilogue():
    """The text embedding is read after the block's first weight but before the block is done: it is the
    prologue's, and the cross-attention it feeds stays in the block; only what reads ``proj_out`` after the
    block's last weight is the epilogue. (Read after the block's *first* weight, TI2V-5B's one-block program at
    480p had its block's whole second half counted in the epilogue: 69 kernels where 187 were predicted.)"""
    from wancompile.tt.parts import by_part

    names = [["blocks.0.attn1.to_q.weight"], ["condition_embedder.text_embedder.linear_1.weight"]]
    names += [["blocks.0.attn2.to_k.weight"], ["proj_out.weight"], [], []]
    parts = {name: dict(ops) for name, ops in by_part(_ONE_BLOCK, names)}
    assert parts == {
        "prologue": {"ttnn.matmul": 1},
        "blocks.0": {"ttnn.matmul": 2, "ttnn.add": 1},
        "epilogue": {"ttnn.matmul": 1},
    }


# The same two blocks with their weights computed from once (tt-mlir's const-eval of arguments marked
# ``parameter``): every ``ttcore.load_cached`` comes first, block 1's before block 0's, and block 0's weight
# is all-gathered in its const-eval function.
TTNN_CONST_EVAL = """module {
  func.func private @main_const_eval_0(%arg0: tensor<32x64xbf16, #ttnn_layout>) -> tensor<64x64xbf16, #ttnn_layout> attributes {tt.function_type = "const_eval"} {
    %0 = "ttnn.all_gather"(%arg0) <{all_gather_dim = 0 : si32, cluster_axis = 0 : ui32}> : (tensor<32x64xbf16, #ttnn_layout>) -> tensor<64x64xbf16, #ttnn_layout> loc(#loc1)
    return %0 : tensor<64x64xbf16, #ttnn_layout> loc(#loc1)
  } loc(#loc1)
  func.func private @main_const_eval_1(%arg0: tensor<64x64xbf16, #ttnn_layout>) -> tensor<64x64xbf16, #ttnn_layout> attributes {tt.function_type = "const_eval"} {
    %0 = "ttnn.to_layout"(%arg0) <{layout = #ttnn.layout<tile>}> : (tensor<64x64xbf16, #ttnn_layout>) -> tensor<64x64xbf16, #ttnn_layout> loc(#loc1)
    return %0 : tensor<64x64xbf16, #ttnn_layout> loc(#loc1)
  } loc(#loc1)
  func.func @main(%arg0: tensor<32x64xbf16, #ttnn_layout>, %arg1: tensor<64x64xbf16, #ttnn_layout>, %arg2: tensor<48x64xbf16, #ttnn_layout>) -> tensor<48x64xbf16, #ttnn_layout> {
    %0 = ttcore.load_cached(@main_const_eval_1, [%arg1]) : (tensor<64x64xbf16, #ttnn_layout>) -> tensor<64x64xbf16, #ttnn_layout> loc(#loc1)
    %1 = ttcore.load_cached(@main_const_eval_0, [%arg0]) : (tensor<32x64xbf16, #ttnn_layout>) -> tensor<64x64xbf16, #ttnn_layout> loc(#loc1)
    %2 = "ttnn.linear"(%arg2, %1) <{transpose_a = false, transpose_b = true}> : (tensor<48x64xbf16, #ttnn_layout>, tensor<64x64xbf16, #ttnn_layout>) -> tensor<48x64xbf16, #ttnn_layout> loc(#loc1)
    %3 = "ttnn.all_reduce"(%2) <{cluster_axis = 1 : ui32, reduce_type = #ttcore.reduce_type<sum>}> : (tensor<48x64xbf16, #ttnn_layout>) -> tensor<48x64xbf16, #ttnn_layout> loc(#loc1)
    %4 = "ttnn.matmul"(%3, %0) <{transpose_a = false, transpose_b = false}> : (tensor<48x64xbf16, #ttnn_layout>, tensor<64x64xbf16, #ttnn_layout>) -> tensor<48x64xbf16, #ttnn_layout> loc(#loc1)
    return %4 : tensor<48x64xbf16, #ttnn_layout> loc(#loc1)
  } loc(#loc1)
} loc(#loc1)
"""
NAMES_CONST_EVAL = [["blocks.0.attn1.to_q.weight"], ["blocks.1.ffn.net.2.weight"], []]


def test_blocks_are_ordered_by_where_the_forward_reads_them_not_where_their_weights_are_computed():
    """Both const-eval results are loaded before any block runs, block 1's first: each still counts in the
    block whose weights it holds, and the blocks in the order the forward reads them."""
    from wancompile.tt.parts import by_part

    parts = {name: dict(ops) for name, ops in by_part(TTNN_CONST_EVAL, NAMES_CONST_EVAL)}
    assert list(parts) == ["blocks.0", "blocks.1"]
    assert parts["blocks.0"] == {"ttcore.load_cached": 1, "ttnn.linear": 1, "ttnn.all_reduce": 1}
    assert parts["blocks.1"] == {"ttcore.load_cached": 1, "ttnn.matmul": 1}


def test_a_collective_computed_once_is_not_one_of_the_calls_and_names_its_argument():
    """The all-gather in block 0's const-eval function runs once, not every call: @main's collectives are the
    all-reduce alone, and the argument it gathers (%arg0) is the one to hand over unmarked."""
    from planner.mesh import MeshSpec
    from wancompile.tt.parameters import hoisted_collectives
    from wancompile.tt.ttnn import parse_collectives

    found = parse_collectives(TTNN_CONST_EVAL, MeshSpec((2, 4), ("batch", "model")))
    assert [(c.kind, c.axes) for c in found] == [("all-reduce", ("model",))]
    assert hoisted_collectives(TTNN_CONST_EVAL) == {0}
