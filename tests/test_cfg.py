"""CFG parallel, costed (planner.cfg): the split mesh, the decision, its record, the option, the backend path.

The compiled-program checks (numerics vs two eager batch-1 forwards, predicted vs compiled collectives on
the split meshes) are in tests/test_cfg_fidelity.py (slow, subprocess).
"""

from __future__ import annotations

import json

import pytest

from planner.cfg import plan_dit, split_mesh, split_profile
from planner.hardware import get_profile
from planner.mesh import MeshSpec, entry_axes, parse_mesh
from planner.plan import Plan, PlanError
from wancompile.hlo import group_axes, parse_collectives

from conftest import TINY_PLAN


@pytest.fixture(scope="module")
def pair_graph(tiny_model):
    """The tiny DiT's graph at batch 2 (a CFG pair as one forward)."""
    from wancompile.capture import capture_module
    from wancompile.models import transformer_inputs

    inputs = transformer_inputs("tiny", "tiny", 9, batch=2)
    return capture_module(tiny_model, **inputs, return_dict=False, model="wan-dit")[0]


@pytest.fixture(scope="module")
def single_graph(tiny_capture):
    return tiny_capture[0]


def test_split_mesh_refines_the_users_mesh_row_major():
    base = parse_mesh("2x4")
    for axis, shape, names in (
        ("batch", (2, 1, 4), ("cfg", "batch", "model")),
        ("model", (2, 2, 2), ("batch", "cfg", "model")),
    ):
        split = split_mesh(base, axis)
        assert (split.shape, split.axis_names) == (shape, names)
        i = base.axis_index(axis)
        for d in range(base.size):
            c, b = split.coords(d), base.coords(d)
            # the cfg coordinate is the major half of the split axis; the other coordinates are unchanged
            assert c[i] * (base.shape[i] // 2) + c[i + 1] == b[i]
            assert c[:i] + c[i + 2 :] == b[:i] + b[i + 1 :]
    with pytest.raises(PlanError, match="size 1"):
        split_mesh(parse_mesh("1x8"), "batch")


def test_split_profile_makes_ring_halves_lines():
    hw = get_profile("wh-galaxy")
    split = split_profile(hw, parse_mesh("8x4"), "batch")
    assert split.mesh_shape == (2, 4, 4)
    assert [split.axis(i, n).topology for i, n in enumerate(split.mesh_shape)] == ["line", "line", "ring"]
    assert split.axis(1, 4).links == hw.axes[0].links


def test_by_default_only_the_major_most_axis_is_halved(pair_graph):
    for mesh, names in (("2x4", ["off", "split(batch)", "sequential"]), ("1x8", ["off", "split(model)", "sequential"])):
        plan = plan_dit(pair_graph, parse_mesh(mesh), "wh-loudbox", memory_gb=0.00035)
        assert [o.name for o in plan.cfg_parallel.options] == names


def test_auto_takes_the_cheapest_option_and_records_all(pair_graph):
    plan = plan_dit(pair_graph, parse_mesh("2x4"), "wh-loudbox", memory_gb=0.00035, cfg_axes=("batch", "model"))
    c = plan.cfg_parallel
    assert c.mode == "auto" and c.batch == 2 and c.base_mesh == parse_mesh("2x4")
    assert [o.name for o in c.options] == ["off", "split(batch)", "split(model)", "sequential"]
    assert all(o.feasible for o in c.options[:3])
    assert not c.options[3].feasible and c.options[3].step_seconds  # priced, the caller's to run (test_cfg_sequential)
    best = min(c.options[:3], key=lambda o: (o.step_seconds, o.split_axis is not None))
    assert c.chosen == best.name
    assert plan.mesh == best.mesh and plan.user_mesh == parse_mesh("2x4")
    assert plan.predicted.step_seconds == best.step_seconds
    d = plan.decisions[0]
    assert d.node == "cfg-parallel" and d.strategy == c.chosen and d.cost == best.step_seconds
    runner = min((o for o in c.options[:3] if o.name != c.chosen), key=lambda o: o.step_seconds)
    assert d.rejected == runner.name and d.rejected_cost == runner.step_seconds >= d.cost


def test_split_plan_puts_cfg_on_the_batch_only(pair_graph):
    plan = plan_dit(pair_graph, parse_mesh("2x4"), "wh-loudbox", memory_gb=0.00035, cfg_parallel="on")
    assert plan.cfg_parallel.split and "cfg" in plan.mesh.axis_names
    assert not any("cfg" in entry_axes(e) for spec in plan.params.values() for e in spec)  # weights replicated over cfg
    assert not any("cfg" in c.axes for c in plan.collectives)  # the branches exchange nothing
    inputs = [a for a in plan.activations if a.location.op == "placeholder"]
    assert len(inputs) == 3 and all(a.spec[0] == "cfg" for a in inputs)  # latents, timestep, prompt embeddings
    for a in plan.activations:
        on_dim0 = "cfg" in [x for e in a.spec for x in entry_axes(e)]
        if a.shape and a.shape[0] == 2:
            assert entry_axes(a.spec[0])[:1] == ("cfg",), a  # every batch-carrying constraint: cfg major on dim 0
        else:
            assert not on_dim0, a  # e.g. the RoPE tables (1, L, 1, d)
    plan.check(pair_graph)


def test_memory_excludes_the_split_with_its_need(pair_graph):
    mesh = parse_mesh("2x4")
    with pytest.raises(PlanError) as info:
        plan_dit(pair_graph, mesh, "wh-loudbox", memory_gb=1e-6)
    assert "off:" in str(info.value) and "split(batch):" in str(info.value)
    # the smallest plans: off shards weights over all 8 devices, a split only over its 4 -> it needs more
    off_need = _need(pair_graph, mesh, "off")
    split_need = min(_need(pair_graph, mesh, "split(batch)"), _need(pair_graph, mesh, "split(model)"))
    assert split_need > off_need
    budget_gb = (off_need + split_need) / 2 / 1e9
    plan = plan_dit(pair_graph, mesh, "wh-loudbox", memory_gb=budget_gb)
    c = plan.cfg_parallel
    assert c.chosen == "off" and plan.mesh == mesh
    for o in c.options:
        if o.split_axis is None:
            continue
        assert not o.feasible and o.memory_needed_bytes > budget_gb * 1e9 and "no plan fits" in o.reason
    with pytest.raises(PlanError, match="cfg_parallel=on: no plan"):
        plan_dit(pair_graph, mesh, "wh-loudbox", memory_gb=budget_gb, cfg_parallel="on")


def _need(graph, mesh, name: str) -> int:
    from planner.autoplan import plan_graph
    from planner.cfg import CFG_AXIS
    from planner.plan import MemoryBudgetError

    try:
        if name == "off":
            plan_graph(graph, mesh, "wh-loudbox", memory_gb=1e-6)
        else:
            axis = name[len("split(") : -1]
            hw = split_profile(get_profile("wh-loudbox"), mesh, axis)
            plan_graph(graph, split_mesh(mesh, axis), hw, memory_gb=1e-6, batch_axes=(CFG_AXIS,))
    except MemoryBudgetError as e:
        return int(e.need_gb * 1e9)
    raise AssertionError("a 1e-6 GB budget fitted")


def test_without_hardware_plan_dit_prices_on_the_meshs_default_profile_as_plan_graph_does(single_graph):
    from planner.autoplan import plan_graph
    from planner.hardware import UnknownHardware, default_hardware

    mesh = parse_mesh("2x2")
    assert default_hardware(mesh) == "bh-quietbox"
    assert plan_dit(single_graph, mesh).hardware == plan_graph(single_graph, mesh).hardware == "bh-quietbox"
    with pytest.raises(UnknownHardware, match="unknown hardware profile 'wh-galaxyy'; choose one of"):
        plan_dit(single_graph, mesh, "wh-galaxyy")


def test_forcing_is_checked(pair_graph, single_graph):
    with pytest.raises(PlanError, match="batch is 1"):
        plan_dit(single_graph, parse_mesh("2x4"), "wh-loudbox", cfg_parallel="on")
    with pytest.raises(PlanError, match="has no axis to split in two"):
        plan_dit(pair_graph, MeshSpec((1, 1), ("batch", "model")), "wh-loudbox", cfg_parallel="on")
    with pytest.raises(PlanError, match="auto, on"):
        plan_dit(pair_graph, parse_mesh("2x4"), "wh-loudbox", cfg_parallel="maybe")
    off = plan_dit(pair_graph, parse_mesh("2x4"), "wh-loudbox", memory_gb=0.00035, cfg_parallel=False)
    assert off.cfg_parallel.chosen == "off" and off.mesh == parse_mesh("2x4") and len(off.cfg_parallel.options) == 3
    # batch 1 under auto: the ordinary plan, no record (plans of batch-1 graphs are unchanged)
    assert plan_dit(single_graph, parse_mesh("2x4"), "wh-loudbox").cfg_parallel is None


def test_the_record_round_trips_and_validates(pair_graph):
    from wancompile.report.schema import errors

    plan = plan_dit(pair_graph, parse_mesh("2x4"), "wh-loudbox", memory_gb=0.00035)
    data = json.loads(json.dumps(plan.to_json()))
    assert errors(data) == []
    back = Plan.from_json(data)
    assert back.cfg_parallel == plan.cfg_parallel and back.mesh == plan.mesh
    data["cfg_parallel"]["chosen"] = "split(nowhere)"
    with pytest.raises(PlanError, match="none of its options"):
        Plan.from_json(data)
    old = plan_dit(pair_graph, parse_mesh("2x4"), "wh-loudbox", memory_gb=0.00035, cfg_parallel="off").to_json()
    del old["cfg_parallel"]  # a plan written before CFG parallel existed
    assert Plan.from_json(old).cfg_parallel is None and errors(old) == []


def test_dumps_and_explain_show_both_costs(pair_graph, tmp_path):
    from wancompile.report import Report, write_dumps
    from wancompile.report.explain import explain

    plan = plan_dit(pair_graph, parse_mesh("2x4"), "wh-loudbox", memory_gb=0.00035)
    write_dumps(plan, tmp_path, graph=pair_graph)
    md = (tmp_path / "plan.md").read_text()
    assert "## CFG parallel" in md and "| cfg-parallel | **" in md
    for o in plan.cfg_parallel.options:
        assert f"| `{o.name}` | {o.mesh} (" in md and f"{o.step_seconds * 1e3:.3f}" in md
    assert "CFG parallel" in (tmp_path / "plan.html").read_text()
    text = explain(Report.load(tmp_path), "cfg-parallel")
    assert all(f"{o.step_seconds * 1e3:.3f} ms per step" in text for o in plan.cfg_parallel.options)


def test_hlo_axes_on_a_split_mesh():
    """Replica groups of a program on the split mesh name its sub-axes (device ids are the same)."""
    m3 = split_mesh(parse_mesh("2x4"), "model")  # (2, 2, 2) batch, cfg, model
    assert group_axes(((0, 1), (2, 3), (4, 5), (6, 7)), m3) == ("model",)
    assert group_axes(((0, 1, 4, 5), (2, 3, 6, 7)), m3) == ("batch", "model")
    m1 = split_mesh(parse_mesh("2x4"), "batch")  # (2, 1, 4) cfg, batch, model
    hlo = (
        "  %all-gather.1 = f32[1,48,16]{2,1,0} all-gather(%x), channel_id=1, replica_groups=[2,4]<=[8], "
        "dimensions={1}, use_global_device_ids=true"
    )
    assert [(c.kind, c.axes) for c in parse_collectives(hlo, m1)] == [("all-gather", ("model",))]


def test_option_parsing():
    from wancompile.options import Options, OptionsError

    assert Options.from_user({}, env={}).cfg_parallel == "auto"
    assert Options.from_user({"cfg_parallel": True}, env={}).cfg_parallel == "on"
    assert Options.from_user({}, env={"WANCOMPILE_CFG_PARALLEL": "0"}).cfg_parallel == "off"
    assert Options.from_user({"cfg_parallel": "off"}, env={"WANCOMPILE_CFG_PARALLEL": "on"}).cfg_parallel == "off"
    with pytest.raises(OptionsError, match="cfg_parallel"):
        Options.from_user({"cfg_parallel": "sometimes"}, env={})


def test_backend_plans_a_pair_split_and_matches_two_eager_forwards(spmd, tiny_model, tmp_path):
    """The backend's automatic path: a batch-2 graph gets the CFG choice, the program runs on the split mesh."""
    import torch

    from wancompile.models import transformer_inputs
    from wancompile.verify import numerics, run_with_backend

    cond = transformer_inputs("tiny", "tiny", 9, seed=1)
    uncond = {**cond, "encoder_hidden_states": transformer_inputs("tiny", "tiny", 9, seed=2)["encoder_hidden_states"]}
    pair = {k: torch.cat([cond[k], uncond[k]]) for k in cond}
    with torch.no_grad():
        eager = torch.cat([tiny_model(**cond, return_dict=False)[0], tiny_model(**uncond, return_dict=False)[0]])
    out, _, program = run_with_backend(
        tiny_model, pair, reference=False, mesh="2x4", memory_gb=0.00035, dump_dir=str(tmp_path)
    )
    c = program.plan.cfg_parallel
    assert c is not None and c.split and program.plan.mesh == c.option(c.chosen).mesh
    assert tuple(program.mesh.mesh_shape) == program.plan.mesh.shape
    assert tuple(program.mesh.axis_names) == program.plan.mesh.axis_names
    assert json.loads((tmp_path / "plan.json").read_text())["cfg_parallel"]["chosen"] == c.chosen
    result = numerics(out[0], eager)
    assert result.pcc >= 0.99999 and result.max_abs < 1e-5, result


def test_cli_plans_the_pair_and_refuses_forcing_a_single_forward(tmp_path, capsys):
    from wancompile.cli import main

    tiny = [*TINY_PLAN, "--hardware", "wh-loudbox", "--memory-gb", "0.00035"]
    assert main([*tiny, "--batch", "2", "--cfg-parallel", "on", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    data = json.loads((tmp_path / "plan.json").read_text())
    c = data["cfg_parallel"]
    assert c["mode"] == "on" and c["chosen"].startswith("split(") and "cfg" in data["mesh"]["axis_names"]
    assert f"CFG parallel (on): chosen {c['chosen']}" in out
    assert main([*tiny, "--cfg-parallel", "on", "--out", str(tmp_path / "single")]) == 2
    assert "needs the CFG pair as one forward of even batch" in capsys.readouterr().err
