"""diffusers' real `WanPipeline` (tiny components, as diffusers' pipeline tests build them) compiled with
`wancompile.compile_pipeline` on a 2x4 mesh, judged against the same pipeline run eagerly in fp32.

Tolerances (fp32; seen: latents <= 3.1e-6, frames <= 2.4e-7): latents max-abs <= 2e-5, frames in [0, 1]
max-abs <= 1e-5, both PCC >= 0.99999. The call orders that need a fresh process (eager call before the
first compile, compile before any XLA use, only the VAE decode compiled) run this file as a script.
"""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

if __name__ != "__main__":
    from conftest import ROOT, run_script
else:
    ROOT = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(ROOT))

LATENTS_MAX_ABS, FRAMES_MAX_ABS, PCC = 2e-5, 1e-5, 0.99999
STEPS = 4  # with boundary_ratio 0.875 the first step runs `transformer`, the other three `transformer_2`


def _run(pipe, output_type: str, seed: int = 0, steps: int = STEPS, **kwargs):
    from wancompile.models import tiny_pipeline_inputs

    with torch.no_grad():
        out = pipe(**tiny_pipeline_inputs(pipe, seed=seed, steps=steps, **kwargs), output_type=output_type).frames
    return torch.from_numpy(np.asarray(out)) if output_type == "np" else out


def _graphs() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def _check(actual, expected, max_abs):
    from wancompile.verify import numerics

    result = numerics(actual, expected)
    assert result.pcc >= PCC and result.max_abs <= max_abs, result
    return result


@pytest.mark.usefixtures("spmd")
def test_two_expert_pipeline_matches_eager_with_one_graph_one_fold_per_expert(tmp_path):
    import jsonschema

    import wancompile
    from wancompile.models import build_tiny_pipeline
    from wancompile.pipeline import compilation

    torch._dynamo.reset()
    pipe = build_tiny_pipeline(two_experts=True)
    pipe.set_progress_bar_config(disable=True)
    high, low = pipe.transformer, pipe.transformer_2
    assert not torch.equal(high.blocks[0].attn1.to_q.weight, low.blocks[0].attn1.to_q.weight)  # different experts
    ref_frames, ref_latents = _run(pipe, "np"), _run(pipe, "latent")

    # the auto plan; the fold program takes the parameter-only ops (scale_shift_table splits, casts) out
    assert wancompile.compile_pipeline(pipe, mesh="2x4", dump_dir=tmp_path) is pipe
    before = _graphs()
    frames = _run(pipe, "np")
    assert _graphs() - before == 2  # one DiT graph for both experts + the full-T VAE decode
    _check(frames, ref_frames, FRAMES_MAX_ABS)
    before = _graphs()
    latents = _run(pipe, "latent")
    assert _graphs() - before == 0  # a second 4-step call, two expert switches: no recompile
    _check(latents, ref_latents, LATENTS_MAX_ABS)

    (program,) = compilation(pipe).programs()
    # 2 calls x 2 switches = 4 parameter-set changes; folded once per expert
    assert program.fold is not None and program.fold.runs == 2 and program.fold.cached_sets() == 2
    # one folder per expert, named as the pipeline's attribute, each with the (shared) plan and its weight sets
    plan = json.loads((tmp_path / "transformer" / "plan.json").read_text())
    jsonschema.validate(plan, json.loads((ROOT / "wancompile/schema/plan.schema.json").read_text()))
    assert plan["weight_sets"] == 2 and program.plan.weight_sets == 2
    assert json.loads((tmp_path / "transformer_2" / "plan.json").read_text()) == plan
    for expert in ("transformer", "transformer_2"):
        assert "| weight sets | 2 resident per device" in (tmp_path / expert / "plan.md").read_text()
        assert {"plan.html", "graph.json", "summary.txt"} <= {f.name for f in (tmp_path / expert).iterdir()}
    assert json.loads((tmp_path / "vae" / "plan.json").read_text())["weight_sets"] == 1


