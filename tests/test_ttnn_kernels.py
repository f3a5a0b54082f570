"""The planner counts the TTNN kernels a block runs per call under tt-mlir (`planner.ttnn_kernels`): fused
attention, norms and GELU as one kernel each, the text's K/V projections beside the prologue, the plan's
collectives with the moves around them. `tests/test_tt_fused.py` holds the count against tt-mlir's compiled
blocks (within 10%)."""

from __future__ import annotations

import pytest
import torch

from planner.autoplan import plan_graph
from planner.hand_plans import tt_xla_plan
from planner.mesh import parse_mesh
from planner.ttnn_kernels import Kernels, plan_kernels


def _tiny_bf16():
    """The tiny DiT and its inputs as a pipeline loads them (bf16)."""
    from wancompile.models import as_loaded, build_transformer, transformer_inputs

    model = as_loaded(build_transformer("tiny"), torch.bfloat16)
    inputs = {
        k: v.to(torch.bfloat16) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
        for k, v in transformer_inputs("tiny", "tiny", 9).items()
    }
    return model, inputs


@pytest.fixture(scope="module")
def bf16_graph():
    """The tiny DiT as a pipeline loads it (bf16), captured as dynamo hands it to the backend."""
    from wancompile.capture import capture_module

    model, inputs = _tiny_bf16()
    return capture_module(model, **inputs, return_dict=False, model="tiny")[0]


def _rope_graph(rotary_kernel: bool):
    """The tiny bf16 DiT after the `rope` rewrite, in the stack form or the rotary form it writes for tt-mlir."""
    from rewrites import RewriteContext, apply_rewrites
    from wancompile.capture import annotate, capture_fx

    model, inputs = _tiny_bf16()
    gm = capture_fx(model, **inputs, return_dict=False)
    apply_rewrites(gm, ["rope"], RewriteContext(rotary_kernel=rotary_kernel))
    gm.recompile()
    return annotate(gm, model="tiny")


def _rewritten_for_tt(mesh: str):
    """The tiny bf16 DiT with every rewrite the backend runs for tt-mlir on `mesh`, annotated for the planner."""
    from wancompile.backend import rewrite_graph
    from wancompile.capture import annotate, capture_fx
    from wancompile.options import Options
    from wancompile.planning import request_for

    model, inputs = _tiny_bf16()
    opts = Options.from_user({"mesh": mesh, "target": "tt-mlir", "rewrites": "all"})
    gm = capture_fx(model, **inputs, return_dict=False)
    return annotate(rewrite_graph(gm, request_for(opts, parse_mesh(mesh)), opts.rewrites)[0], model="tiny")


def test_the_rotary_form_of_rope_is_one_fused_kernel_and_fewer_moves_than_the_stack():
    """The `rope` rewrite's form for tt-mlir (x * cos + rotate_half(x) * sin on [B, heads, tokens, D]) is one
    ``ttnn.rotary_embedding`` per q and k: 2 more fused kernels a block, its products, halves and concat absorbed,
    each reorder of the head dim's pairs a reshape, permute and reshape. The stack form's last-dim stack and the
    strided halves cost more moves and elementwise kernels (tt-mlir: 148 -> 126 kernels a block, tt-fused.md)."""
    stack, rotary = (
        plan_kernels(g, plan_graph(g, parse_mesh("1x1"), target="tt-mlir"))[0] for g in map(_rope_graph, (False, True))
    )
    assert rotary.fused == stack.fused + 2
    assert (rotary.matmul, rotary.collective) == (stack.matmul, stack.collective)
    assert rotary.eltwise < stack.eltwise and rotary.move < stack.move and rotary.total < stack.total


def test_a_compiled_block_is_counted_by_kernel_class():
    """Deallocations and const-eval loads are no kernels; layout moves and slices are data movement; any TTNN op
    not named is one elementwise kernel."""
    ops = {
        "ttnn.deallocate": 40,
        "ttcore.load_cached": 3,
        "ttnn.scaled_dot_product_attention": 2,
        "ttnn.rms_norm": 1,
        "ttnn.linear": 4,
        "ttnn.matmul": 1,
        "ttnn.multiply": 5,
        "ttnn.rsqrt": 1,
        "ttnn.typecast": 2,
        "ttnn.reshape": 3,
        "ttnn.to_layout": 1,
        "ttnn.slice_static": 2,
        "ttnn.all_reduce": 2,
        "ttnn.point_to_point": 6,
    }
    k = Kernels.of_ttnn(ops)
    assert k == Kernels(fused=3, matmul=5, eltwise=6, typecast=2, move=6, collective=8)
    assert k.total == 30 and k.to_json()["total"] == 30


