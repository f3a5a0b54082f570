"""The cost model held against published timings: the pieces a calibration row is priced from add up to
what the planner prices, overlaps cost the larger of transfer and compute, the fit finds factors that
generated the data, and the Tenstorrent profiles carry the fitted factors."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from planner import calibration as C
from planner.autoplan import price_plan
from planner.cost_model import ring_attention_seconds
from planner.hand_plans import tt_xla_plan
from planner.hardware import PROFILES, PROVENANCE, get_profile
from planner.mesh import parse_mesh

from conftest import meta_graph

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def a14b():
    return meta_graph("wan2.2-t2v-a14b", "480p", 81, layers=2, dtype=torch.bfloat16)


FACTORS = C.Factors(compute_efficiency=0.35, link_efficiency=0.2, op_overhead=5e-6)


@pytest.mark.parametrize("stack", ["tt-xla", "tt-metal"])
def test_a_forward_taken_apart_adds_up_to_the_planner_price(a14b, stack):
    """Without overlap, the terms of one forward under any factors are exactly `price_plan` on the
    profile that carries those factors: the calibration prices what the planner prices."""
    hw = get_profile("wh-loudbox")
    mesh = parse_mesh("2x4")
    plan = tt_xla_plan(a14b, mesh)
    no_overlap = replace(C.STACKS[stack], ring_attention=False, fused_matmul_collectives=False)
    terms = C.forward_terms(a14b, plan, hw, no_overlap, C.Scheme(stack, 0, 1), num_blocks=40)
    assert not terms.overlaps
    priced = C.calibrated(replace(hw, fuses_glue=no_overlap.fuses_glue), FACTORS, "test")
    expected = price_plan(a14b, plan, priced, num_blocks=40).step_seconds
    assert terms.seconds(FACTORS) == pytest.approx(expected, rel=1e-9)


def test_priced_by_what_ttnn_runs_a_block_launches_ttnn_s_kernels_and_pays_for_its_moves(a14b):
    """The TTNN pricing (`PRICINGS` "ttnn") of tt-xla's hand plan on a WH LoudBox: a block's launches are the kernels
    tt-mlir runs (`planner.ttnn_kernels`: 40 blocks of them, its reshapes, permutes and layout copies among them,
    where the planner-op pricing launches one kernel per op that moves data and none per view), and its data
    movement costs its DRAM round trips at the move efficiency: at half the efficiency exactly the move term
    more. The roofline and the collectives are priced as before; tt-metal's fused kernels are not priced so."""
    from planner.ttnn_kernels import plan_kernels

    hw, plan, scheme = get_profile("wh-loudbox"), tt_xla_plan(a14b, parse_mesh("2x4")), C.Scheme("tt-xla", 0, 1)
    ops = C.forward_terms(a14b, plan, hw, C.STACKS["tt-xla"], scheme, 40)
    ttnn = C.forward_terms(a14b, plan, hw, C.STACKS["tt-xla"], scheme, 40, "ttnn")
    block = plan_kernels(a14b, plan, 40)[0]
    assert ops.move_s == 0 and ttnn.move_s == pytest.approx(40 * 2 * block.move_bytes / float(hw.dram_bw))
    assert (ttnn.roofline_s, ttnn.latency_s, ttnn.transfer_s) == (ops.roofline_s, ops.latency_s, ops.transfer_s)
    assert ttnn.kernels - ops.kernels > 40 * block.move * 0.5  # the moves are launches now
    half = replace(FACTORS, move_efficiency=0.5)
    assert ttnn.seconds(half) - ttnn.seconds(FACTORS) == pytest.approx(ttnn.move_s)
    metal = C.forward_terms(a14b, plan, hw, C.STACKS["tt-metal"], scheme, 40, "ttnn")
    assert (
        metal.move_s == 0 and metal.kernels == C.forward_terms(a14b, plan, hw, C.STACKS["tt-metal"], scheme, 40).kernels
    )