@pytest.mark.usefixtures("spmd")
def test_wan21_style_pipeline_auto_plan_budgets_one_weight_set(tmp_path):
    import wancompile
    from wancompile.models import build_tiny_pipeline
    from wancompile.pipeline import compilation

    torch._dynamo.reset()
    pipe = build_tiny_pipeline(two_experts=False)
    pipe.set_progress_bar_config(disable=True)
    assert pipe.transformer_2 is None
    ref = _run(pipe, "latent", steps=3)
    wancompile.compile_pipeline(pipe, mesh="2x4", vae=None, dump_dir=tmp_path)
    wancompile.compile_pipeline(pipe, mesh="2x4", vae=None, dump_dir=tmp_path)  # twice: restores, then compiles
    assert "decode" not in pipe.vae.__dict__  # vae=None leaves diffusers' decode alone
    before = _graphs()
    _check(_run(pipe, "latent", steps=3), ref, LATENTS_MAX_ABS)
    assert _graphs() - before == 1
    (program,) = compilation(pipe).programs()
    assert program.plan.weight_sets == 1 and program.plan.solver.status in ("OPTIMAL", "FEASIBLE")
    assert json.loads((tmp_path / "transformer" / "plan.json").read_text())["weight_sets"] == 1
    assert not (tmp_path / "transformer_2").exists()  # one expert, one folder
    assert program.fold is not None and program.fold.runs == 1
    wancompile.restore_pipeline(pipe)
    assert type(pipe.transformer).__name__ == "WanTransformer3DModel"


@pytest.mark.slow
@pytest.mark.usefixtures("spmd")
def test_experts_with_two_graphs_each_get_their_own_plan_in_their_own_folder(tmp_path):
    """Experts of different widths compile two graphs; the backend dumps both into the first expert's folder,
    and compile_pipeline puts each expert's plan back where its name says."""
    from diffusers import WanPipeline, WanTransformer3DModel

    import wancompile
    from wancompile.models import TINY_PIPELINE_TRANSFORMER, build_tiny_pipeline
    from wancompile.pipeline import compilation

    torch._dynamo.reset()
    base = build_tiny_pipeline(two_experts=False)
    torch.manual_seed(1)
    wide = WanTransformer3DModel(**dict(TINY_PIPELINE_TRANSFORMER, ffn_dim=48)).eval()
    pipe = WanPipeline(
        tokenizer=None,
        text_encoder=None,
        transformer=base.transformer,
        vae=base.vae,
        scheduler=base.scheduler,
        transformer_2=wide,
        boundary_ratio=0.875,
    )
    pipe.set_progress_bar_config(disable=True)
    ref = _run(pipe, "latent")
    wancompile.compile_pipeline(pipe, mesh="2x4", vae=None, dump_dir=tmp_path)
    _check(_run(pipe, "latent"), ref, LATENTS_MAX_ABS)
    programs = compilation(pipe).programs()
    assert len(programs) == 2  # step 1 compiles `transformer`'s graph, step 2 `transformer_2`'s

    def ffn_width(expert: str) -> int:
        graph = json.loads((tmp_path / expert / "graph.json").read_text())
        (width,) = {
            tuple(n["outputs"][0]["shape"])[0]
            for n in graph["nodes"]
            if n.get("param") == "blocks.0.ffn.net.0.proj.weight"
        }
        return width

    assert (ffn_width("transformer"), ffn_width("transformer_2")) == (32, 48)


