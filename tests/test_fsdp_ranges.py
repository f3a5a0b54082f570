"""FSDP per block range: a block macro's blocks may differ in FSDP, so only as many blocks as memory
needs pay the weight gathers (`planner.ilp`, variables (e)); the others keep the plain option.

- The ILP: one group of 10 blocks, an option and its FSDP twin; the budget decides how many blocks
  run the twin (none, some, or the twin itself for all), and a caller can fix that number.
- The tiny DiT on 2x4, each block macro restricted to the seed's option and its +FSDP twin, at a
  budget between the two plans' minima: the plan runs the twin on the last blocks of one macro,
  writes those blocks' weights FSDP-split and the others not, fits the budget, costs less than
  FSDP on every block, says so in its decisions (JSON, plan.md, explain) and compiles on 2x4 to
  exactly its predicted collectives with eager's numbers.
"""

from __future__ import annotations

import re

import pytest
import torch

from planner import plan_graph
from planner.ilp import Group, Option, solve
from planner.mesh import parse_mesh
from planner.plan import Decision, MemoryBudgetError, PlanError

N = 10  # blocks of the synthetic group
PLAIN = Option("plain", "k", cost_ns=10, param_kib=N * 100, act_kib=5)
TWIN = Option("plain+FSDP", "k", cost_ns=15, param_kib=N * 20, act_kib=5)


def _group(**kw) -> Group:
    return Group("ffn", (PLAIN, TWIN), N, twins=((0, 1),), **kw)


@pytest.mark.parametrize(
    "budget_kib, choice, on_twin, objective_ns",
    [
        (N * 100 + 5, 0, 0, N * 10),  # everything fits: no block pays the gathers
        (600 + 5, 0, 5, N * 10 + 5 * 5),  # 400 KiB to shed at 80 a block: the last 5 blocks
        (601 + 5, 0, 5, N * 10 + 5 * 5),  # 399 to shed: still 5 (blocks are whole)
        (280 + 5, 0, 9, N * 10 + 9 * 5),
        (N * 20 + 5, 1, 0, N * 15),  # only all blocks on the twin fit: the twin itself, no block count
    ],
)
def test_the_ilp_runs_the_twin_on_as_many_blocks_as_memory_needs(budget_kib, choice, on_twin, objective_ns):
    res = solve([_group()], [], memory_kib=budget_kib)
    assert (res.choice["ffn"], res.blocks_on_twin("ffn"), res.objective_ns) == (choice, on_twin, objective_ns)


def test_a_fixed_block_count_is_kept_and_checked_against_memory():
    res = solve([_group(twin_blocks=7)], [], memory_kib=N * 100 + 5)
    assert (res.choice["ffn"], res.blocks_on_twin("ffn")) == (0, 7)
    from planner.ilp import Infeasible

    with pytest.raises(Infeasible):
        solve([_group(twin_blocks=2)], [], memory_kib=600 + 5)  # 5 blocks must shed


# --- the tiny DiT ----------------------------------------------------------------------------------

LAYERS = 4
SEED = {"attn1": "head-TP(model)+SP(batch)", "attn2": "head-TP(model)+SP(batch)", "ffn": "Megatron(model)+SP(batch)"}


def _only(fsdp: str) -> dict[str, str]:
    """Each block macro restricted to the seed's option: `fsdp` "" (it alone), "+FSDP" (its twin
    alone) or "(\\+FSDP)?" (either, blocks may differ); the embedders to Megatron(model)."""
    out = {k: "^" + re.escape(v) + fsdp + "$" for k, v in SEED.items()}
    out.update({f"condition_embedder.{e}_embedder": r"^Megatron\(model\)$" for e in ("time", "text")})
    return out


@pytest.fixture(scope="module")
def tiny4():
    from wancompile.capture import capture_module
    from wancompile.models import build_transformer, transformer_inputs

    model, inputs = build_transformer("tiny", num_layers=LAYERS), transformer_inputs("tiny", "480p", 5)
    graph, _ = capture_module(model, **inputs, return_dict=False, model="tiny")
    return model, inputs, graph


def _need_gb(graph, only) -> float:
    with pytest.raises(MemoryBudgetError) as e:
        plan_graph(graph, parse_mesh("2x4"), "wh-loudbox", only=only, memory_gb=1e-9)
    return e.value.need_gb


@pytest.fixture(scope="module")
def mixed(tiny4):
    """(plan, budget GB): the tiny DiT at a budget halfway between the smallest plan without FSDP
    and the smallest with FSDP on every block."""
    _, _, graph = tiny4
    budget = (_need_gb(graph, _only("")) + _need_gb(graph, _only(r"\+FSDP"))) / 2
    return plan_graph(graph, parse_mesh("2x4"), "wh-loudbox", only=_only(r"(\+FSDP)?"), memory_gb=budget), budget


