"""SkyReels-V2's pipelines and ChronoEdit through `wancompile.compile_pipeline` on 2x4: diffusers' real
`SkyReelsV2Pipeline`, `SkyReelsV2ImageToVideoPipeline`, `SkyReelsV2DiffusionForcingPipeline` (and its
image-to-video and video-to-video variants) and `ChronoEditPipeline`, from the tiny components of diffusers'
own pipeline tests (tests/pipelines/skyreels_v2/*, tests/pipelines/chronoedit/test_chronoedit.py: the 2-block
DiT with 2 heads x 12, the 3-channel Wan VAE, a 4-wide CLIP image encoder), without text encoder (random
prompt embeddings), 2 steps. Diffusion forcing runs synchronously (``ar_step=0``) with its fps embedding on
(``inject_sample_info``), one timestep per latent frame; ChronoEdit runs its two-latent-frame edit step.

Each compiled pipeline is judged against the same pipeline run eagerly in fp32, frames in [0, 1] (PCC >=
0.99999, max-abs <= 1e-5; seen: <= 2.4e-7), and its DiT graph is the one the DiT planner solved: a
``wan-dit`` plan with its blocks found as one family. At the default budget the tiny DiT replicates, so the
tightest budget is run too (the DiT's weights split over 2x4); ``cfg_parallel=True`` batches SkyReels-V2's
guidance pair and leaves the calls it cannot batch (diffusion forcing, ChronoEdit) as they are.
"""

import numpy as np
import pytest
import torch
from test_pipeline_families import FRAMES_MAX_ABS, PCC, _clip, _image, _run

STEPS = 2


def _parts(dit_class: str, seed: int = 0, **transformer):
    import diffusers
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler

    from wancompile.models import TINY_PIPELINE_TRANSFORMER, TINY_PIPELINE_VAE

    torch.manual_seed(0)
    vae = AutoencoderKLWan(**TINY_PIPELINE_VAE).eval()
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    torch.manual_seed(seed)
    dit = getattr(diffusers, dit_class)(**dict(TINY_PIPELINE_TRANSFORMER, **transformer)).eval()
    return dict(tokenizer=None, text_encoder=None, vae=vae, scheduler=scheduler, transformer=dit)


