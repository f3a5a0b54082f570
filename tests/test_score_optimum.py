"""The planner asked to optimise the independent score itself (bench/bench_score.py's `score_profile`:
matmul FLOPs at 0.7 of peak plus collectives under wh-galaxy's link fits; no per-kernel cost, memory
traffic free) on the full-size A14B at 720p, 8x4, both experts.

What a user reading docs/results.md is told: on that score no plan the planner can express beats the
tt-xla hand plan. With memory unbounded its best plan *is* the hand plan's layout (head-TP on model,
SP on batch, the stream whole between macros) at the hand plan's price; held to the Galaxy's 12 GB
it pays weight gathers the hand plan (19.4 GB) does not. Issue 16's 0.95 x target on that score is
out of reach of every expressible plan, not of the solver.

Imports a bench script on purpose (as tests/test_numerics.py does): the claim is about the fixed score
bench/bench_score.py defines (`score_profile`, its mesh, hardware and block count), and that definition
belongs to the bench that scores with it, not to the package.
"""

from __future__ import annotations

import pytest
import torch

from bench.bench_score import FULL_BLOCKS, HARDWARE, MESH, score_profile
from planner import plan_graph
from planner.hand_plans import tt_xla_plan
from planner.hardware import get_profile
from planner.mesh import parse_mesh

from conftest import meta_graph


@pytest.fixture(scope="module")
def a14b_720p():
    return meta_graph("wan2.2-t2v-a14b", "720p", 81, layers=2, dtype=torch.bfloat16)


def _plans(graph, **kw):
    mesh, hw = parse_mesh(MESH), score_profile()
    auto = plan_graph(graph, mesh, hw, num_blocks=FULL_BLOCKS, weight_sets=2, **kw)
    hand = tt_xla_plan(graph, mesh, hw, num_blocks=FULL_BLOCKS, weight_sets=2)
    return auto, hand


def test_with_memory_free_the_planners_best_plan_for_the_score_is_the_hand_plans_layout(a14b_720p):
    auto, hand = _plans(a14b_720p, memory_gb=1e6)
    strategies = {d.macro: d.strategy for d in auto.decisions if d.in_block}
    assert strategies == {
        "attn1": "head-TP(model)+SP(batch)",
        "attn2": "head-TP(model)+SP(batch)",
        "ffn": "Megatron(model)+SP(batch)",
    }
    assert {d.state for d in auto.decisions if d.in_block} == {"STATE A"}
    # the same price: what differs (outside the blocks) is below a thousandth of a forward
    assert auto.predicted.step_seconds <= hand.predicted.step_seconds
    assert auto.predicted.step_seconds >= 0.999 * hand.predicted.step_seconds


def test_held_to_the_galaxys_memory_the_best_plan_for_the_score_pays_for_fitting(a14b_720p):
    auto, hand = _plans(a14b_720p)
    budget = float(get_profile(HARDWARE).dram_bytes)
    assert auto.predicted.memory_bytes_per_device <= budget < hand.predicted.memory_bytes_per_device
    assert any(d.fsdp_blocks or "FSDP" in d.strategy for d in auto.decisions if d.in_block)
    assert hand.predicted.step_seconds < auto.predicted.step_seconds < 1.01 * hand.predicted.step_seconds
