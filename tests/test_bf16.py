"""bf16 as pipelines run it, through every program the backend compiles for Wan: the DiT's main program (T2V,
TI2V), its fold program, the CFG batch-2 program and the VAE's full-T decode, on both targets (``gspmd``, and
``tt-mlir``'s pinned plan, which runs on CPU through GSPMD: its numerics stand-in, docs/tenstorrent.md).

**Loaded as a pipeline loads it.** `wancompile.models.as_loaded(m, torch.bfloat16)` is
``from_pretrained(torch_dtype=torch.bfloat16)``: every floating parameter and buffer in bf16 but those of the
class's ``_keep_in_fp32_modules`` (Wan's RoPE tables, time embedder, modulation tables and block norms stay
fp32). `WanPipeline` casts the latents and prompt embeddings to the transformer's dtype
(``latents.to(transformer_dtype)``) and passes the scheduler's timestep as it is. The VAE: diffusers' Wan
examples load it in fp32 (``AutoencoderKLWan.from_pretrained(..., torch_dtype=torch.float32)`` passed as
``vae=``), and the pipeline decodes in the VAE's dtype (``latents.to(self.vae.dtype)``); a pipeline loaded
with ``torch_dtype=torch.bfloat16`` and no ``vae=`` decodes in bf16 (`AutoencoderKLWan` keeps nothing in
fp32). Both are here.

**The tolerance** (`assert_within_bf16`). The reference is eager fp32 (the same weights, fp32 throughout); the
yardstick is eager bf16's own error against it: ``e = 1 - PCC`` and the max-abs. The compiled program must be
within ``FACTOR = 2`` of both, because it rounds to bf16 at most twice where eager rounds once:

- eager (PyTorch on CPU) rounds every op's output to bf16. The compiled program computes the same ops in the
  same dtypes, and rounds at other points: XLA rounds a fused chain of elementwise ops once, at its end; a
  split reduction (row-parallel linear, the norms' statistics) is a sum of per-device partials; on a device
  that reduces in bf16 (what the plan prices: 2 bytes an element) each partial is rounded before the
  all-reduce adds them, one more rounding of that value; gathers, slices and all-to-alls move values
  without rounding them. (XLA:CPU promotes bf16 collectives to f32, checked below: here the partials are
  summed in f32, fewer roundings, so these CPU runs sit inside the bound with room.)
- Rounding errors are independent draws of about equal size per rounding, so twice the roundings is at most
  twice the error energy, and ``1 - PCC`` is that energy relative to the signal's: at most ``2 e``. The
  max-abs is held to the same factor (its expected growth is sqrt(2); 2 leaves the tail of one draw room).
- Against eager bf16 itself: ``sqrt(1 - PCC)`` is, for small errors, a distance (the error's norm relative
  to the signal's), so by the triangle inequality ``1 - PCC(compiled, eager bf16) <= (1 + sqrt(FACTOR))**2 e``.
- Measured (docs/numerics.md §7; each test prints its numbers with -s): the compiled program's error is 0.8-1.3x
  eager bf16's, PCC 0.99998 against eager fp32 for the DiT. tests/tt_fuzz_cases.py judges its bf16 cases
  (whole-model casts, 42 draws) with the same factor.

Everything runs in the test session's 8 virtual devices, on 2x4; each compile is a tiny model (seconds).
"""

from __future__ import annotations

import math

import pytest
import torch

from wancompile.models import as_loaded, build_transformer, transformer_inputs
from wancompile.verify import compare_collectives, numerics, placeholder_args, run_with_backend, tightest_budget

pytestmark = pytest.mark.usefixtures("spmd")

BF16 = torch.bfloat16
FACTOR = 2.0  # the compiled program rounds each value at most twice where eager rounds once (module docstring)
MESH = "2x4"


