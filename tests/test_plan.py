"""Plans as data: plan.json round trips, and a plan that does not fit the model is refused by name."""

import json

import pytest

from planner.hand_plans import tt_xla_plan
from planner.mesh import MeshSpec, parse_mesh
from planner.plan import ActivationConstraint, PlanError, load_plan, save_plan


@pytest.fixture(scope="module")
def graph(tiny_capture):
    return tiny_capture[0]


@pytest.fixture(scope="module")
def hand_plan(graph):
    return tt_xla_plan(graph, parse_mesh("2x4"))


def test_plan_json_round_trip_is_exact(tmp_path, hand_plan):
    path = save_plan(hand_plan, tmp_path / "plan.json")
    assert load_plan(path) == hand_plan
    data = json.loads(path.read_text())
    for key in (
        "schema_version",
        "model",
        "mesh",
        "hardware",
        "solver",
        "params",
        "activations",
        "collectives",
        "predicted",
        "decisions",
        "rewrites",
    ):
        assert key in data, key
    assert data["params"]["blocks.0.attn1.to_q.weight"] == ["model", None]
    assert data["activations"][0]["node"] == ":contiguous#0"


def test_plan_names_every_parameter(graph, hand_plan):
    hand_plan.check(graph)
    assert set(hand_plan.params) == {n.param for n in graph.params()}


def test_plan_for_a_different_model_is_refused_with_names(graph, hand_plan):
    params = dict(hand_plan.params)
    params["blocks.7.attn1.to_q.weight"] = ("model", None)
    del params["blocks.0.ffn.net.2.weight"]
    with pytest.raises(
        PlanError,
        match=r"1 parameter\(s\) the model does not have \(e\.g\. blocks\.7\.attn1\.to_q\.weight\).*"
        r"no spec for 1 .*blocks\.0\.ffn\.net\.2\.weight.*Re-plan",
    ):
        hand_plan.with_(params=params).check(graph)


def test_spec_that_does_not_divide_the_tensor_is_refused(graph, hand_plan):
    params = dict(hand_plan.params)
    params["blocks.0.attn1.to_q.bias"] = (("batch", "model"),)  # 64 / 8 divides: fine
    hand_plan.with_(params=params).check(graph)
    params["condition_embedder.time_proj.weight"] = (None, ("batch", "model"))  # dim 1 is 64: fine
    params["proj_out.bias"] = (("batch", "model"),)  # 16 / 8 = 2: fine
    hand_plan.with_(params=params).check(graph)
    params["blocks.0.attn1.to_q.weight"] = ("model", "model")
    with pytest.raises(PlanError, match="uses a mesh axis twice"):
        hand_plan.with_(params=params).check(graph)
    bad = hand_plan.with_(mesh=MeshSpec((2, 3), ("batch", "model")))
    with pytest.raises(
        PlanError,
        match=r"plan parameter \S+weight: dim 0 of size 64 cannot be split 3 ways by \(model, -\) on mesh 2x3",
    ):
        bad.check(graph)


def test_constraint_at_a_location_the_graph_lacks_is_refused(graph, hand_plan):
    extra = ActivationConstraint.from_json({"node": "blocks.9.attn1:linear#0", "spec": [None, "batch", None]})
    with pytest.raises(PlanError, match=r"constrains blocks\.9\.attn1:linear#0, but the captured graph has no such op"):
        hand_plan.with_(activations=hand_plan.activations + (extra,)).check(graph)


def test_corrupted_plan_files_get_clear_errors(tmp_path, hand_plan):
    path = save_plan(hand_plan, tmp_path / "plan.json")
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    with pytest.raises(PlanError, match="not valid JSON.*truncated or corrupted"):
        load_plan(path)
    data = hand_plan.to_json()
    data["schema_version"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(PlanError, match="schema_version 99"):
        load_plan(path)
    data = hand_plan.to_json()
    del data["params"]
    path.write_text(json.dumps(data))
    with pytest.raises(PlanError, match="lacks the required field 'params'"):
        load_plan(path)
    data = hand_plan.to_json()
    data["params"]["proj_out.bias"] = "model"
    path.write_text(json.dumps(data))
    with pytest.raises(PlanError, match="bad partition spec 'model'"):
        load_plan(path)
