"""Capture: every node of the dynamo graph annotated for the planner, on tiny and full-size models."""

import json
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
    assert "up_blocks.0.resnets" in decoder.block_prefixes
    assert sum(len(f.indices) for f in decoder.families) >= 8  # residual blocks, indexed within their stack
    assert any(n.param == "conv_in.weight" for n in decoder.params())


def test_blocks_are_found_by_structure_not_class_name():
    """Two stacks of attention blocks with an unknown class name: each is a family with its own
    indices (``extra.1`` is block 1 of ``extra``), and parameter-less glue stays outside."""
    from wancompile.capture import capture_module

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(16, 48)

        def forward(self, x):
            q, k, v = self.qkv(x).unflatten(-1, (3, 2, 8)).transpose(1, 3).unbind(2)
            return x + torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(-2)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([Layer() for _ in range(3)])
            self.extra = torch.nn.ModuleList([Layer() for _ in range(2)])
            self.heads = torch.nn.ModuleList([torch.nn.Linear(16, 16) for _ in range(2)])  # no attention

        def forward(self, x):
            for layer in self.extra:
                x = layer(x)
            for layer in self.layers:
                x = layer(x)
            return self.heads[0](x) + self.heads[1](x)

    graph, _ = capture_module(Model(), torch.randn(1, 5, 16))
    assert [(f.prefix, f.indices, f.odd) for f in graph.families] == [("extra", (0, 1), ()), ("layers", (0, 1, 2), ())]
    assert graph.block_prefixes == ("extra", "layers") and unannotated(graph) == []
    w = next(n for n in graph if n.param == "extra.1.qkv.weight")
    assert (w.family, w.block) == ("extra", 1) and graph.block_root(w) == "extra.1"
    assert graph.blocks("layers") == [0, 1, 2] and graph.blocks("extra") == [0, 1]
    assert graph.in_block(w, "extra.1.qkv.weight", "*") == "extra.*.qkv.weight"
    assert all(n.block is None for n in graph if n.module.startswith("heads"))
    assert json.loads(graph.to_json())["families"][1] == {"prefix": "layers", "indices": [0, 1, 2], "odd": []}


def test_one_captured_block_is_still_a_block(tiny_model, tiny_inputs):
    from wancompile.capture import capture_module
    from wancompile.models import build_transformer

    one = build_transformer("tiny", num_layers=1)
    graph, _ = capture_module(one, **tiny_inputs, return_dict=False)
    assert [(f.prefix, f.indices) for f in graph.families] == [("blocks", (0,))] and unannotated(graph) == []


def test_a_block_whose_parameters_differ_is_listed_as_odd():
    """VACE's first ``vace_blocks`` entry has an input projection the others lack."""
    from wancompile.capture import capture_module

    class Layer(torch.nn.Module):
        def __init__(self, proj_in: bool):
            super().__init__()
            self.proj_in = torch.nn.Linear(16, 16) if proj_in else None
            self.q = torch.nn.Linear(16, 16)

        def forward(self, x):
            x = self.proj_in(x) if self.proj_in is not None else x
            q = self.q(x).unflatten(-1, (2, 8)).transpose(1, 2)
            return x + torch.nn.functional.scaled_dot_product_attention(q, q, q).transpose(1, 2).flatten(-2)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.vace_blocks = torch.nn.ModuleList([Layer(i == 0) for i in range(3)])

        def forward(self, x):
            for layer in self.vace_blocks:
                x = layer(x)
            return x

    graph, _ = capture_module(Model(), torch.randn(1, 5, 16))
    assert [(f.prefix, f.indices, f.odd) for f in graph.families] == [("vace_blocks", (0, 1, 2), (0,))]
