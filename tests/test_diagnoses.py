"""Diagnoses that agree with themselves (on the meta device): the minimum budget named plans and is
minimal, the plan made at it predicts no more memory than that, mesh advice names only larger meshes
that exist and plan, time-outs are time-outs, only legal options reach the solver, plans record the
geometry they were made for."""

import pytest

from planner import plan_graph
from planner.hardware import PROFILES
from planner.mesh import parse_mesh
from planner.plan import MemoryBudgetError, Plan, SolverTimeout, load_plan, save_plan
from planner.strategies import find_structure, strategies

from error_cases import tiny_graph

CONFIGS = {
    "4h16-48tok": dict(),
    "5h12-36tok": dict(resolution="480p", num_attention_heads=5, attention_head_dim=12),
    "12h4-ffn200": dict(num_attention_heads=12, attention_head_dim=4, ffn_dim=200),
}


FAST = {("4h16-48tok", "2x4"), ("5h12-36tok", "4x1"), ("12h4-ffn200", "8x4")}  # the rest: slow


@pytest.mark.parametrize(
    "config, mesh",
    [
        pytest.param(c, m, marks=() if (c, m) in FAST else pytest.mark.slow)
        for c in CONFIGS
        for m in ("4x1", "2x4", "8x4")
    ],
)
def test_the_named_minimum_plans_is_minimal_and_predicts_within_it(config, mesh):
    graph = tiny_graph(**CONFIGS[config])
    with pytest.raises(MemoryBudgetError) as e:
        plan_graph(graph, parse_mesh(mesh), memory_gb=1e-7)
    need = e.value.need_gb
    assert f"needs {need:.6g} GB per device" in str(e.value) and f"at least {need:.6g}" in str(e.value)
    plan = plan_graph(graph, parse_mesh(mesh), memory_gb=need)
    plan.check(graph)  # only legal options reached the solver: the checker accepts the plan at its tightest
    assert plan.predicted.memory_bytes_per_device <= need * 1e9
    with pytest.raises(MemoryBudgetError):
        plan_graph(graph, parse_mesh(mesh), memory_gb=need * 0.99)


def test_mesh_advice_names_only_larger_system_meshes_that_plan():
    graph = tiny_graph()
    budget = 0.00025
    with pytest.raises(MemoryBudgetError) as e:
        plan_graph(graph, parse_mesh("1x2"), memory_gb=budget)
    natives = {"x".join(map(str, p.mesh_shape)) for p in PROFILES.values()}
    assert e.value.meshes and all(m in natives and m != "1x2" for m in e.value.meshes), e.value.meshes
    for m in e.value.meshes:
        assert parse_mesh(m).size > 2 and f"{m} (" in str(e.value)
        plan_graph(graph, parse_mesh(m), memory_gb=budget).check(graph)
    with pytest.raises(MemoryBudgetError) as e:  # the largest system: nothing larger to name
        plan_graph(graph, parse_mesh("8x4"), memory_gb=1e-7)
    assert e.value.meshes == () and "use a larger mesh" not in str(e.value) and "mesh of at least" not in str(e.value)


def test_a_time_out_is_reported_as_one_naming_the_limit():
    with pytest.raises(SolverTimeout, match=r"time limit \(0 s\).*raise the time limit") as e:
        plan_graph(tiny_graph(), parse_mesh("2x4"), time_limit_s=0)
    assert e.value.time_limit_s == 0 and "no plan fits" not in str(e.value)


def test_uneven_splits_are_excluded_before_the_solve():
    graph = tiny_graph(**CONFIGS["12h4-ffn200"])
    st = find_structure(graph)
    ffn = next(m for m in st.block_macros if m.name == "ffn")
    opts, why = strategies(graph, ffn, parse_mesh("8x4"), st.tokens, tile=32)
    assert not any(s.fsdp and set(s.sigma) | set(s.tp) == {"batch", "model"} for s in opts)
    assert any("ffn.net.0.proj.weight dim 0 of size 200 does not split 32 ways" in w.reason for w in why), why


def test_plans_record_their_geometry_and_keep_it_through_json(tmp_path):
    plan = plan_graph(tiny_graph(), parse_mesh("2x4"))
    assert dict(plan.geometry) == {"heads": 4, "head_dim": 16, "tokens": 48}
    data = plan.to_json()
    assert data["geometry"] == {"heads": 4, "head_dim": 16, "tokens": 48, "layers": 2}
    again = load_plan(save_plan(plan, tmp_path / "plan.json"))
    assert dict(again.geometry) == dict(plan.geometry)
    again.check(tiny_graph())
    old = Plan.from_json({k: v for k, v in data.items() if k != "geometry"})  # plans written before geometry: no check
    old.check(tiny_graph("480p"))