@pytest.mark.usefixtures("spmd")
def test_cfg_parallel_runs_the_guidance_pair_as_one_batch2_forward_with_the_same_numbers():
    import wancompile
    from wancompile.models import build_tiny_pipeline
    from wancompile.pipeline import CFGBatched, compilation

    torch._dynamo.reset()
    pipe = build_tiny_pipeline(two_experts=True)
    pipe.set_progress_bar_config(disable=True)
    ref = _run(pipe, "latent")
    wancompile.compile_pipeline(pipe, mesh="2x4", vae=None)
    off = _run(pipe, "latent")
    wancompile.compile_pipeline(pipe, mesh="2x4", vae=None, cfg_parallel=True)
    assert isinstance(pipe.transformer, CFGBatched) and pipe.transformer.config.num_layers == 2
    assert pipe.transformer.dtype == torch.float32
    before = _graphs()
    on = _run(pipe, "latent")
    assert _graphs() - before == 1  # the batch-2 graph, for both experts
    before = _graphs()
    on_again = _run(pipe, "latent", seed=3)
    assert _graphs() - before == 0
    cfg = compilation(pipe).cfg
    assert (cfg.batched, cfg.served, cfg.fallthrough) == (2 * STEPS, 2 * STEPS, 0)
    program = compilation(pipe).programs()[-1]  # the batch-2 program
    assert program.fold.runs == 2 and program.fold.cached_sets() == 2
    # cfg_parallel=True: the backend's "on" (planner.cfg) splits the batch over a halved mesh axis
    assert program.plan.cfg_parallel is not None and program.plan.cfg_parallel.mode == "on"
    assert "cfg" in program.plan.mesh.axis_names and program.plan.weight_sets == 2
    _check(on, off, LATENTS_MAX_ABS)  # CFG batched vs two calls, both compiled
    _check(on, ref, LATENTS_MAX_ABS)
    _check(on_again, _run(wancompile.restore_pipeline(pipe), "latent", seed=3), LATENTS_MAX_ABS)


@pytest.mark.usefixtures("spmd")
def test_vae_auto_decodes_chunked_t_when_the_budget_left_by_the_experts_is_short():
    import wancompile
    from wancompile.backend import recent_programs
    from wancompile.models import TINY_PIPELINE_VAE, build_tiny_pipeline
    from wancompile.pipeline import compilation, resident_weight_bytes, spatial_split
    from wancompile.vae import choose_t_chunk, decode_memory

    torch._dynamo.reset()
    pipe = build_tiny_pipeline(two_experts=True)
    pipe.set_progress_bar_config(disable=True)
    ref = _run(pipe, "np", steps=2, frames=17)  # 5 latent frames
    latent = (1, 16, 5, 4, 4)
    weights = sum(
        p.numel() * p.element_size()
        for t in (pipe.transformer, pipe.transformer_2)
        for p in [*t.parameters(), *t.buffers()]
    )  # replicated, both experts
    memory = decode_memory(TINY_PIPELINE_VAE, latent)
    budget = weights + memory.peak(2) + memory.per_frame // 2  # full-T (5 frames) does not fit, 2 frames do
    wancompile.compile_pipeline(pipe, mesh="2x4", memory_gb=budget / 1e9)
    frames = _run(pipe, "np", steps=2, frames=17)
    _check(frames, ref, FRAMES_MAX_ABS)
    state = compilation(pipe)
    resident = resident_weight_bytes(state.programs())
    assert resident == weights and state.programs()[-1].plan.sharded_params() == {}  # the plan replicates
    first = choose_t_chunk(TINY_PIPELINE_VAE, latent, int(budget - resident))
    assert first == 2  # the first decode: sized for the whole latent (no VAE plan yet)
    # then sized again for the tile the first decode's VAE plan holds per device: here the plan of this tiny
    # decode splits nothing spatially, so the chunk stays (tests/test_vae_budget.py: a spatial plan's larger chunk)
    ((key, split),) = state.decode.splits.items()
    vae_plan = [p for p in recent_programs() if p.plan.model == "wan-vae"][-1].plan
    assert split == spatial_split(vae_plan) == (1, 1)
    assert state.decode.t_chunks[key] == choose_t_chunk(TINY_PIPELINE_VAE, latent, int(budget - resident), split=split)
    assert state.decode.t_chunks[key] == first


