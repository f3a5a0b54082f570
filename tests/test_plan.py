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
        match=r"plan parameter \S+weight: dim 0 of size 64 cannot be split 3 ways over model by \(R, S\(0\)\) on mesh 2x3",
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
    data["schema_version"] = 1  # the format before typed decisions
    path.write_text(json.dumps(data))
    with pytest.raises(
        PlanError, match=r"schema_version 1, an older format.*Re-plan.*`wancompile plan \.\.\. --out DIR`"
    ):
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


def test_decisions_are_typed_data_that_round_trip(tmp_path, graph):
    """Every decision of an auto plan: the options with their own costs (the chosen one among them),
    the exclusions with reasons, and a runner-up whose cost split adds up to the whole difference."""
    from planner import plan_graph
    from planner.placements import show_spec
    from planner.plan import CostSplit, Decision, Exclusion, OptionCost

    plan = plan_graph(graph, parse_mesh("2x4"), "wh-loudbox", memory_gb=0.00025)
    assert load_plan(save_plan(plan, tmp_path / "plan.json")) == plan
    data = json.loads((tmp_path / "plan.json").read_text())
    assert data["schema_version"] == 2 and "note" not in data["decisions"][0]
    by_macro = {d.macro: d for d in plan.decisions}
    assert set(by_macro) == {
        "attn1",
        "attn2",
        "ffn",
        "condition_embedder.time_embedder",
        "condition_embedder.text_embedder",
    }
    attn1 = by_macro["attn1"]
    assert (attn1.in_block, attn1.count, attn1.scope, attn1.node) == (True, 2, "blocks.*.attn1", "blocks.*.attn1 (x2)")
    assert not by_macro["condition_embedder.time_embedder"].in_block
    for d in plan.decisions:
        assert type(d) is Decision and all(type(o) is OptionCost for o in d.options)
        assert d.option(d.strategy) is not None and d.unit == "forward"
        assert [o.seconds_own for o in d.options] == sorted(o.seconds_own for o in d.options)
        assert all(type(x) is Exclusion and x.option and x.reason for x in d.excluded)
        if d.rejected:
            split = d.rejected_split
            assert type(split) is CostSplit and split.total == pytest.approx(d.rejected_cost - d.cost, abs=1e-9)
            assert d.margin == d.rejected_cost - d.cost >= 0
    entry = next(a for a in plan.activations if a.location.module == "" and len(a.spec) == 3)  # the block-stack entry
    assert attn1.stream == show_spec(entry.spec, plan.mesh) == attn1.option(attn1.strategy).stream
    assert attn1.stream.startswith("(") and "S(1)" in attn1.stream  # the tiny plan splits the tokens
    assert Exclusion("head-TP over batchxmodel (8)", "4 heads do not divide into 8") in attn1.excluded
    assert {o.stream for o in by_macro["condition_embedder.time_embedder"].options} == {""}  # no stream outside blocks


@pytest.mark.parametrize("name", ["plan_tiny_2x4.json", "plan_tiny_cfg_2x4.json", "plan_a14b_galaxy_dump.json.gz"])
def test_plan_files_written_before_the_record_mapping_load_and_save_unchanged(name):
    """tests/data holds plan.json files written by the hand-written JSON code (46cfc16): they load,
    and saving them again writes the same bytes (keys, order, omitted fields, spec lists)."""
    import gzip
    from pathlib import Path

    from planner.plan import Plan

    path = Path(__file__).parent / "data" / name
    text = (gzip.open(path, "rt") if name.endswith(".gz") else path.open()).read()
    data = json.loads(text)
    data.pop("report", None)  # the dump's per-op trace: wancompile.report's, not the plan's
    plan = Plan.from_json(data)
    assert json.dumps(plan.to_json(), indent=1) == json.dumps(data, indent=1)
    assert plan.layers == data["geometry"]["layers"]


def test_plan_names_its_block_stacks_as_data(hand_plan):
    from planner.plan import Decision

    assert hand_plan.stacks == {"blocks": 2} and hand_plan.layers == 2
    assert hand_plan.block_of("blocks.1.attn1.to_q.weight") == ("blocks", 1, ".attn1.to_q.weight")
    assert hand_plan.generic("blocks.1.attn1:linear#0") == "blocks.*.attn1:linear#0"
    assert hand_plan.generic("blocks.1") == "blocks.*"
    assert hand_plan.block_of("proj_out.weight") is None and hand_plan.generic("blocks.x.y") == "blocks.x.y"
    vace = Decision("vace_blocks.*.attn1", "replicated", 0.0, family="vace_blocks")
    params = {**hand_plan.params, "vace_blocks.0.attn1.to_q.weight": (None, None)}
    plan = hand_plan.with_(params=params, decisions=(vace,))
    assert plan.stacks == {"blocks": 2, "vace_blocks": 1}
    assert plan.generic("vace_blocks.0.attn1.to_q.weight") == "vace_blocks.*.attn1.to_q.weight"


def test_a_record_field_needs_no_json_code():
    """`planner.records` reads the fields and type hints: nested records, Optional, tuples (lists in
    JSON), omitted defaults, and the schema says the same."""
    from dataclasses import dataclass
    from typing import Annotated, Optional

    import jsonschema

    from planner.decision import Decision, HeadPadding
    from planner.records import OMIT, Record, json_schema

    @dataclass(frozen=True)
    class Inner(Record):
        name: str
        sizes: tuple[int, ...] = ()

    @dataclass(frozen=True)
    class Outer(Record):
        inner: Inner
        pair: Optional[tuple[int, int]] = None
        extra: Annotated[str, OMIT] = ""

    value = Outer(Inner("a", (1, 2)), (3, 4))
    assert value.to_json() == {"inner": {"name": "a", "sizes": [1, 2]}, "pair": [3, 4]}
    assert Outer.from_json(value.to_json()) == value
    defs = {}
    schema = {**json_schema(Outer, defs), "$defs": defs}
    jsonschema.validate(value.to_json(), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"inner": {"name": "a"}, "pair": [1]}, schema)
    d = Decision("attn1", "pad", 0.5, in_block=True, pad_heads=HeadPadding("blocks.*.attn1", 12, 16))
    assert Decision.from_json(d.to_json()) == d and d.to_json()["node"] == "blocks.*.attn1"
    assert "ring" not in d.to_json() and "family" not in d.to_json()
