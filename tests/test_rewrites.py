"""apply_rewrites as a whole: the API, and every pass on the tiny Wan DiT and VAE graphs dynamo captures.

Per-pass goldens and precondition failures live in tests/test_rewrites_<family>.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx

from rewrites import PASS_NAMES, RewriteContext, RewriteReport, apply_rewrites
from rewrites._core import module_path

from conftest import TINY_ALL_REWRITES

TOLERANCE = 1e-6  # max-abs, fp32, eager
# the decode runs ~30 convs and norms deep: a rewritten norm's rounding reaches 1.01e-6 on some CPUs
# (measured here for rmsnorm; a wrong rewrite is off by 1e-2 or more)
VAE_TOLERANCE = 4e-6

DIT_PASSES = {"qkv": 4, "patch_embed": 1, "rope": 4}  # sites in a 2-block DiT (rope: q and k per block)
VAE_PASSES = ("rmsnorm", "conv1x1")


def run(gm: fx.GraphModule, inputs: list) -> list[torch.Tensor]:
    with torch.no_grad():
        return [t for t in gm(*inputs) if isinstance(t, torch.Tensor)]


def max_abs(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    assert [x.shape for x in a] == [y.shape for y in b]
    return max((x - y).abs().max().item() for x, y in zip(a, b))


# --- the API ----------------------------------------------------------------------------------------


def test_pass_names_are_the_public_list():
    assert PASS_NAMES == ("qkv", "rmsnorm", "conv1x1", "patch_embed", "rope", "sp_pad")


def test_the_run_order_is_data_and_a_dependency_that_would_run_later_is_refused():
    from rewrites import REWRITES
    from rewrites._registry import Rewrite, ordered

    assert {r.name: r.after for r in REWRITES if r.after} == {"patch_embed": ("conv1x1",)}
    assert [r.name for r in REWRITES] == sorted(
        PASS_NAMES, key=lambda n: next(r.order for r in REWRITES if r.name == n)
    )
    first, second = Rewrite("first", None, "", order=10, after=("second",)), Rewrite("second", None, "", order=20)
    with pytest.raises(ValueError, match="'first' must run after 'second': give 'second' an order below 10"):
        ordered([first, second])


def test_unknown_pass_name_is_rejected_with_the_valid_names(dit):
    gm, _ = dit
    with pytest.raises(ValueError, match="valid names are qkv, rmsnorm, conv1x1, patch_embed, rope, sp_pad"):
        apply_rewrites(gm, ["qkv", "fuse_everything"])


def test_none_leaves_the_graph_alone_and_reports_nothing(dit):
    gm, _ = dit
    before = gm.code
    assert apply_rewrites(gm, "none") == (gm, [])
    assert gm.code == before


def test_all_reports_every_pass_in_pass_order_whatever_order_names_are_given(dit):
    gm, _ = dit
    _, reports = apply_rewrites(gm, "all")
    assert [r.name for r in reports] == list(PASS_NAMES)
    _, reports = apply_rewrites(fx.GraphModule(gm, gm.graph), ["rope", "qkv"])
    assert [r.name for r in reports] == ["qkv", "rope"]


def test_a_comma_separated_string_names_passes(dit):
    gm, _ = dit
    _, reports = apply_rewrites(gm, "patch_embed, qkv")
    assert [(r.name, r.count) for r in reports] == [("qkv", 4), ("patch_embed", 1)]


def test_report_counts_one_site_per_where_entry(dit):
    gm, _ = dit
    _, reports = apply_rewrites(gm, "all")
    assert all(isinstance(r, RewriteReport) and r.count == len(r.where) for r in reports)
    qkv = reports[0]
    assert qkv.where == ("blocks.0.attn1", "blocks.0.attn2", "blocks.1.attn1", "blocks.1.attn2")


# --- numerics on the captured models ----------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(DIT_PASSES))
def test_dit_pass_keeps_the_output(dit, name):
    gm, inputs = dit
    expected = run(gm, inputs)
    _, (report,) = apply_rewrites(gm, [name])
    assert (report.count, report.skipped) == (DIT_PASSES[name], ())
    assert max_abs(run(gm, inputs), expected) <= TOLERANCE


@pytest.mark.parametrize("name", VAE_PASSES)
def test_vae_pass_keeps_the_output_of_every_decode_graph(vae_graphs, name):
    total = 0
    for gm, inputs in vae_graphs:
        expected = run(gm, inputs)
        _, (report,) = apply_rewrites(gm, [name])
        total += report.count
        assert report.skipped == ()
        assert max_abs(run(gm, inputs), expected) <= VAE_TOLERANCE
    assert total > 0


def test_all_passes_together_keep_the_dit_output(dit45):
    gm, inputs = dit45
    expected = run(gm, inputs)
    _, reports = apply_rewrites(gm, "all", RewriteContext(sp_multiple=4))
    assert {r.name: r.count for r in reports} == TINY_ALL_REWRITES
    assert max_abs(run(gm, inputs), expected) <= TOLERANCE


def test_all_passes_together_keep_the_vae_output(vae_graphs):
    for gm, inputs in vae_graphs:
        expected = run(gm, inputs)
        apply_rewrites(gm, "all", RewriteContext(sp_multiple=4))
        assert max_abs(run(gm, inputs), expected) <= TOLERANCE


# --- a pass without its pattern is a no-op ----------------------------------------------------------


@pytest.mark.parametrize("name", VAE_PASSES)
def test_vae_only_pass_does_nothing_on_the_dit(dit, name):
    gm, _ = dit
    before = gm.code
    _, (report,) = apply_rewrites(gm, [name])
    assert report.count == 0 and gm.code == before


@pytest.mark.parametrize("name", [*DIT_PASSES, "sp_pad"])
def test_dit_only_pass_does_nothing_on_the_vae(vae_graphs, name):
    for gm, _ in vae_graphs:
        before = gm.code
        _, (report,) = apply_rewrites(gm, [name], RewriteContext(sp_multiple=4))
        assert report.count == 0 and gm.code == before


# --- what capture reads off the rewritten graph -----------------------------------------------------


class _CheckExampleValues(fx.Interpreter):
    """Runs the graph and asserts each tensor a node computes matches its meta["example_value"]."""

    def run_node(self, node):
        result = super().run_node(node)
        if isinstance(result, torch.Tensor):
            example = node.meta.get("example_value")
            assert isinstance(example, torch.Tensor), f"{node.name} has no example_value"
            assert (tuple(example.shape), example.dtype) == (tuple(result.shape), result.dtype), node.name
        return result


@pytest.mark.parametrize("graph", ["dit45", "vae_graphs"])
def test_every_node_keeps_a_true_example_value_and_a_module_stack(graph, request):
    graphs = request.getfixturevalue(graph)
    for gm, inputs in graphs if isinstance(graphs, list) else [graphs]:
        old = set(gm.graph.nodes)
        apply_rewrites(gm, "all", RewriteContext(sp_multiple=4))
        with torch.no_grad():
            _CheckExampleValues(gm).run(*inputs)
        new = [n for n in gm.graph.nodes if n not in old and n.op == "call_function"]
        assert new and all("nn_module_stack" in n.meta for n in new)


def test_new_nodes_sit_in_the_module_they_replace(dit):
    gm, _ = dit
    apply_rewrites(gm, ["qkv", "patch_embed"])
    fused = [
        n for n in gm.graph.nodes if n.name.startswith(("qkv", "kv", "tokens")) and n.target is torch._C._nn.linear
    ]
    assert sorted(module_path(n) for n in fused) == [
        "blocks.0.attn1",
        "blocks.0.attn2",
        "blocks.1.attn1",
        "blocks.1.attn2",
        "patch_embedding",
    ]
