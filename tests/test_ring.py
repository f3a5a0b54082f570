"""Ring attention as a plan option (planner/ring.py): a self-attention with SP priced with its K/V chunks
passed around the SP axes, each step's transfer hidden behind that step's attention; offered to the solver
only on a target that lowers it (none today: GSPMD has no ring, tt-mlir has no ring SDPA, tt-mlir #7598),
reported in every plan's decisions either way, and refused by the backend when a plan runs it."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from planner import plan_graph
from planner.cost_model import ring_attention_seconds
from planner.mesh import parse_mesh
from planner.plan import Plan, PlanError, load_plan, save_plan
from planner.targets import TARGETS, get_target

from conftest import meta_graph

RING = "ring-test"  # a target like GSPMD that lowers ring attention (no real one does)


@pytest.fixture
def ring_target(monkeypatch):
    monkeypatch.setitem(TARGETS, RING, replace(TARGETS["gspmd"], name=RING, ring_attention=True, no_ring_attention=""))
    return RING


@pytest.fixture(scope="module")
def a14b_720p():
    """Full-size Wan 2.2 T2V-A14B at 720p, 81 frames, two blocks captured on the meta device."""
    return meta_graph("wan2.2-t2v-a14b", "720p", 81, layers=2, dtype=torch.bfloat16)


def _galaxy(graph, target: str) -> Plan:
    return plan_graph(graph, parse_mesh("8x4"), "wh-galaxy", num_blocks=40, weight_sets=2, target=target)


def _attn1(plan: Plan):
    return next(d for d in plan.decisions if d.macro == "attn1")


@pytest.mark.parametrize("target", ["tt-mlir", "gspmd"])
def test_ring_is_priced_and_reported_on_galaxy_but_not_offered(a14b_720p, target):
    plan = _galaxy(a14b_720p, target)
    d = _attn1(plan)
    r = d.ring
    assert r is not None and not r.offered and not r.chosen
    assert r.why_not == get_target(target).no_ring_attention
    if target == "tt-mlir":
        assert "tt-mlir #7598" in r.why_not
    # never chosen, never a solver option, nowhere in the plan's program
    assert not plan.ring_attention
    assert not any(o.name.endswith("ring") or "+ring+" in o.name for x in plan.decisions for o in x.options)
    assert not any(c.kind == "collective-permute" and c.where.startswith("blocks.*.attn1") for c in plan.collectives)
    # the ring option compared is the chosen one's axes with the K/V all-gathers over its SP axes replaced by
    # the ring: same price but for those gathers and the transfers the steps' compute does not hide
    assert r.chosen_seconds_own == d.option(d.strategy).seconds_own
    assert r.steps == 8  # the SP axis: batch, 8 devices
    exposed = (
        ring_attention_seconds(r.step_compute_s * r.steps, r.step_transfer_s, r.steps) - r.step_compute_s * r.steps
    )
    assert r.gather_s > 0 and r.step_transfer_s > 0 and r.step_compute_s > 0
    assert r.seconds_own == pytest.approx(r.chosen_seconds_own + d.count * (exposed - r.gather_s), abs=d.count * 2e-9)
    # on this profile the steps' attention hides their transfers: the ring would be cheaper, and the dumps say so
    assert r.step_compute_s > r.step_transfer_s and r.saves > 0

    from wancompile.report import build_report
    from wancompile.report.explain import explain
    from wancompile.report.markdown import render_markdown

    rep = build_report(plan)
    for text in (render_markdown(rep), explain(rep, "blocks.*.attn1")):
        assert f"ring attention `{r.option}`" in text and f"it would save {r.saves * 1e3:.3f} ms" in text
        assert f"not offered: {r.why_not}" in text


def test_ring_is_chosen_where_the_target_lowers_it_and_it_is_cheaper(a14b_720p, ring_target):
    without = _galaxy(a14b_720p, "gspmd")
    assert _attn1(without).ring.saves > 0  # ring cheaper than the chosen K/V gather (test above)
    plan = _galaxy(a14b_720p, ring_target)
    d = _attn1(plan)
    assert d.ring.offered and d.ring.chosen and d.strategy == d.ring.option
    assert [x.scope for x in plan.ring_attention] == ["blocks.*.attn1"]
    assert plan.predicted.step_seconds < without.predicted.step_seconds
    # the prediction prices the overlap as the solver did
    assert plan.predicted.step_seconds == pytest.approx(plan.solver.objective, abs=1e-6)
    # the plan records the ring: per block and step one K and one V chunk to the neighbour, no K/V gather
    ring = [c for c in plan.collectives if c.where.startswith("blocks.*.attn1") and c.kind == "collective-permute"]
    assert len(ring) == 2 and all(c.count == 40 * (d.ring.steps - 1) and c.axes == ("batch",) for c in ring)
    gathers = {c.where for c in without.collectives if c.kind == "all-gather" and c.where.startswith("blocks.*.attn1")}
    assert {c.where for c in ring} <= gathers
    assert not any(c.kind == "all-gather" and c.where in {x.where for x in ring} for c in plan.collectives)
    # and it survives plan.json
    from wancompile.report.schema import validate

    data = plan.with_(target="gspmd").to_json()  # the published schema knows the real targets only
    del data["predicted_by_partitioner"][RING]
    validate(data)
    again = Plan.from_json(json.loads(json.dumps(plan.to_json())))
    assert _attn1(again).ring == d.ring and again.ring_attention


def test_ring_is_not_chosen_where_its_steps_cost_more_than_the_gather(ring_target):
    """The tiny DiT: each ring step's transfer latency outweighs its attention, so the gather wins."""
    from wancompile.capture import capture_module
    from wancompile.models import build_transformer, transformer_inputs

    g = capture_module(
        build_transformer("tiny", device="meta"),
        **transformer_inputs("tiny", "tiny", 9, device="meta"),
        return_dict=False,
        model="tiny",
    )[0]
    plan = plan_graph(g, parse_mesh("2x4"), "wh-loudbox", target=ring_target)
    d = _attn1(plan)
    assert d.ring.offered and not d.ring.chosen and d.ring.saves < 0
    assert any("+ring" in o.name for o in d.options)  # a solver option, priced and lost
    forced = plan_graph(g, parse_mesh("2x4"), "wh-loudbox", target=ring_target, only={"attn1": r"\+ring"})
    assert forced.ring_attention and forced.solver.objective > plan.solver.objective


def test_backend_refuses_a_plan_that_runs_ring_attention(tmp_path, ring_target, tiny_model, tiny_inputs, spmd):
    from wancompile.capture import capture_module

    from conftest import raises_from_backend

    graph = capture_module(tiny_model, **tiny_inputs, return_dict=False, model="tiny")[0]
    plan = plan_graph(graph, parse_mesh("2x4"), "wh-loudbox", target=ring_target, only={"attn1": r"\+ring"})
    assert plan.ring_attention
    path = save_plan(plan.with_(target="gspmd"), tmp_path / "ring.json")
    assert load_plan(path).ring_attention
    torch._dynamo.reset()
    why = get_target("gspmd").no_ring_attention
    with raises_from_backend(PlanError, r"the plan runs ring attention at blocks\.\*\.attn1 \(.*\+ring.*\)") as info:
        with torch.no_grad():
            torch.compile(tiny_model, backend="wan_autoshard", options={"mesh": "2x4", "plan": str(path)})(
                **tiny_inputs, return_dict=False
            )
    err = getattr(info.value, "inner_exception", None) or info.value
    assert why in str(err) and "target 'gspmd'" in str(err)