def assert_within_bf16(compiled, eager_bf16, eager_fp32, where: str) -> dict:
    """The compiled bf16 output against eager fp32 within FACTOR times eager bf16's own error (1 - PCC and
    max-abs), and against eager bf16 within the triangle bound; in eager bf16's dtype. Returns the numbers."""
    assert compiled.dtype == eager_bf16.dtype, f"{where}: compiled {compiled.dtype}, eager {eager_bf16.dtype}"
    ref = numerics(eager_bf16, eager_fp32)  # the yardstick: what bf16 itself costs
    got = numerics(compiled, eager_fp32)
    vs_bf16 = numerics(compiled, eager_bf16)
    e = 1.0 - ref.pcc
    row = {"eager_bf16_vs_fp32": str(ref), "compiled_vs_fp32": str(got), "compiled_vs_eager_bf16": str(vs_bf16)}
    print(f"{where}: " + "; ".join(f"{k} {v}" for k, v in row.items()))
    assert e > 0, f"{where}: eager bf16 equals eager fp32, no yardstick (is the model really in bf16?)"
    assert 1.0 - got.pcc <= FACTOR * e, f"{where}: 1 - PCC {1 - got.pcc:.3g} > {FACTOR} x {e:.3g} ({row})"
    assert got.max_abs <= FACTOR * ref.max_abs, f"{where}: max-abs {got.max_abs:.3g} > {FACTOR} x {ref.max_abs:.3g}"
    bound = (1.0 + math.sqrt(FACTOR)) ** 2 * e
    assert 1.0 - vs_bf16.pcc <= bound, f"{where}: vs eager bf16 1 - PCC {1 - vs_bf16.pcc:.3g} > {bound:.3g} ({row})"
    return row


def as_pipeline_inputs(inputs: dict, dtype: torch.dtype = BF16) -> dict:
    """The transformer's inputs as `WanPipeline` passes them: floating tensors in the transformer's dtype."""
    return {k: v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() else v for k, v in inputs.items()}


def eager(model, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs, return_dict=False)[0]


@pytest.fixture(scope="module")
def tiny():
    """The tiny DiT (4 heads x 16, 2 blocks) twice with the same weights: fp32, and bf16 as loaded."""
    return build_transformer("tiny"), as_loaded(build_transformer("tiny"), BF16)


def t2v_inputs() -> dict:
    return transformer_inputs("tiny", "tiny", 9)  # 3 x 8 x 8 latent: 48 tokens


def ti2v_inputs() -> dict:
    """Wan 2.2 TI2V's call (``expand_timesteps``): one timestep per token, the first latent frame (the given
    image) at 0, the rest at the step's."""
    inputs = t2v_inputs()
    tokens, per_frame = 48, 16
    inputs["timestep"] = torch.tensor([[0] * per_frame + [500] * (tokens - per_frame)])
    return inputs


def compile_at(model, inputs: dict, options: dict):
    """(output, program) of `model` compiled on MESH with `options`; ``memory_gb="tightest"``: the smallest
    budget the planner accepts for these options."""
    options = {"mesh": MESH, **options}
    if options.get("memory_gb") == "tightest":
        options["memory_gb"] = tightest_budget(model, inputs, **{k: v for k, v in options.items() if k != "memory_gb"})
    out, _, program = run_with_backend(model, inputs, reference=False, **options)
    return out[0], program


# case -> backend options: the auto plan at its tightest budget (weights FSDP-sharded, SP + head-TP), with every
# rewrite (the qkv packing: bf16 weights the fold program packs), and the seed's tt-xla hand plan
DIT_CASES = {
    "auto-tightest": {"memory_gb": "tightest"},
    "auto-tightest-rewrites-all": {"memory_gb": "tightest", "rewrites": "all"},
    "tt-xla": {"plan": "tt-xla"},
}


@pytest.fixture(scope="module")
def t2v_programs(tiny):
    """Each DIT_CASES case compiled once (the tests below read its output and its program)."""
    model32, model = tiny
    inputs = as_pipeline_inputs(t2v_inputs())
    return {case: compile_at(model, inputs, options) for case, options in DIT_CASES.items()}