@pytest.mark.usefixtures("spmd")
def test_replayed_dit_follows_every_call_s_timestep_and_latents():
    """diffusers' norm_out writes ``shift.to(hidden_states.device)``: traced on the host, a literal
    ``.to(cpu)`` that, lowered as is, executes mid-trace and freezes the first call's value into the
    replayed program (wancompile.legalize.drop_device_moves)."""
    import wancompile
    from wancompile.models import build_tiny_pipeline
    from wancompile.pipeline import compilation

    torch._dynamo.reset()
    pipe = build_tiny_pipeline(two_experts=False)
    model = pipe.transformer
    wancompile.compile_pipeline(pipe, mesh="2x4", vae=None)
    g = torch.Generator().manual_seed(0)
    x, e = torch.randn(1, 16, 3, 4, 4, generator=g), torch.randn(1, 16, 32, generator=g)
    with torch.no_grad():
        for t in (999.0, 500.0, 10.0):
            _check(
                pipe.transformer(x, torch.tensor([t]), e, return_dict=False)[0],
                model(x, torch.tensor([t]), e, return_dict=False)[0],
                LATENTS_MAX_ABS,
            )
        x = torch.randn(1, 16, 3, 4, 4, generator=g)
        _check(
            pipe.transformer(x, torch.tensor([3.0]), e, return_dict=False)[0],
            model(x, torch.tensor([3.0]), e, return_dict=False)[0],
            LATENTS_MAX_ABS,
        )
    (program,) = compilation(pipe).programs()
    source_moves = [
        n
        for n in program.source.graph.nodes
        if n.op == "call_method" and n.target == "to" and any(isinstance(a, torch.device) for a in n.args[1:])
    ]
    assert {n.name for n in source_moves} >= {"shift_1", "scale_1"}  # norm_out's shift and scale (and more)
    assert not [
        n
        for n in program.lowered.graph.nodes
        if n.op == "call_method" and n.target == "to" and any(isinstance(a, torch.device) for a in n.args[1:])
    ]
    assert program.traces == 1 and sum(r.runs for r in program._replays.values()) == 4  # traced once, replayed


def test_cfg_batched_falls_through_when_the_uncond_call_differs():
    """An uncond call with other inputs than the cond call's runs as a plain forward (never a stale half)."""
    from wancompile.pipeline import CFGBatched, _CFGState

    calls = []

    class Echo(torch.nn.Module):
        config = {"marker": 1}

        def forward(self, hidden_states, timestep, encoder_hidden_states, attention_kwargs=None, return_dict=True):
            calls.append(hidden_states.shape[0])
            return (hidden_states + encoder_hidden_states.sum(-1, keepdim=True) + timestep.view(-1, 1),)

        def cache_context(self, name, **kwargs):
            from contextlib import nullcontext

            return nullcontext()

    cfg = _CFGState()
    cfg.negative = torch.full((1, 3), 2.0)
    model = CFGBatched(Echo(), Echo(), cfg)
    x, t, c = torch.zeros(1, 3), torch.ones(1), torch.ones(1, 3)
    with model.cache_context("cond"):
        cond = model(hidden_states=x, timestep=t, encoder_hidden_states=c, return_dict=False)[0]
    with model.cache_context("uncond"):
        uncond = model(hidden_states=x, timestep=t, encoder_hidden_states=cfg.negative, return_dict=False)[0]
    assert calls == [2] and torch.equal(cond, torch.full((1, 3), 4.0)) and torch.equal(uncond, torch.full((1, 3), 7.0))
    with model.cache_context("cond"):
        model(hidden_states=x, timestep=t, encoder_hidden_states=c, return_dict=False)
    x.add_(1.0)  # the latents changed in place after the cond call: the kept half is stale
    with model.cache_context("uncond"):
        fresh = model(hidden_states=x, timestep=t, encoder_hidden_states=cfg.negative, return_dict=False)[0]
    assert calls == [2, 2, 1] and torch.equal(fresh, torch.full((1, 3), 8.0))
    assert (cfg.batched, cfg.served, cfg.fallthrough) == (2, 1, 1) and model.config == {"marker": 1}


def test_compile_pipeline_rejects_bad_arguments():
    import wancompile
    from wancompile.models import build_tiny_pipeline
    from wancompile.options import OptionsError

    pipe = build_tiny_pipeline(two_experts=False)
    with pytest.raises(ValueError, match="vae must be 'auto', 'full', a positive int"):
        wancompile.compile_pipeline(pipe, mesh="2x4", vae="streaming")
    with pytest.raises(OptionsError, match="weight_sets' must be an integer >= 1"):
        wancompile.compile_pipeline(pipe, mesh="2x4", weight_sets=0)
    with pytest.raises(TypeError, match="expects a diffusers WanPipeline"):
        wancompile.compile_pipeline(pipe.transformer, mesh="2x4")
    assert type(pipe.transformer).__name__ == "WanTransformer3DModel"  # nothing was changed