def test_the_audit_is_fitted_only_where_data_movement_is_priced():
    """tt-xla's PERF_AUDIT (one block of A14B at 480p on 4 Blackhole chips, 1.031 s warm) profiled data movement at
    over a third of the device time: the planner-op pricing, which prices views free, cannot see that and leaves
    the row out of its fit; the TTNN pricing fits it. A row no pricing sees (the SP padding's slices) stays out."""
    audit = next(r for r in C.PUBLISHED if r.source == C.AUDIT.source)
    assert (audit.system, audit.mesh, audit.num_blocks, audit.published_s) == ("bh-quietbox", "1x4", 1, 1.031)
    assert not audit.fitted and audit.fitted_under("ttnn") and audit.unseen
    assert C.AUDIT.share("move") > 1 / 3 and C.AUDIT.classes["fused"].count == 2  # two attention calls a block
    assert all(r.fitted_under("ttnn") == (r.fitted or r is audit) for r in C.PUBLISHED)


def test_tt_metal_hides_the_kv_gathers_under_ring_attention_and_the_tp_collectives_under_matmuls(a14b):
    """tt-metal's scheme on a WH LoudBox (SP on the 2-axis, TP on the 4-axis, FSDP): every block's self-
    attention is one ring site (K and V together) and every TP all-gather / reduce-scatter is fused
    into the matmul it feeds or comes from; the same plan under tt-xla overlaps nothing."""
    row = C.PUBLISHED[0]
    assert (row.system, row.mesh, row.scheme.stack) == ("wh-loudbox", "2x4", "tt-metal")
    hw = get_profile(row.system)
    plan = C.scheme_plan(a14b, row, C.neutral(hw, C.STACKS["tt-metal"]))
    assert {d.strategy for d in plan.decisions if d.in_block} == {
        "head-TP(model)+SP(batch)+FSDP+hidden(model)",
        "Megatron(model)+SP(batch)+FSDP+hidden(model)",
    }
    metal = C.forward_terms(a14b, plan, hw, C.STACKS["tt-metal"], row.scheme, num_blocks=40)
    rings = [o for o in metal.overlaps if o.kind == "ring"]
    assert len(rings) == 1 and rings[0].times == 40 and rings[0].n == 2  # attn1's SDPA, in every block
    fused = [o for o in metal.overlaps if o.kind == "fused"]
    assert fused and all(o.times == 40 for o in fused)
    xla = C.forward_terms(a14b, plan, hw, C.STACKS["tt-xla"], row.scheme, num_blocks=40)
    assert not xla.overlaps
    # overlap only ever hides work: the tt-metal forward is cheaper than the same plan without it,
    # and costs at least its compute
    assert metal.seconds(FACTORS) < xla.seconds(FACTORS) - (xla.kernels - metal.kernels) * FACTORS.op_overhead
    compute = metal.roofline_s + sum(o.compute_s * o.times for o in metal.overlaps)
    assert metal.seconds(FACTORS) >= compute / FACTORS.compute_efficiency


@pytest.mark.parametrize("transfer", [0.001, 0.01, 0.1])
def test_a_ring_step_costs_the_larger_of_its_transfer_and_its_attention(transfer):
    attention, n = 0.08, 8
    expected = attention / n + (n - 1) * max(attention / n, transfer)
    assert ring_attention_seconds(attention, transfer, n) == pytest.approx(expected)
    site = C.Overlap("ring", compute_s=attention, latency_s=0.0, transfer_s=transfer, n=n, times=1)
    assert site.seconds(C.Factors(1.0, 1.0, 0.0)) == pytest.approx(expected)
    # fully hidden transfers cost nothing beyond the attention; exposed ones cost their own time
    assert ring_attention_seconds(attention, 0.0, n) == pytest.approx(attention)
    assert ring_attention_seconds(attention, 1.0, n) > (n - 1) * 1.0