@pytest.mark.parametrize("case", list(DIT_CASES))
def test_t2v_main_program_in_bf16_is_within_eager_bf16s_error_of_fp32(tiny, t2v_programs, case):
    model32, model = tiny
    inputs = t2v_inputs()
    out, program = t2v_programs[case]
    assert_within_bf16(out, eager(model, as_pipeline_inputs(inputs)), eager(model32, inputs), f"T2V {case}")
    if case.startswith("auto"):
        assert any("FSDP" in d.strategy for d in program.plan.decisions)
    # the partitioner emits the predicted collectives, one for one; the plan prices the bf16 values at 2 bytes an
    # element (what a bf16 device moves; fp32 values, e.g. the kept-fp32 norms', at 4), XLA:CPU promotes bf16
    # collectives to f32 (its bf16 normalization: the reduction is ``add.clone_promoted``), so on these CPU
    # devices they move up to twice the predicted bytes
    compiled = program.collectives()
    assert {c.shape.split("[")[0] for c in compiled} == {"f32"}
    for m in compare_collectives(program.plan.collectives, compiled):
        assert m.count_ok, f"T2V bf16 {case}: {m}"
        assert m.predicted_bytes <= m.observed_bytes <= 2 * m.predicted_bytes, f"T2V bf16 {case}: {m}"


def test_ti2v_per_token_timesteps_in_bf16_are_within_eager_bf16s_error(tiny):
    model32, model = tiny
    inputs = ti2v_inputs()
    out, _ = compile_at(model, as_pipeline_inputs(inputs), {"memory_gb": "tightest"})
    assert_within_bf16(out, eager(model, as_pipeline_inputs(inputs)), eager(model32, inputs), "TI2V auto-tightest")