@pytest.mark.slow
@pytest.mark.parametrize("order", ["eager-first", "compile-first", "vae-only"])
def test_call_orders_in_a_fresh_process(order):
    out = run_script([__file__, order], num_devices=8, timeout=900)
    row = json.loads(out.strip().splitlines()[-1])
    assert row["order"] == order and row["max_abs"] <= (FRAMES_MAX_ABS if order == "vae-only" else LATENTS_MAX_ABS), row
    assert row["pcc"] >= PCC and row["new_graphs_second_call"] == 0, row


def _order_main(order: str) -> None:
    """One call order in this (fresh) process; prints one JSON line. No SPMD set-up here on purpose."""
    import wancompile
    from wancompile.models import build_tiny_pipeline
    from wancompile.verify import numerics

    pipe = build_tiny_pipeline(two_experts=True)
    pipe.set_progress_bar_config(disable=True)
    if order == "eager-first":  # the eager call's xm.mark_step() starts the XLA runtime
        ref = _run(pipe, "latent")
        wancompile.compile_pipeline(pipe, mesh="2x4", vae=None)
        out = _run(pipe, "latent")
        before = _graphs()
        _run(pipe, "latent")
    elif order == "compile-first":
        wancompile.compile_pipeline(pipe, mesh="2x4", vae=None)
        out = _run(pipe, "latent")
        before = _graphs()
        _run(pipe, "latent")
        ref = _run(wancompile.restore_pipeline(pipe), "latent")
    elif order == "vae-only":  # the README's snippet: only the decode compiled, the DiT steps eager
        wancompile.enable_full_t(pipe.vae)
        pipe.vae.decode = torch.compile(pipe.vae.decode, backend="wan_autoshard", options={"mesh": "2x4"})
        out = _run(pipe, "np")
        before = _graphs()
        _run(pipe, "np")
        wancompile.disable_full_t(pipe.vae)
        ref = _run(pipe, "np")
    else:
        raise SystemExit(f"unknown order {order!r}")
    result = numerics(out, ref)
    print(
        json.dumps(
            {"order": order, "pcc": result.pcc, "max_abs": result.max_abs, "new_graphs_second_call": _graphs() - before}
        )
    )


if __name__ == "__main__":
    _order_main(sys.argv[1])


def test_cfg_auto_runs_two_forwards_when_no_batch2_plan_fits_memory():
    """cfg_parallel="auto": a CFG pair whose batch-2 forward has no plan within the budget runs as diffusers
    runs it (two forwards per step) instead of failing; "on" keeps the error."""
    from planner.plan import MemoryBudgetError
    from wancompile.models import build_tiny_pipeline
    from wancompile.pipeline import CFGBatched, _capture_negative_prompt, _CFGState

    class NoBatch2(torch.nn.Module):  # stands in for the compiled transformer under a tight budget
        def __init__(self, module):
            super().__init__()
            self.module, self.calls = module, []

        def forward(self, hidden_states, *args, **kwargs):
            self.calls.append(hidden_states.shape[0])
            if hidden_states.shape[0] == 2:  # the backend's errors reach the caller as themselves (catchable)
                raise MemoryBudgetError("no plan fits 1e-06 GB", budget_gb=1e-6, need_gb=1e-3)
            return self.module(hidden_states, *args, **kwargs)

    pipe = build_tiny_pipeline(two_experts=False)
    pipe.set_progress_bar_config(disable=True)
    ref = _run(pipe, "latent")
    for mode in ("auto", "on"):
        cfg, inner = _CFGState(mode), NoBatch2(pipe.transformer)
        wrapped = CFGBatched(inner, pipe.transformer, cfg)
        _capture_negative_prompt(pipe, cfg)
        original, pipe.transformer = pipe.transformer, wrapped
        try:
            if mode == "on":
                with pytest.raises(MemoryBudgetError, match="no plan fits"):
                    _run(pipe, "latent")
                continue
            out = _run(pipe, "latent")
        finally:
            pipe.transformer = original
            del pipe.__dict__["encode_prompt"]
        assert cfg.unbatched.startswith("no plan fits") and inner.calls == [2] + [1] * (2 * STEPS)
        assert torch.equal(out, ref)
