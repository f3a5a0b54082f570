"""Capture: every node of the dynamo graph annotated for the planner, on tiny and full-size models."""

import re
import time

import pytest
import torch

from planner.graph import Location
from wancompile.capture import CaptureError, capture_fx, module_path, param_fqn, unannotated


def test_placeholder_names_become_fully_qualified_parameter_names():
    assert (
        param_fqn("L_self_modules_blocks_modules_0_modules_attn1_modules_to_q_parameters_weight_")
        == "blocks.0.attn1.to_q.weight"
    )
    assert (
        param_fqn("L_self_modules_blocks_modules_3_modules_ffn_modules_net_modules_0_modules_proj_parameters_bias_")
        == "blocks.3.ffn.net.0.proj.bias"
    )
    assert param_fqn("L_self_modules_rope_buffers_freqs_cos_") == "rope.freqs_cos"
    assert param_fqn("L_self_parameters_scale_shift_table_") == "scale_shift_table"
    assert param_fqn("L_kwargs_hidden_states_") is None


def test_module_stack_entries_become_dotted_paths():
    assert module_path("L['self']._modules['blocks']._modules['1'].attn2.to_k") == "blocks.1.attn2.to_k"
    assert (
        module_path("L['self']._modules['blocks']._modules['0']._modules['attn1']._modules['to_out']._modules['0']")
        == "blocks.0.attn1.to_out.0"
    )
    assert module_path("L['self']") == ""


def test_tiny_dit_capture_is_fully_annotated(tiny_capture, tiny_model):
    graph, gm = tiny_capture
    assert len(graph) == len(gm.graph.nodes)
    assert unannotated(graph) == []
    expected = {n for n, _ in tiny_model.named_parameters()} | {n for n, _ in tiny_model.named_buffers()}
    assert {n.param for n in graph.params()} == expected
    assert graph.blocks() == [0, 1] and graph.block_prefixes == ("blocks",)
    # every op has an output shape, except the ones that return nothing (setitem) or non-tensors
    no_meta = {n.op for n in graph if not n.outputs and n.op not in ("output",)}
    assert no_meta <= {"setitem"}
    locations = [n.location for n in graph]
    assert len(set(locations)) == len(locations)


def test_ops_inside_a_block_know_their_block_and_module(tiny_capture):
    graph, _ = tiny_capture
    q = graph.by_location()[Location("blocks.1.attn1.to_q", "linear", 0)]
    assert q.block == 1 and q.out.shape == (1, 48, 64) and q.out.dtype == "float32"
    w = next(n for n in graph if n.param == "blocks.1.attn1.to_q.weight")
    assert w.block == 1 and w.module == "blocks.1.attn1.to_q" and w.out.shape == (64, 64)
    assert graph.by_location()[Location("patch_embedding", "conv3d", 0)].block is None
    sdpa = [n for n in graph if n.op == "scaled_dot_product_attention"]
    assert [n.module for n in sdpa] == ["blocks.0.attn1", "blocks.0.attn2", "blocks.1.attn1", "blocks.1.attn2"]


def test_blocks_have_identical_structure(tiny_capture):
    graph, _ = tiny_capture
    ops = [
        [
            (n.op, re.sub(r"^blocks\.\d+", "", n.module), n.out.shape if n.outputs else None)
            for n in graph
            if n.block == b
        ]
        for b in graph.blocks()
    ]
    assert ops[0] == ops[1]


def test_a_graph_break_is_a_capture_error_naming_the_cause():
    def breaks(x):
        y = x * 2
        print("side effect")  # dynamo cannot put print() in a graph
        return y + 1

    with pytest.raises(CaptureError, match="could not capture .* as one graph"):
        capture_fx(breaks, torch.ones(3))


@pytest.mark.slow
def test_full_size_a14b_captures_on_meta_with_40_blocks():
    from wancompile.capture import capture_module
    from wancompile.models import build_transformer, transformer_inputs

    start = time.perf_counter()
    model = build_transformer("wan2.2-t2v-a14b", device="meta")
    graph, _ = capture_module(
        model, **transformer_inputs("wan2.2-t2v-a14b", "720p", 81, device="meta"), return_dict=False
    )
    seconds = time.perf_counter() - start
    print(f"A14B capture on meta: {seconds:.1f} s, {graph.summary()}")
    assert unannotated(graph) == []
    assert graph.blocks() == list(range(40))
    params = graph.params()
    assert len(params) == len(list(model.named_parameters())) + len(list(model.named_buffers())) == 1097
    assert sum(n.out.numel for n in params if not n.param.startswith("rope.")) == sum(
        p.numel() for p in model.parameters()
    )
    per_block = [sum(1 for n in graph if n.block == b) for b in range(40)]
    assert len(set(per_block)) == 1 and per_block[0] * 40 + sum(1 for n in graph if n.block is None) == len(graph)
    tokens = next(n for n in graph if n.op == "contiguous" and n.module == "")
    assert tokens.out.shape == (1, 21 * 45 * 80, 5120)


def test_every_graph_of_the_streaming_vae_decode_is_annotated():
    """diffusers' frame-by-frame decode breaks into many graphs (feat_cache); each must still be
    readable by the planner, with its residual blocks identified."""
    from diffusers import AutoencoderKLWan

    from wancompile.capture import annotate, record_graphs

    torch.manual_seed(0)
    vae = AutoencoderKLWan(
        base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1, temperal_downsample=[False, True, True]
    ).eval()
    graphs = record_graphs(vae.decode, torch.randn(1, 4, 3, 4, 4))
    assert len(graphs) > 1
    annotated = [annotate(gm) for gm in graphs]
    assert all(unannotated(g) == [] for g in annotated)
    assert all(len(g) == len(gm.graph.nodes) for g, gm in zip(annotated, graphs))
    decoder = max(annotated, key=len)
    assert "up_blocks.0.resnets" in decoder.block_prefixes and len(decoder.blocks()) >= 8
    assert any(n.param == "conv_in.weight" for n in decoder.params())