def _synthetic(rows_terms, truth: dict[str, C.Factors]) -> list[C.Priced]:
    out = []
    for i, (stack, terms) in enumerate(rows_terms):
        scheme = C.Scheme(stack, 0, 1)
        published = terms.seconds(truth[stack])
        row = C.Row("synthetic", "wh-galaxy", "8x4", "480p", f"row {i}", published, scheme, 1)
        out.append(C.Priced(row, (("denoising", terms, 1.0),)))
    return out


def test_the_fit_recovers_the_factors_that_made_the_timings():
    """Timings generated from known factors (a shared compute efficiency and overhead, a link efficiency
    per stack) are fitted back to those factors, and every held-out row is predicted within the grid's
    resolution."""
    truth = {"tt-metal": C.Factors(0.42, 0.6, 4e-6), "tt-xla": C.Factors(0.42, 0.12, 4e-6)}
    terms = [
        ("tt-metal", C.Terms(roofline_s=1.0, kernels=800, latency_s=0.01, transfer_s=0.3)),
        ("tt-metal", C.Terms(roofline_s=0.2, kernels=800, latency_s=0.01, transfer_s=0.4)),
        ("tt-metal", C.Terms(roofline_s=0.5, kernels=900, latency_s=0.02, transfer_s=0.05)),
        ("tt-xla", C.Terms(roofline_s=2.0, kernels=3000, latency_s=0.01, transfer_s=3.0)),
        ("tt-xla", C.Terms(roofline_s=0.4, kernels=3000, latency_s=0.01, transfer_s=0.2)),
        ("tt-xla", C.Terms(roofline_s=1.0, kernels=3100, latency_s=0.01, transfer_s=1.0)),
    ]
    priced = _synthetic(terms, truth)
    fit = C.fit(priced)
    for stack, f in truth.items():
        got = fit.factors[stack]
        assert got.compute_efficiency == pytest.approx(f.compute_efficiency, rel=0.05)
        assert got.link_efficiency == pytest.approx(f.link_efficiency, rel=0.05)
    assert fit.rms_log_error < 0.03
    for p, predicted in C.leave_one_out(priced):
        assert predicted == pytest.approx(p.row.published_s, rel=0.1)


def test_a_row_the_model_cannot_see_stays_out_of_the_fit():
    truth = {"tt-xla": C.Factors(0.4, 0.1, 4e-6)}
    terms = [("tt-xla", C.Terms(roofline_s=r, kernels=100, transfer_s=t)) for r, t in ((1, 1), (2, 0.5), (0.5, 2))]
    priced = _synthetic(terms, truth)
    odd = replace(priced[0].row, published_s=priced[0].row.published_s * 3, unseen="a kernel the model has no term for")
    priced.append(C.Priced(odd, priced[0].pieces))
    fit = C.fit(priced)
    assert fit.factors["tt-xla"].compute_efficiency == pytest.approx(0.4, rel=0.05)
    (_, held_out) = C.leave_one_out(priced)[-1]
    assert held_out == pytest.approx(odd.published_s / 3, rel=0.05)


def test_tenstorrent_profiles_carry_the_fitted_factors_and_every_figure_says_how_it_is_known():
    data = json.loads(C.CALIBRATION_FILE.read_text())
    fitted = data["factors"]["tt-xla"]
    for p in PROFILES.values():
        for name, fig in p.figures().items():
            assert fig.kind in PROVENANCE, (p.name, name)
            assert fig.source, (p.name, name)
        if p.vendor == "tenstorrent":
            assert not p.fuses_glue
            assert float(p.efficiency) == fitted["compute_efficiency"] and p.efficiency.kind == "fitted"
            assert float(p.link_efficiency) == fitted["link_efficiency"] and p.link_efficiency.kind == "fitted"
            assert float(p.op_overhead) == fitted["op_overhead"]
    assert min(C.OVERHEAD_GRID) >= 2.2e-6 and max(C.OVERHEAD_GRID) <= 9e-6  # tt-metal #12074's range