def _video(frames: int):
    from PIL import Image

    return [Image.fromarray(np.asarray(_image()) // (i + 1)) for i in range(frames)]


# diffusion forcing: a timestep per latent frame, all equal with ar_step=0; fps 24 -> the fps embedding's row 1
DF = dict(prompt=None, ar_step=0, fps=24)


def build(kind: str):
    """(pipeline, its call kwargs besides prompt embeddings, generator and steps)."""
    import diffusers

    video = dict(height=32, width=32, num_frames=9)
    if kind == "skyreels-t2v":
        return diffusers.SkyReelsV2Pipeline(**_parts("SkyReelsV2Transformer3DModel")), video
    if kind == "skyreels-i2v":  # Wan 2.1 I2V layout: image latents and mask on channels, CLIP image tokens
        parts = _parts("SkyReelsV2Transformer3DModel", in_channels=36, image_dim=4)
        return diffusers.SkyReelsV2ImageToVideoPipeline(**parts, **_clip()), dict(video, image=_image())
    df = _parts("SkyReelsV2Transformer3DModel", inject_sample_info=True)
    if kind == "skyreels-df":
        return diffusers.SkyReelsV2DiffusionForcingPipeline(**df), dict(video, **DF)
    if kind == "skyreels-df-i2v":  # the image is the first latent frame, kept as a prefix
        return diffusers.SkyReelsV2DiffusionForcingImageToVideoPipeline(**df), dict(video, image=_image(), **DF)
    if kind == "skyreels-df-v2v":  # 5 video frames (2 latent frames) continued by 9 more, in one window
        pipe = diffusers.SkyReelsV2DiffusionForcingVideoToVideoPipeline(**df)
        return pipe, dict(video, video=_video(5), overlap_history=5, base_num_frames=9, **DF)
    if kind == "chronoedit":  # the edit step: 5 frames -> 2 latent frames (the input image, the edit)
        parts = _parts("ChronoEditTransformer3DModel", in_channels=36, image_dim=4)
        return diffusers.ChronoEditPipeline(**parts, **_clip()), dict(image=_image(), height=32, width=32, num_frames=5)
    raise ValueError(kind)


def _compiled_and_eager(kind: str, dump_dir, **options):
    """(the pipeline compiled on 2x4 with `options`, its frames vs eager's: `numerics`)."""
    import wancompile
    from wancompile.verify import numerics

    torch._dynamo.reset()
    pipe, kwargs = build(kind)
    pipe.set_progress_bar_config(disable=True)
    ref = _run(pipe, kwargs, STEPS)
    wancompile.compile_pipeline(pipe, mesh="2x4", dump_dir=dump_dir, **options)
    result = numerics(_run(pipe, kwargs, STEPS), ref)
    print(f"{kind} {options or ''}: {result}")
    return pipe, result


def _assert_planned_dit(program) -> None:
    """The DiT graph was recognised and solved: the DiT planner's plan, its blocks one family."""
    assert program.plan.model == "wan-dit"
    assert program.plan.solver.status in ("OPTIMAL", "FEASIBLE"), program.plan.solver
    assert [(f.prefix, f.indices) for f in program.graph.families] == [("blocks", (0, 1))]
    assert program.plan.decisions


@pytest.mark.slow
@pytest.mark.usefixtures("spmd")
@pytest.mark.parametrize(
    "kind", ["skyreels-t2v", "skyreels-i2v", "skyreels-df", "skyreels-df-i2v", "skyreels-df-v2v", "chronoedit"]
)
def test_pipeline_matches_eager_on_2x4(kind, tmp_path):
    import wancompile
    from wancompile.pipeline import compilation

    pipe, result = _compiled_and_eager(kind, tmp_path)
    assert result.pcc >= PCC and result.max_abs <= FRAMES_MAX_ABS, result
    state = compilation(pipe)
    assert state.transformers == ("transformer",)
    (program,) = state.programs()  # one DiT graph for every step (and both guidance calls)
    _assert_planned_dit(program)
    assert (tmp_path / "transformer" / "plan.json").exists() and (tmp_path / "vae" / "plan.json").exists()
    original = state.originals["transformer"]
    wancompile.restore_pipeline(pipe)
    assert pipe.transformer is original


@pytest.mark.slow
@pytest.mark.usefixtures("spmd")
def test_skyreels_cfg_parallel_runs_the_guidance_pair_as_one_batch2_forward_matching_eager(tmp_path):
    from wancompile.pipeline import compilation

    pipe, result = _compiled_and_eager("skyreels-t2v", tmp_path, cfg_parallel=True)
    assert result.pcc >= PCC and result.max_abs <= FRAMES_MAX_ABS, result
    cfg = compilation(pipe).cfg
    assert (cfg.batched, cfg.served, cfg.fallthrough) == (STEPS, STEPS, 0)
    (program,) = compilation(pipe).programs()  # the batch-2 graph only
    _assert_planned_dit(program)
    assert program.plan.cfg_parallel.mode == "on" and "cfg" in program.plan.mesh.axis_names


@pytest.mark.slow
@pytest.mark.usefixtures("spmd")
@pytest.mark.parametrize("kind", ["skyreels-t2v", "skyreels-i2v", "skyreels-df", "chronoedit"])
def test_at_the_tightest_budget_the_sharded_dit_matches_eager(kind):
    """At the default budget the tiny DiT replicates; at the tightest budget the planner accepts (the
    ``need_gb`` of its `MemoryBudgetError`) its weights and activations are split over 2x4, and the frames
    still match eager (the VAE left alone: its budget is not the point here)."""
    import wancompile
    from wancompile.pipeline import compilation
    from wancompile.verify import numerics

    torch._dynamo.reset()
    pipe, kwargs = build(kind)
    pipe.set_progress_bar_config(disable=True)
    ref = _run(pipe, kwargs, STEPS)
    wancompile.compile_pipeline(pipe, mesh="2x4", memory_gb=1e-9, vae=None)
    with pytest.raises(wancompile.MemoryBudgetError) as e:
        _run(pipe, kwargs, STEPS)
    wancompile.compile_pipeline(pipe, mesh="2x4", memory_gb=e.value.need_gb, vae=None)
    result = numerics(_run(pipe, kwargs, STEPS), ref)
    print(f"{kind} memory_gb={e.value.need_gb:.3g}: {result}")
    assert result.pcc >= PCC and result.max_abs <= FRAMES_MAX_ABS, result

    program = compilation(pipe).programs()[-1]
    _assert_planned_dit(program)
    params = dict(compilation(pipe).originals["transformer"].named_parameters())
    sharded = sum(params[p].numel() for p in program.plan.sharded_params() if p in params)
    assert sharded > 0.5 * sum(p.numel() for p in params.values())
    assert any("FSDP" in d.strategy for d in program.plan.decisions)


@pytest.mark.slow
@pytest.mark.usefixtures("spmd")
@pytest.mark.parametrize("kind", ["skyreels-df", "chronoedit"])
def test_cfg_parallel_runs_the_calls_it_cannot_batch_as_plain_forwards_matching_eager(kind, tmp_path):
    """Diffusion forcing passes its fps and flag as extra arguments, ChronoEdit calls its transformer outside
    cache contexts: no guidance pair `CFGBatched` can batch. Each call runs as it is, on the transformer
    compiled without ``cfg_parallel`` (with it, ``on`` refuses a batch-1 graph)."""
    from wancompile.pipeline import compilation

    pipe, result = _compiled_and_eager(kind, tmp_path, cfg_parallel=True)
    assert result.pcc >= PCC and result.max_abs <= FRAMES_MAX_ABS, result
    cfg = compilation(pipe).cfg
    assert (cfg.batched, cfg.served, cfg.fallthrough) == (0, 0, 2 * STEPS)
    (program,) = compilation(pipe).programs()  # the batch-1 graph, no CFG split
    _assert_planned_dit(program)
    assert program.plan.cfg_parallel is None
