"""The VAE planner on captured tiny Wan VAE decode graphs (no XLA): macros, sharing, the rules'
collectives per strategy, uneven spatial splits. Compiled checks: tests/test_vae_plan_fidelity.py."""

from __future__ import annotations

import pytest
import torch

from planner.graph import Location
from planner.mesh import parse_mesh
from planner.plan import MemoryBudgetError, PlanError
from planner.vae_plan import find_macros, plan_vae


def _graph(latent_hw, config="tiny-wan2.1", frames=3):
    import wancompile.vae as wvae
    from wancompile.capture import annotate, capture_fx
    from wancompile.vae.configs import build_vae
    from wancompile.vae.legalize import fold_conv_padding

    vae = wvae.enable_full_t(build_vae(config))
    z = torch.randn(1, vae.config.z_dim, frames, *latent_hw)
    return annotate(fold_conv_padding(capture_fx(vae.decode, z))[0], model=config)


@pytest.fixture(scope="module")
def graph_8x8():
    return _graph((8, 8))


def test_macros_and_shared_resblocks(graph_8x8):
    macros = find_macros(graph_8x8)
    kinds = [m.kind for m in macros]
    assert kinds.count("resblock") == 10 and kinds.count("attention") == 1 and kinds.count("upsample") == 3
    assert kinds[0] == "head" and kinds[-1] == "tail"
    # every op is in exactly one macro
    names = [x for m in macros for x in m.nodes]
    assert len(names) == len(set(names)) == sum(1 for n in graph_8x8 if n.op not in ("placeholder", "output"))
    plan = plan_vae(graph_8x8, parse_mesh("2x2"), "wh-loudbox", preset="spatial")
    # the mid block's two resblocks and up_blocks.0's two have one shape: one ILP variable for 4
    assert any(d.node.endswith("(x4)") for d in plan.decisions), [d.node for d in plan.decisions]


def test_channel_megatron_is_the_seeds_bill(graph_8x8):
    """Per residual block: conv2's output all-reduce and norm2's statistics all-reduce (seed 001)."""
    plan = plan_vae(graph_8x8, parse_mesh("2x2"), "wh-loudbox", preset="channel-megatron")
    assert all(d.strategy == ("channel(batch+model)" if "resnets" in d.node else "replicated") for d in plan.decisions)
    ars = [c for c in plan.collectives if c.kind == "all-reduce"]
    assert {c.axes for c in ars} == {("batch", "model")}
    per_block = {}
    for c in ars:
        per_block.setdefault(c.where.split(":")[0].rsplit(".", 1)[0], []).append(c)
    assert len(per_block) == 10 and all(len(v) == 2 for v in per_block.values())
    for block in per_block.values():
        big, small = sorted(block, key=lambda c: -c.bytes)
        assert big.where.endswith("conv2:conv3d#0") and small.where.endswith("norm2:normalize#0")
        conv2 = graph_8x8.by_location()[Location.parse(big.where)]
        assert big.bytes == small.bytes * conv2.out.shape[1]  # (B, C, T, H, W) output vs (B, 1, T, H, W) statistics
    assert not any(c.kind == "collective-permute" for c in plan.collectives)


def test_spatial_plan_has_halos_and_no_resblock_all_reduce(graph_8x8):
    plan = plan_vae(graph_8x8, parse_mesh("2x4"), "wh-loudbox", preset="spatial")
    assert not any(c.kind == "all-reduce" for c in plan.collectives)
    halos = [c for c in plan.collectives if c.kind == "collective-permute"]
    convs = {c.where for c in halos}
    assert all(c.count == 2 for c in halos)  # one per direction per split dim
    assert len(convs) == 25  # every 3x3 conv: conv_in, 2 x 10 resblocks, 3 upsampler conv2ds, conv_out
    assert (
        plan.predicted.memory_bytes_per_device
        < plan_vae(graph_8x8, parse_mesh("2x4"), "wh-loudbox", preset="replicated").predicted.memory_bytes_per_device
    )