def without_constraints(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """`gm` without its sharding constraints (`wancompile.constraints.constrain`: annotations, no values), so
    that PyTorch runs it on host tensors."""
    from wancompile.constraints import constrain

    gm = torch.fx.GraphModule(gm, gm.graph.__deepcopy__())
    for node in [n for n in gm.graph.nodes if n.target is constrain]:
        gm.graph.erase_node(node)
    gm.recompile()
    return gm


@pytest.mark.parametrize("case", list(DIT_CASES))
def test_fold_program_computes_in_the_dtypes_the_model_holds(tiny, t2v_programs, case):
    """The parameter-only values (RoPE tables, fp32 norms' casts, the packed q/k/v weights) come out of the
    fold program in the dtypes eager computes them in and with eager's values: the same fold graph run by
    PyTorch on the host's parameters. The kept-fp32 modules' values stay fp32, the bf16 weights' bf16."""
    _, model = tiny
    _, program = t2v_programs[case]
    split = program.fold.split
    args = placeholder_args(program.graph, model, as_pipeline_inputs(t2v_inputs()))
    with torch.no_grad():
        expected = without_constraints(split.fold)(*[args[i] for i in split.sources])
    values = program.fold._values
    assert len(values) == len(expected) == len(split.folded)
    for name, got, want in zip(split.folded, values, expected):
        assert got.dtype == want.dtype, f"{case}: folded {name} is {got.dtype}, eager computes {want.dtype}"
        assert torch.equal(got.cpu(), want), f"{case}: folded {name} differs from eager's"
    dtypes = {v.dtype for v in values}
    assert torch.float32 in dtypes  # RoPE tables (kept in fp32 as diffusers keeps them)
    if case.endswith("rewrites-all"):
        assert BF16 in dtypes and any(n.startswith("packed_weight") for n in split.folded)


@pytest.mark.slow
def test_cfg_batch2_program_in_bf16_is_within_eager_bf16s_error_of_two_fp32_forwards(tiny):
    """cfg_parallel="on" at its tightest budget: cond and uncond (same latents and timestep, two prompts) as one
    batch-2 forward split over half the mesh each, against what diffusers runs: two batch-1 forwards."""
    model32, model = tiny
    cond = t2v_inputs()
    uncond = {**cond, "encoder_hidden_states": transformer_inputs("tiny", "tiny", 9, seed=2)["encoder_hidden_states"]}
    pair = {k: torch.cat([cond[k], uncond[k]]) for k in cond}
    out, program = compile_at(model, as_pipeline_inputs(pair), {"memory_gb": "tightest", "cfg_parallel": "on"})
    assert program.plan.cfg_parallel.chosen.startswith("split(") and "cfg" in program.plan.mesh.axis_names
    two = lambda m, cast: torch.cat([eager(m, cast(cond)), eager(m, cast(uncond))])  # noqa: E731
    assert_within_bf16(out, two(model, as_pipeline_inputs), two(model32, dict), "CFG batch-2 split, tightest")


def test_tt_mlir_target_in_bf16_runs_right_on_cpu_and_exports_bf16(tiny, tmp_path):
    """``target="tt-mlir"``: the pinned plan at its tightest budget runs through GSPMD on CPU within eager bf16's
    error, and the Shardy-form program written for tt-mlir holds bf16 tensors (the model's dtype)."""
    model32, model = tiny
    inputs = t2v_inputs()
    options = {"target": "tt-mlir", "memory_gb": "tightest", "dump_dir": str(tmp_path)}
    out, program = compile_at(model, as_pipeline_inputs(inputs), options)
    assert program.plan.target == "tt-mlir"
    assert_within_bf16(out, eager(model, as_pipeline_inputs(inputs)), eager(model32, inputs), "T2V tt-mlir tightest")
    (exported,) = [f.read_text() for f in tmp_path.glob("*.tt.mlir") if ".fold" not in f.name]
    assert "xbf16>" in exported and "sdy.sharding" in exported


@pytest.mark.slow
def test_vae_full_t_decode_in_bf16_is_within_eager_bf16s_error_of_fp32():
    """A VAE loaded in bf16 (a pipeline loaded with ``torch_dtype=torch.bfloat16`` and no ``vae=``), full-T
    decode at its tightest budget (channel-split mid blocks, spatially split upper stages), against diffusers'
    streaming decode in bf16 and in fp32."""
    import wancompile.vae as wvae
    from wancompile.vae.configs import build_vae

    z = torch.randn(1, 16, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    vae32, vae = build_vae("tiny-wan2.1"), as_loaded(build_vae("tiny-wan2.1"), BF16)
    with torch.no_grad():
        eager32, eager16 = vae32.decode(z).sample, vae.decode(z.to(BF16)).sample
    wvae.enable_full_t(vae)
    try:
        out, program = compile_at(vae.decode, {"z": z.to(BF16)}, {"memory_gb": "tightest"})
    finally:
        wvae.disable_full_t(vae)
    strategies = [d.strategy for d in program.plan.decisions]
    assert any(s.startswith("spatial(") for s in strategies) and any(s.startswith("channel(") for s in strategies)
    assert_within_bf16(out, eager16, eager32, "VAE full-T bf16, tightest")


@pytest.mark.slow
def test_bf16_pipeline_with_cfg_parallel_and_an_fp32_vae_as_diffusers_loads_it():
    """The tiny two-expert `WanPipeline`, transformers loaded in bf16, the VAE in fp32 (diffusers' Wan examples),
    through `compile_pipeline` with CFG batching: the latents of a 2-step call (the batch-2 program of both
    experts, their fold programs) within eager bf16's error of the fp32 pipeline; the decode compiled in fp32,
    the VAE's dtype, which the pipeline hands it."""
    import wancompile
    from wancompile.models import build_tiny_pipeline, tiny_pipeline_inputs
    from wancompile.pipeline import compilation
    from wancompile.programs import Component, recent_programs

    def call(pipe, output_type):
        with torch.no_grad():
            return pipe(**tiny_pipeline_inputs(pipe), output_type=output_type).frames

    torch._dynamo.reset()
    pipe32, pipe = build_tiny_pipeline(), build_tiny_pipeline()
    for p in (pipe32, pipe):
        p.set_progress_bar_config(disable=True)
    as_loaded(pipe.transformer, BF16), as_loaded(pipe.transformer_2, BF16)
    assert pipe.transformer.dtype == BF16 and pipe.vae.dtype == torch.float32
    latents32, latents16 = call(pipe32, "latent"), call(pipe, "latent")
    wancompile.compile_pipeline(pipe, mesh=MESH, cfg_parallel=True)
    compiled = call(pipe, "latent")
    program = compilation(pipe).programs()[-1]
    assert program.plan.cfg_parallel.chosen.startswith("split(") and program.fold.cached_sets() == 2
    assert compilation(pipe).cfg.batched == 2  # 2 steps, one batch-2 forward each
    # (the scheduler keeps the latents in fp32: the transformer's bf16 output is promoted in its step)
    assert_within_bf16(compiled, latents16, latents32, "pipeline latents, CFG batch-2")
    call(pipe, "np")
    (vae,) = [p for p in recent_programs(Component.VAE)][-1:]
    assert {n.out.dtype for n in vae.graph if n.op == "placeholder"} == {"float32"}