def test_load_reads_the_committed_fit_per_stack_as_the_writer_wrote_it_and_the_profiles_use_it():
    """`load` returns what bench_calibration.py --write puts in the file: a `Fit` with each stack's
    `Factors` (written as ``vars(factors)``) and the RMS log error; the Tenstorrent profiles carry
    the calibrated stack's factors from it, figure for figure."""
    from planner.hardware import CALIBRATED_STACK

    data = json.loads(C.CALIBRATION_FILE.read_text())
    fit = C.load()
    assert isinstance(fit, C.Fit) and set(fit.factors) == set(data["factors"]) == set(C.STACKS)
    for stack, f in fit.factors.items():
        assert isinstance(f, C.Factors) and vars(f) == data["factors"][stack]
    assert fit.rms_log_error == data["rms_log_error"] and data["per_stack"] == list(C.PER_STACK)
    ours = fit.factors[CALIBRATED_STACK]
    for p in PROFILES.values():
        if p.vendor == "tenstorrent":
            priced = C.calibrated(p, ours, "test")
            assert (float(p.efficiency), float(p.link_efficiency), float(p.op_overhead)) == (
                float(priced.efficiency),
                float(priced.link_efficiency),
                float(priced.op_overhead),
            ), p.name


def test_every_published_row_names_a_profile_and_a_mesh_of_its_size():
    for r in C.PUBLISHED:
        hw = get_profile(r.system)
        assert math.prod(parse_mesh(r.mesh).shape) <= math.prod(hw.mesh_shape), r
        assert r.scheme.stack in C.STACKS and r.published_s > 0 and r.forwards >= 1
        assert r.reading, f"{r.system} {r.resolution}: say how the source is read"


@pytest.mark.slow
def test_bench_calibration_holds_every_fitted_row_out_within_a_quarter():
    """The acceptance: leave-one-out error ≤ 25 % on every row the fit uses; a row it does not use says
    what the model cannot see."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_calibration.py"), "--json"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    data = json.loads(out.stdout)
    assert len(data["rows"]) == len(C.PUBLISHED)
    for r in data["rows"]:
        assert set(r) >= {"source", "system", "resolution", "what", "published_s", "predicted_s"}
        assert set(r) >= {"loo_predicted_s", "loo_error"}
        if r["fitted"]:
            assert abs(r["loo_error"]) <= 0.25, r
        else:
            assert r["unseen"], r
    # priced by what TTNN runs, each explanation of data movement fitted on its own, the audit's row among the fitted
    # ones; moves as slow as the audit measured them explain that row better than moves at DRAM bandwidth
    ttnn = {e["moves"]: e for e in data["ttnn"]["explanations"]}
    rates = data["ttnn"]["move_efficiency"]
    assert (
        set(ttnn) == set(rates)
        and rates["DRAM bandwidth"] == 1 > rates["audit, fixed program"] > rates["audit profile"]
    )
    audit = {k: [r for r in e["rows"] if r["what"] == "warm forward, 1 block"] for k, e in ttnn.items()}
    assert all(len(rows) == 1 and rows[0]["fitted"] for rows in audit.values())
    assert abs(audit["audit, fixed program"][0]["loo_error"]) < abs(audit["DRAM bandwidth"][0]["loo_error"])


@pytest.mark.parametrize("mesh, system", [("2x4", "wh-loudbox"), ("8x4", "bh-galaxy")])
def test_under_the_calibrated_factors_auto_is_never_slower_than_the_hand_plan_where_it_fits(a14b, mesh, system):
    """bench_planner's acceptance on two of its rows (one expert resident; the hand plan fits): the auto plan
    is priced by the same calibrated model and is at least as fast."""
    from planner import plan_graph

    hw = get_profile(system)
    hand = price_plan(a14b, tt_xla_plan(a14b, parse_mesh(mesh)), hw, num_blocks=40, weight_copies=1)
    assert hand.memory_bytes_per_device <= float(hw.dram_bytes)
    auto = plan_graph(a14b, parse_mesh(mesh), hw, num_blocks=40, weight_sets=1).predicted
    assert auto.step_seconds <= hand.step_seconds
