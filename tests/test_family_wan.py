"""The variants of diffusers' `WanTransformer3DModel` itself: T2V, I2V (CLIP image tokens beside the prompt's),
FLF2V (first- and last-frame image tokens with a learnt position embedding) and Wan 2.2 TI2V (a timestep per
token, so a per-token (B, L, 6, D) modulation). Each tiny model (`wancompile.models.FAMILIES`) on 2x4 through the
backend: at the default budget, at the tightest budget the planner names, and there with every rewrite — output
against eager fp32 and predicted collectives against the partitioned HLO (`wancompile.verify.check_family`)."""

from __future__ import annotations

import pytest

from wancompile.verify import FAMILY_CASES

from conftest import assert_matches_prediction

pytestmark = pytest.mark.usefixtures("spmd")

FAMILIES = ("wan-i2v", "wan-flf2v", "wan-ti2v")


@pytest.mark.slow
@pytest.mark.parametrize("case", list(FAMILY_CASES))
@pytest.mark.parametrize("family", FAMILIES)
def test_family_shards_under_a_tight_budget_matches_eager_and_compiles_as_predicted(family, case):
    from wancompile.verify import check_family

    got = check_family(family, case)
    assert got.vs_eager.pcc >= 0.99999, got.vs_eager
    if case == "default":  # memory is ample: the latency-bound tiny model replicates
        assert got.params_sharded == 0.0
    else:  # the budget forces weight sharding
        assert got.params_sharded > 0.5 and any("FSDP" in d.strategy for d in got.program.plan.decisions)
    assert_matches_prediction([vars(m) for m in got.matches], f"{family} {case}")


def test_a_timestep_per_token_is_a_per_token_modulation_the_plan_pins():
    """TI2V's (1, 48) timestep: the blocks read a (1, 48, 6, D) modulation, and with the tokens split the plan pins
    it (left open, GSPMD split it on the tokens and all-gathered each piece back: SkyReels-V2's diffusion forcing)."""
    from planner.autoplan import plan_graph
    from planner.mesh import parse_mesh
    from planner.plan import MemoryBudgetError
    from wancompile.capture import capture_module
    from wancompile.models import build_family

    model, inputs = build_family("wan-ti2v")
    assert inputs["timestep"].shape == (1, 48)
    graph, _ = capture_module(model, **inputs, return_dict=False, model="wan-ti2v")
    assert any(n.outputs and tuple(n.out.shape) == (1, 48, 6, 64) for n in graph)
    with pytest.raises(MemoryBudgetError) as e:
        plan_graph(graph, parse_mesh("2x4"), memory_gb=1e-9)
    plan = plan_graph(graph, parse_mesh("2x4"), memory_gb=e.value.need_gb)
    assert any(d.stream and "S(1)" in d.stream for d in plan.decisions if d.in_block)  # tokens split
    per_token = [a for a in plan.activations if len(a.shape) == 4 and tuple(a.shape)[1:3] == (48, 6)]
    assert per_token, "the per-token modulation is left open"