def test_only_the_last_blocks_of_a_macro_run_fsdp_and_the_plan_fits(tiny4, mixed):
    _, _, graph = tiny4
    plan, budget = mixed
    ranged = [d for d in plan.decisions if d.fsdp_blocks is not None]
    assert ranged, [(d.macro, d.strategy) for d in plan.decisions]
    for d in ranged:
        first, stop = d.fsdp_blocks
        assert 0 < first < stop == LAYERS and d.fsdp and not d.strategy.endswith("FSDP")
        assert d.fsdp_strategy == SEED[d.macro] + "+FSDP"
        weights = [k for k in plan.params if re.fullmatch(rf"blocks\.0\.{d.macro}\..*weight", k) and "norm" not in k]
        for w in weights:
            specs = [plan.params[w.replace("blocks.0.", f"blocks.{b}.")] for b in range(LAYERS)]
            split_on_batch = ["batch" in str(s) for s in specs]
            assert split_on_batch == [first <= b for b in range(LAYERS)], (w, specs)
    assert plan.predicted.memory_bytes_per_device <= budget * 1e9
    everywhere = plan_graph(graph, parse_mesh("2x4"), "wh-loudbox", only=_only(r"\+FSDP"), memory_gb=budget)
    assert plan.predicted.step_seconds < everywhere.predicted.step_seconds
    assert plan.predicted.comm_seconds < everywhere.predicted.comm_seconds


def test_the_range_is_data_in_the_plan_dump_and_in_words_in_plan_md_and_explain(mixed, tmp_path):
    from planner.plan import load_plan, save_plan
    from wancompile.report.explain import explain
    from wancompile.report.markdown import render_markdown
    from wancompile.report.model import Report

    plan, _ = mixed
    d = next(d for d in plan.decisions if d.fsdp_blocks is not None)
    assert Decision.from_json(d.to_json()) == d
    assert load_plan(save_plan(plan, tmp_path / "p.json")).decisions == plan.decisions
    first, stop = d.fsdp_blocks
    words = f"blocks {first}..{stop - 1} run" if stop - first > 1 else f"block {first} runs"
    words += f" `{d.fsdp_strategy}`"
    rep = Report(plan)
    assert words in render_markdown(rep)
    assert words in explain(rep, d.macro)


def test_price_plan_prices_each_block_range_with_its_own_decisions_as_the_planner_did(tiny4, mixed):
    """`price_plan` of the plan with an FSDP block range is the planner's own prediction: the blocks of
    the range pay their weight gathers (block 0 does not stand for them). Memory: the weights of every
    block and the largest live set of the blocks are the planner's figure; `price_plan` also counts
    the prologue's and epilogue's live sets, which the planner's memory model leaves out."""
    from planner.autoplan import evaluate_forward, price_plan
    from planner.pricing import activation_bytes

    _, _, graph = tiny4
    plan, _ = mixed
    priced, want = price_plan(graph, plan, "wh-loudbox"), plan.predicted
    assert priced.step_seconds == pytest.approx(want.step_seconds, rel=1e-9)
    assert priced.compute_seconds == pytest.approx(want.compute_seconds, rel=1e-9)
    assert priced.comm_seconds == pytest.approx(want.comm_seconds, rel=1e-9)
    fwd = evaluate_forward(graph, plan, "wh-loudbox")
    blocks = max(activation_bytes(ev) for ev, _ in fwd.parts[1:-1])
    assert int(fwd.weight_bytes + blocks) == want.memory_bytes_per_device
    ends = max(activation_bytes(ev) for ev, _ in (fwd.parts[0], fwd.parts[-1]))
    assert priced.memory_bytes_per_device == int(fwd.weight_bytes + max(blocks, ends))
    (d,) = [d for d in plan.decisions if d.fsdp_blocks is not None]
    assert [times for _, times in fwd.parts[1:-1]] == [d.fsdp_blocks[0], d.fsdp_blocks[1] - d.fsdp_blocks[0]]


def test_fsdp_blocks_given_by_the_caller_are_checked(tiny4):
    _, _, graph = tiny4
    mesh = parse_mesh("2x4")
    fixed = plan_graph(graph, mesh, "wh-loudbox", only=_only(r"(\+FSDP)?"), fsdp_blocks={"ffn": 1})
    assert next(d for d in fixed.decisions if d.macro == "ffn").fsdp_blocks == (LAYERS - 1, LAYERS)
    for bad, message in (
        ({"ffn": LAYERS}, r"give 0 \.\. 3 blocks on the FSDP twin"),
        ({"norm_out": 1}, "not a block macro"),
    ):
        with pytest.raises(PlanError, match=message):
            plan_graph(graph, mesh, "wh-loudbox", only=_only(r"(\+FSDP)?"), fsdp_blocks=bad)
    with pytest.raises(PlanError, match="has an FSDP twin"):
        plan_graph(graph, mesh, "wh-loudbox", only=_only(""), fsdp_blocks={"ffn": 1})


@pytest.mark.slow
@pytest.mark.usefixtures("spmd")
def test_a_plan_with_an_fsdp_block_range_compiles_to_its_prediction(tiny4, mixed, tmp_path):
    from planner.plan import save_plan
    from wancompile.verify import compare_collectives, numerics, run_with_backend

    from conftest import assert_matches_prediction

    model, inputs, _ = tiny4
    plan, _ = mixed
    with torch.no_grad():
        eager = model(**inputs, return_dict=False)[0]
    path = save_plan(plan, tmp_path / "mixed.plan.json")
    out, _, program = run_with_backend(model, inputs, reference=False, mesh="2x4", plan=str(path))
    result = numerics(out[0], eager)
    assert result.pcc >= 0.99999 and result.max_abs < 1e-4, result
    matches = compare_collectives(program.plan.collectives, program.collectives())
    gathers = next(m for m in matches if (m.kind, m.axes) == ("all-gather", ("batch",)))
    ranged = [d for d in plan.decisions if d.fsdp_blocks is not None]
    assert gathers.predicted_count > 0 and ranged
    assert_matches_prediction([vars(m) for m in matches], f"tiny {LAYERS} blocks, FSDP on a block range")
