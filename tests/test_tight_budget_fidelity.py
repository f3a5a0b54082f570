"""Predicted == compiled at the tightest budget the planner accepts (the ``need_gb`` of the
`MemoryBudgetError` a 1e-9 GB budget raises): weights FSDP-sharded, macros on different stream layouts,
so every reshard between them and every value they read from the prologue must be what GSPMD emits.

- A row-parallel product whose all-reduced sum the next macro reads through a copy split on the
  reduced axis: GSPMD emits the all-reduce and a slice, one reduce-scatter (`wancompile.hlo` reads it
  so), and the planner says reduce-scatter, both in the op rules and in the plan's stream edges.
- The tiny Wan DiT at 480p x 5 frames on 2x4 (attention head-TP(model)+SP(batch), FFN Megatron with
  the stream split on hidden over model): the attn2 output all-reduce is that reduce-scatter.
"""

import pytest
import torch

import wancompile
from planner.hardware import get_profile
from planner.mesh import parse_mesh
from planner.placements import Layout
from planner.propagate import evaluate
from wancompile.capture import annotate, capture_fx
from wancompile.verify import compare_collectives, numerics, run_with_backend

from conftest import assert_matches_prediction


def test_a_reduction_read_through_a_copy_split_on_its_axis_is_a_reduce_scatter():
    """``s + dropout(linear(x))`` with a row-parallel weight (input features over model): the sum is
    all-reduced and pinned whole; the add reads both operands through copies split on hidden over
    model. The all-reduce and the copy's slice are one reduce-scatter; read whole, an all-reduce."""
    lin = torch.nn.Linear(64, 64)
    graph = annotate(
        capture_fx(
            lambda x, s: s + torch.nn.functional.dropout(lin(x), 0.0, False),
            torch.randn(1, 24, 64),
            torch.randn(1, 24, 64),
        )
    )
    names = [n.name for n in graph if n.op == "placeholder"]
    x, s = "l_x_", "l_s_"
    weight, bias = (next(n for n in names if n.endswith(k)) for k in ("weight_", "bias_"))
    split, whole = Layout(((), ("batch",), ("model",))), Layout(((), ("batch",), ()))
    boundary = {x: (split,), s: (whole,), weight: (Layout(((), ("model",))),), bias: (Layout(((),)),)}
    forced = {"linear": whole, "dropout": whole}
    mesh, hw = parse_mesh("2x4"), get_profile("wh-loudbox")
    read_whole = evaluate(graph, list(graph), mesh, hw, boundary=boundary, forced=forced)
    copies = {("add", 0): split, ("add", 1): split}
    read_split = evaluate(graph, list(graph), mesh, hw, boundary=boundary, forced=forced, forced_inputs=copies)
    assert [(e.kind, e.axes) for e in read_whole.events] == [("all-reduce", ("model",))]
    assert [(e.kind, e.axes) for e in read_split.events] == [("reduce-scatter", ("model",))]
    assert "add" not in read_split.scattered  # the add's own output is no part of the pair: it stays pinned


@pytest.mark.slow
@pytest.mark.usefixtures("spmd")
def test_tiny_dit_480p_at_its_tightest_budget_compiles_to_its_prediction():
    from wancompile.models import build_transformer, transformer_inputs

    model, inputs = build_transformer("tiny"), transformer_inputs("tiny", "480p", 5)
    with torch.no_grad():
        eager = model(**inputs, return_dict=False)[0]
    with pytest.raises(wancompile.MemoryBudgetError) as e:
        run_with_backend(model, inputs, reference=False, mesh="2x4", memory_gb=1e-9)
    out, _, program = run_with_backend(model, inputs, reference=False, mesh="2x4", memory_gb=e.value.need_gb)
    assert numerics(out, eager).pcc >= 0.99999
    assert any("FSDP" in d.strategy for d in program.plan.decisions)
    assert any(c.kind == "reduce-scatter" for c in program.plan.collectives)
    matches = compare_collectives(program.plan.collectives, program.collectives())
    assert_matches_prediction([vars(m) for m in matches], "tiny 480p x 5, tightest budget")