def test_one_chip_runs_every_attention_norm_and_gelu_fused_and_no_collective(bf16_graph):
    """On one chip nothing is split: per block 2 attention calls, 3 LayerNorms, GELU and the 4 q/k RMSNorms are
    one kernel each; 8 linears run in the block (the text's K/V projections run beside the prologue, joined
    across the blocks); no collective."""
    plan = plan_graph(bf16_graph, parse_mesh("1x1"), target="tt-mlir")
    kernels = plan_kernels(bf16_graph, plan)
    assert sorted(kernels) == [0, 1] and kernels[0] == kernels[1]
    k = kernels[0]
    assert (k.fused, k.matmul, k.collective) == (10, 8, 0), k


def test_head_tp_decomposes_the_norms_across_heads_and_counts_the_plans_collectives_per_block(bf16_graph):
    """tt-xla's hand plan on 2x4 splits the heads over ``model``: the q/k RMSNorms normalize over every head, so
    they run decomposed around the all-reduce of their sums (4 fewer fused kernels), and each block runs its
    share of the plan's collectives as TTNN lowers them — those named for every block, less the text keys'
    RMSNorm sums, which run beside the prologue."""
    plan = tt_xla_plan(bf16_graph, parse_mesh("2x4"), target="tt-mlir")
    kernels = plan_kernels(bf16_graph, plan)
    k = kernels[0]
    assert kernels[1] == k and (k.fused, k.matmul) == (6, 8), k
    per_block = [c for c in plan.predicted_by_partitioner()["tt-mlir"] if c.where.startswith("blocks.*")]
    beside = [c for c in per_block if c.where == "blocks.*.attn2.norm_k:rms_norm#0"]
    assert len(beside) == 1
    assert k.collective == sum(c.count for c in per_block) // 2 - beside[0].count // 2
    one_chip = plan_kernels(bf16_graph, plan_graph(bf16_graph, parse_mesh("1x1"), target="tt-mlir"))[0]
    assert k.typecast > one_chip.typecast and k.eltwise > one_chip.eltwise  # the decomposed norms' kernels


def test_the_moves_read_what_each_chip_holds_of_the_values_they_move(bf16_graph):
    """What a data-movement kernel costs beside its launch is the bytes it moves: the reshapes and permutes of a
    block on one chip move whole values; the hand plan splits those values over the chips, so each chip moves
    less per move. Not compared with the compiled program (a TTNN histogram has no sizes)."""
    one = plan_kernels(bf16_graph, plan_graph(bf16_graph, parse_mesh("1x1"), target="tt-mlir"))[0]
    split = plan_kernels(bf16_graph, tt_xla_plan(bf16_graph, parse_mesh("2x4"), target="tt-mlir"))[0]
    assert one.move > 0 and one.move_bytes > 0
    assert split.move_bytes / split.move < one.move_bytes / one.move
    assert (one + split).move_bytes == one.move_bytes + split.move_bytes
    assert "move_bytes" not in one.to_json()  # the compared classes only


def test_at_full_width_each_block_counts_its_own_collectives():
    """A14B at 720p on bh-galaxy, the first 2 of 40 blocks with every rewrite: block 0 makes block 1's entry
    reshard (an all-to-all over ``model``: 96 point-to-point transfers on 8x4) at its output, and block 1's output
    is read by the epilogue instead. Each block's count is its own, as tt-mlir compiled them (`wancompile tt-check
    --model wan2.2-t2v-a14b --blocks 2 --resolution 720p --mesh 8x4 --system bh-galaxy --rewrites all`: 296 and 200
    collective kernels, 436 and 334 in all; docs/tenstorrent.md), where the plan's ``blocks.*`` collectives shared
    equally gave each block 248."""
    from wancompile.options import parse_rewrites
    from wancompile.tt.fullsize import plan_first_blocks

    p = plan_first_blocks("wan2.2-t2v-a14b", parse_mesh("8x4"), "bh-galaxy", rewrites=parse_rewrites("all"))
    kernels = plan_kernels(p.graph, p.cut)
    assert [kernels[k].collective for k in (0, 1)] == [296, 200]
    for k, compiled in ((0, 436), (1, 334)):
        assert abs(kernels[k].total / compiled - 1) <= 0.02, (k, kernels[k])


