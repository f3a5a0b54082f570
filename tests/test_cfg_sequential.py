"""CFG as two batch-1 forwards (planner.cfg ``sequential``), and the batch of a CFG pair carried as a dot dim.

Under the cost model, ``cfg_parallel="auto"`` is never slower than running cond and uncond as two batch-1
forwards on the whole mesh (what WanPipeline does without CFG batching, tt-metal's scheme): that option is
priced (the batch-1 plan's step twice, its memory) and chosen where the caller can run it. And the batch-2
plan on the whole mesh pays about twice the batch-1 forward, sequence parallelism included: the products
keep the batch as a free dim (`planner.rules.matmul.keeps_leading_dims`, `wancompile.legalize`). The
compiled checks of that (predicted = compiled collectives, numerics) are tests/test_cfg_fidelity.py's
``*/off`` cases.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from planner.autoplan import plan_graph
from planner.cfg import NOT_RUN_BY_CALLER, CfgSequential, plan_dit, runs_as_two_forwards
from planner.mesh import parse_mesh

from conftest import meta_graph

# relative. ``sequential`` is priced on the batch-2 graph (planner.cfg.sequential_mesh): each forward also pays
# the local slice of its branch from the batch-2 inputs (measured: 5 ns of 0.6 ms on the tiny DiT, 4.5 us of
# 0.96 s per forward for A14B 480p on Galaxy), which two calls of batch 1 do not.
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def pair_graph(tiny_model):
    from wancompile.capture import capture_module
    from wancompile.models import transformer_inputs

    inputs = transformer_inputs("tiny", "tiny", 9, batch=2)
    return capture_module(tiny_model, **inputs, return_dict=False, model="wan-dit")[0]


def _decide(graph, mesh, hw, **kwargs):
    """The CFG record of an ``auto`` plan where the caller can run two forwards, and the plan (None when
    two batch-1 forwards won: the plan decides ``sequential``, `runs_as_two_forwards`)."""
    plan = plan_dit(graph, parse_mesh(mesh), hw, cfg_parallel="auto", cfg_pair_splittable=True, **kwargs)
    return plan.cfg_parallel, None if runs_as_two_forwards(plan) else plan


@pytest.mark.parametrize("mesh,budget", [("2x4", 0.00035), ("2x4", 0.00025), ("8x4", 0.00025)])
def test_sequential_is_the_batch1_plan_twice(pair_graph, tiny_capture, mesh, budget):
    one = plan_graph(tiny_capture[0], parse_mesh(mesh), "wh-loudbox", memory_gb=budget).predicted
    c, _ = _decide(pair_graph, mesh, "wh-loudbox", memory_gb=budget)
    seq = c.option("sequential")
    assert seq.mesh == parse_mesh(mesh) and seq.split_axis is None and seq.feasible
    assert seq.step_seconds == pytest.approx(2 * one.step_seconds, rel=TOLERANCE)
    assert seq.memory_bytes_per_device == one.memory_bytes_per_device


@pytest.mark.parametrize("mesh,budget", [("2x4", 0.00035), ("2x4", 0.00025), ("8x4", 0.00025), ("8x4", None)])
def test_auto_is_never_slower_than_two_batch1_forwards_and_lists_every_price(pair_graph, tiny_capture, mesh, budget):
    two = 2 * plan_graph(tiny_capture[0], parse_mesh(mesh), "wh-loudbox", memory_gb=budget).predicted.step_seconds
    c, plan = _decide(pair_graph, mesh, "wh-loudbox", memory_gb=budget)
    chosen = c.option(c.chosen)
    assert chosen.step_seconds <= two * (1 + TOLERANCE)
    assert all(chosen.step_seconds <= o.step_seconds for o in c.options if o.feasible)
    assert [o.name for o in c.options] == ["off", "split(batch)", "sequential"]
    assert all(o.step_seconds is not None or o.reason for o in c.options)  # a price, or why none
    if plan is not None:  # a batch-2 plan won: its decision names every runnable option with its price
        d = plan.decisions[0]
        assert d.strategy == c.chosen and {o.name for o in d.options} == {o.name for o in c.options if o.feasible}
        assert plan.predicted.step_seconds == chosen.step_seconds


def test_where_no_batch2_plan_fits_auto_runs_two_forwards(pair_graph, tiny_capture):
    mesh = parse_mesh("2x4")
    from planner.plan import MemoryBudgetError

    # a budget between the batch-1 plan's smallest need and the batch-2 plans'
    with pytest.raises(MemoryBudgetError) as one:
        plan_graph(tiny_capture[0], mesh, "wh-loudbox", memory_gb=1e-6)
    with pytest.raises(MemoryBudgetError) as two:
        plan_graph(pair_graph, mesh, "wh-loudbox", memory_gb=1e-6)
    assert one.value.need_gb < two.value.need_gb
    budget = (one.value.need_gb + two.value.need_gb) / 2
    plan = plan_dit(pair_graph, mesh, "wh-loudbox", memory_gb=budget, cfg_pair_splittable=True)
    assert runs_as_two_forwards(plan)  # a decision in the plan, not an error
    c = plan.cfg_parallel
    assert c.chosen == "sequential" and c.option("sequential").feasible
    assert "two batch-1 forwards" in str(CfgSequential.of(plan))  # what the backend answers its caller
    assert not c.option("off").feasible and "no plan fits" in c.option("off").reason


def test_without_a_caller_that_splits_the_pair_sequential_is_priced_not_taken(pair_graph):
    plan = plan_dit(pair_graph, parse_mesh("2x4"), "wh-loudbox", memory_gb=0.00035)
    seq = plan.cfg_parallel.option("sequential")
    assert seq.step_seconds is not None and not seq.feasible and seq.reason == NOT_RUN_BY_CALLER
    assert plan.cfg_parallel.chosen != "sequential"
    assert ("sequential", NOT_RUN_BY_CALLER) in [(e.option, e.reason) for e in plan.decisions[0].excluded]
    # "off" and "on" never take it
    for mode in ("off", "on"):
        assert plan_dit(pair_graph, parse_mesh("2x4"), "wh-loudbox", memory_gb=0.00035, cfg_parallel=mode,
                        cfg_pair_splittable=True).cfg_parallel.chosen != "sequential"  # fmt: skip


def test_the_unsplit_pair_keeps_sequence_parallel(pair_graph):
    """Tokens split under the whole batch of 2 reach every projection without a gather (the rule's side of
    `keeps_leading_dims`): the "off" plan uses SP, as the batch-1 plan does."""
    plan = plan_dit(pair_graph, parse_mesh("2x4"), "wh-loudbox", memory_gb=0.00035, cfg_parallel="off")
    assert any("SP(" in d.strategy for d in plan.decisions)


@pytest.mark.parametrize("shape,mask", [((2, 2, 48, 16), None), ((2, 2, 48, 16), "bool"), ((2, 2, 48, 16), "add")])
def test_the_unflattened_forms_equal_the_ops(shape, mask):
    from wancompile.legalize import linear_unflattened, sdpa_unflattened

    torch.manual_seed(0)
    x, w, b = torch.randn(2, 48, 32), torch.randn(24, 32), torch.randn(24)
    assert (linear_unflattened(x, w, b) - F.linear(x, w, b)).abs().max() <= 1e-5
    q, k, v = (torch.randn(shape) for _ in range(3))
    m = None
    if mask == "bool":
        m = torch.rand(shape[0], 1, shape[2], shape[2]) > 0.3
        m[..., 0] = True  # no fully masked row
    elif mask == "add":
        m = torch.randn(shape[0], 1, shape[2], shape[2])
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    assert (sdpa_unflattened(q, k, v, attn_mask=m) - ref).abs().max() <= 1e-5


@pytest.fixture(scope="module")
def a14b_480p():
    """Wan 2.2 T2V-A14B 480p, 81 frames, on meta (2 blocks, planned for 40): the batch-1 and batch-2 graphs."""
    a14b = dict(layers=2, dtype=torch.bfloat16)
    return meta_graph("wan2.2-t2v-a14b", "480p", 81, **a14b), meta_graph("wan2.2-t2v-a14b", "480p", 81, batch=2, **a14b)


@pytest.mark.parametrize("mesh,hw", [("2x4", "wh-loudbox"), ("8x4", "wh-galaxy")])
def test_full_size_a14b_auto_is_never_slower_than_two_batch1_forwards(a14b_480p, mesh, hw):
    """Both experts resident (the A14B pipeline's budget)."""
    g1, g2 = a14b_480p
    kwargs = dict(num_blocks=40, weight_sets=2)
    two = 2 * plan_graph(g1, parse_mesh(mesh), hw, **kwargs).predicted.step_seconds
    c, _ = _decide(g2, mesh, hw, **kwargs)
    assert c.option(c.chosen).step_seconds <= two * (1 + TOLERANCE)
    assert c.option("sequential").step_seconds == pytest.approx(two, rel=TOLERANCE)
    off = c.option("off")  # the batch carried as a dot dim: the unsplit pair is about two batch-1 forwards
    assert off.feasible and off.step_seconds <= 1.05 * two


def test_the_pipeline_runs_two_forwards_when_auto_chooses_them():
    """compile_pipeline's CFG wrapper under "auto" compiles the batch-2 forward with the backend option
    ``cfg_pair_splittable`` (the request's field: the caller can run the pair as two forwards); when the plan
    decides that (`runs_as_two_forwards`), the backend answers `CfgSequential` carrying the plan, and every later
    step runs cond and uncond as diffusers does. Under "on" the option is not given."""
    import numpy as np

    from wancompile.models import build_tiny_pipeline, tiny_pipeline_inputs
    from wancompile.pipeline import CFGBatched, _capture_negative_prompt, _CFGState

    class Planner(torch.nn.Module):  # stands in for the compiled transformer: the batch-2 plan's decision
        def __init__(self, module, plan, splittable):
            super().__init__()
            self.module, self.plan, self.splittable, self.calls = module, plan, splittable, []

        def forward(self, hidden_states, *args, **kwargs):
            self.calls.append((hidden_states.shape[0], self.splittable))
            if hidden_states.shape[0] == 2 and self.splittable:
                raise CfgSequential("two batch-1 forwards win", self.plan)
            return self.module(hidden_states, *args, **kwargs)

    def run(pipe):
        with torch.no_grad():
            return np.asarray(pipe(**tiny_pipeline_inputs(pipe, seed=0, steps=3), output_type="latent").frames)

    pipe = build_tiny_pipeline(two_experts=False)
    pipe.set_progress_bar_config(disable=True)
    ref = run(pipe)
    from planner.plan import CfgOption, CfgParallel, Plan

    mesh = parse_mesh("2x4")
    record = CfgParallel("auto", "sequential", mesh, 2, (CfgOption("sequential", mesh, step_seconds=1.0),))
    plan = Plan("wan-dit", mesh, {}, cfg_parallel=record)
    assert runs_as_two_forwards(plan)
    for mode in ("auto", "on"):
        cfg, inner = _CFGState(mode), Planner(pipe.transformer, plan, splittable=mode == "auto")
        _capture_negative_prompt(pipe, cfg)
        original, pipe.transformer = pipe.transformer, CFGBatched(inner, pipe.transformer, cfg)
        try:
            out = run(pipe)
        finally:
            pipe.transformer = original
            del pipe.__dict__["encode_prompt"]
        if mode == "auto":
            assert cfg.unbatched == "two batch-1 forwards win" and cfg.batched == 0
            assert inner.calls == [(2, True)] + [(1, True)] * 6  # then 3 steps x (cond, uncond)
            assert np.array_equal(out, ref)
        else:
            assert cfg.unbatched is None and cfg.batched == 3 and inner.calls == [(2, False)] * 3
            assert np.allclose(out, ref, atol=1e-5)