def test_memory_budget_forces_activations_apart(graph_8x8):
    mesh = parse_mesh("2x4")
    replicated = plan_vae(graph_8x8, mesh, "wh-loudbox", preset="replicated").predicted.memory_bytes_per_device
    plan = plan_vae(graph_8x8, mesh, "wh-loudbox", memory_gb=replicated / 2 / 1e9)
    assert plan.predicted.memory_bytes_per_device <= replicated / 2
    assert any(d.strategy.startswith("spatial") for d in plan.decisions)
    with pytest.raises(
        MemoryBudgetError, match=r"no plan fits 1e-06 GB per device on mesh 2x4 \(8 devices\) for the VAE"
    ) as e:
        plan_vae(graph_8x8, mesh, "wh-loudbox", memory_gb=1e-6)
    # one engine with the DiT's: the minimum the error names is a budget that plans, and a plan within it
    at_min = plan_vae(graph_8x8, mesh, "wh-loudbox", memory_gb=e.value.need_gb)
    assert at_min.predicted.memory_bytes_per_device <= e.value.need_gb * 1e9


@pytest.fixture(scope="module")
def graph_6x10():
    return _graph((6, 10))


def test_uneven_spatial_split_is_excluded_with_a_reason_and_refused_when_forced(graph_6x10):
    """Latent W = 10 on a 4-way axis: GSPMD gathers uneven conv halos (measured: all-gathers beside
    the permutes for pad + conv3d with W = 10 on 2x4), so the planner does not split W 4 ways."""
    graph = graph_6x10
    mesh = parse_mesh("2x4")
    plan = plan_vae(graph, mesh, "wh-loudbox", preset="spatial")
    for d in plan.decisions:
        assert "W:model" not in d.strategy and "W:batch+model" not in d.strategy, d.strategy
    assert any("does not split evenly into" in x.reason for d in plan.decisions for x in d.excluded)
    with pytest.raises(PlanError, match=r"10 x? ?.*does not split evenly|H x W = .* x 10"):
        plan_vae(graph, mesh, "wh-loudbox", preset="spatial", only={"*": r"\(H:-,W:model\)$"})


def test_vae_decisions_carry_their_options_and_exclusions_into_every_view(graph_6x10):
    """The VAE's decisions are the DiT's typed Decision: options priced per decode, exclusions with
    reasons, the macros a shared group stands for; plan.md and explain show all of them."""
    from wancompile.report.explain import explain
    from wancompile.report.markdown import render_markdown
    from wancompile.report.model import Report

    plan = plan_vae(graph_6x10, parse_mesh("2x4"), "wh-loudbox")
    shared = next(d for d in plan.decisions if d.count > 1)
    assert len(shared.members) == shared.count and shared.macro in shared.members and not shared.in_block
    assert all(d.unit == "decode" and d.option(d.strategy) is not None for d in plan.decisions)
    uneven = next(d for d in plan.decisions if any("does not split evenly" in x.reason for x in d.excluded))
    rep = Report(plan)
    md = render_markdown(rep)
    why = md[md.index(f"### {uneven.node}: {uneven.strategy}") :].split("\n### ")[0]
    assert f"the best plan with it costs {uneven.cost * 1e3:.3f} ms per decode" in why
    assert "- excluded: " + "; ".join(f"{x.option}: {x.reason}" for x in uneven.excluded) in why
    rest = [o for o in uneven.options if o.name not in (uneven.strategy, uneven.rejected)]
    if rest:
        assert "- other options priced: " + ", ".join(f"`{o.name}` {o.seconds_own * 1e3:.3f} ms" for o in rest) in why
    text = explain(rep, uneven.macro)
    assert text.splitlines()[0] == f"{uneven.node}: {uneven.strategy}"
    assert f"  stream: {uneven.stream}" in text and uneven.stream.startswith("(")
    assert (
        "  options priced (ms per decode): "
        + ", ".join(
            f"{o.name}={o.seconds_own * 1e3:.3f}" + (" *" if o.name == uneven.strategy else "") for o in uneven.options
        )
        in text
    )
    for x in uneven.excluded:
        assert f"  excluded: {x.option}: {x.reason}" in text
    member = explain(rep, shared.members[-1] + ".conv1")  # a module of another member: the shared decision
    assert f"decided by {shared.node}: {shared.strategy}" in member


def test_unknown_preset():
    with pytest.raises(PlanError, match="unknown VAE plan preset"):
        plan_vae(_graph((4, 4), frames=1), parse_mesh("2x2"), preset="fast")