def test_the_pins_move_no_collective_between_blocks():
    """At its smallest budget the auto plan gathers block 1's cross-attention weights (FSDP) where block 0's stay
    whole: block 1 runs more collectives than block 0 (TTNN: 8 and 6, `tests/test_tt_fused.py`). The pinned plan
    reads each weight through a constrained view, so its gathers are made at the weight; they are the reading
    op's, in the same block, and the count is the unpinned plan's."""
    from planner.pins import pin_layouts

    graph = _rewritten_for_tt("2x4")
    plan = plan_graph(graph, parse_mesh("2x4"), "wh-loudbox", memory_gb=0.00025, target="tt-mlir")
    kernels = plan_kernels(graph, plan)
    assert [kernels[k].collective for k in (0, 1)] == [6, 8], kernels
    assert plan_kernels(graph, pin_layouts(graph, plan)) == kernels


def test_rope_s_heads_first_transpose_is_a_reshape_and_a_permute_unless_a_chip_holds_one_head():
    """With the `rope` rewrite's reorder made on the weights, q and k only move their heads first before the
    rotation, reading the head split of the norm's output: tt-mlir runs a ``reshape`` and a ``permute`` for it
    (TI2V-5B at full width, 6 heads a chip); where a chip holds one head the permute moves only a dim of size 1,
    and the two are one ``reshape`` (the tiny DiT under the hand plan on 2x4)."""
    from planner.placements import Layout
    from planner.ttnn_kernels import _Ctx, _permute

    g = _rope_graph(True)
    split = {n.name for n in g if n.op == "unflatten" and g[n.inputs[0]].op == "rms_norm"}
    firsts = [n for n in g if n.op == "transpose" and n.inputs[0] in split]
    assert len(firsts) == 4  # q and k of 2 blocks (the others permute weights, once: const-eval)
    for mesh, heads in ((parse_mesh("1x1"), ()), (parse_mesh("1x4"), ("model",))):
        layouts = {n.inputs[0]: (Layout(((), (), heads, ())),) for n in firsts}
        ctx = _Ctx(g, layouts, mesh, frozenset(), frozenset())
        assert {_permute(g, n, ctx).move for n in firsts} == ({2} if not heads else {1})


def test_a_packed_weight_gathered_per_use_counts_in_the_block_of_the_linear_reading_it():
    """On 8x4 at its smallest budget the auto plan gathers the `qkv` rewrite's packed weight per use (FSDP); the
    packed weight is computed from the parameters once (const-eval), so its gather is made where it is read, by
    the q/k/v linear, in the block, and without a copy to tile layout (const-eval hands it over tiled): per block
    15 collective kernels as TTNN compiles them (`wancompile tt-check --model tiny --tightest --dtype bfloat16
    --rewrites all --mesh 8x4 --system bh-galaxy`: 147 kernels a block, 148 predicted, the two among them the
    `sp_pad` cuts of K and V that tt-mlir's padded keys take; 145 and 146 with a key mask), where it was dropped
    as running beside the prologue (14)."""
    from planner.errors import MemoryBudgetError

    graph = _rewritten_for_tt("8x4")
    with pytest.raises(MemoryBudgetError) as smallest:
        plan_graph(graph, parse_mesh("8x4"), "wh-galaxy", memory_gb=1e-9, target="tt-mlir")
    plan = plan_graph(graph, parse_mesh("8x4"), "wh-galaxy", memory_gb=smallest.value.need_gb, target="tt-mlir")
    kernels = plan_kernels(graph, plan)
    assert [(kernels[k].collective, kernels[k].total) for k in (0, 1)] == [(15, 148)] * 2, kernels
