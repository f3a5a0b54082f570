"""The other Wan pipelines through `wancompile.compile_pipeline`: diffusers' real `WanImageToVideoPipeline`
(Wan 2.1 style with a CLIP image encoder; Wan 2.2 style with two experts and no image encoder),
`WanVideoToVideoPipeline`, `WanVACEPipeline` and `WanAnimatePipeline`, from the tiny components diffusers' own
pipeline tests use (tests/pipelines/wan/test_wan_image_to_video.py, test_wan_22_image_to_video.py,
test_wan_video_to_video.py, test_wan_vace.py, test_wan_animate.py; Animate's motion encoder and face adapter
made small here), without text encoder (random prompt embeddings). Each compiled pipeline on 2x4 is judged against the same
pipeline run eagerly in fp32, frames in [0, 1]: PCC >= 0.99999, max-abs <= 1e-5 (seen: <= 2.7e-7).
"""

import json

import numpy as np
import pytest
import torch

FRAMES_MAX_ABS, PCC = 1e-5, 0.99999


def _components(in_channels: int, seed: int = 0, **transformer):
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanTransformer3DModel

    from wancompile.models import TINY_PIPELINE_TRANSFORMER, TINY_PIPELINE_VAE

    torch.manual_seed(0)
    vae = AutoencoderKLWan(**TINY_PIPELINE_VAE).eval()
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    torch.manual_seed(seed)
    dit = WanTransformer3DModel(**dict(TINY_PIPELINE_TRANSFORMER, in_channels=in_channels, **transformer)).eval()
    return dict(tokenizer=None, text_encoder=None, vae=vae, scheduler=scheduler, transformer=dit)


def _image(size: int = 32):
    from PIL import Image

    g = np.random.default_rng(0)
    return Image.fromarray(g.integers(0, 256, (size, size, 3), dtype=np.uint8))


def _clip(size: int = 32):
    """diffusers' tiny CLIP image encoder of the I2V tests (`size` x `size` images, 4-wide tokens) and its
    processor, as the pipelines' keyword arguments."""
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModelWithProjection

    torch.manual_seed(0)
    config = CLIPVisionConfig(
        hidden_size=4,
        projection_dim=4,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=size,
        intermediate_size=16,
        patch_size=1,
    )
    encoder = CLIPVisionModelWithProjection(config).eval()
    return dict(image_encoder=encoder, image_processor=CLIPImageProcessor(crop_size=size, size=size))


def build(kind: str):
    """(pipeline, its call kwargs besides prompt embeddings, generator and steps)."""
    from PIL import Image

    if kind == "i2v-wan2.1":  # image_dim: the DiT attends to the CLIP image tokens too
        from diffusers import WanImageToVideoPipeline

        pipe = WanImageToVideoPipeline(**_components(36, image_dim=4), **_clip())
        return pipe, dict(image=_image(), height=32, width=32, num_frames=9)
    if kind == "i2v-wan2.2":  # two experts, no image encoder; the image latents concatenated on channels
        from diffusers import WanImageToVideoPipeline, WanTransformer3DModel

        from wancompile.models import TINY_PIPELINE_TRANSFORMER

        torch.manual_seed(1)
        low = WanTransformer3DModel(**dict(TINY_PIPELINE_TRANSFORMER, in_channels=36)).eval()
        pipe = WanImageToVideoPipeline(
            **_components(36), transformer_2=low, image_encoder=None, image_processor=None, boundary_ratio=0.875
        )
        return pipe, dict(image=_image(), height=32, width=32, num_frames=9)
    if kind == "v2v":
        from diffusers import WanVideoToVideoPipeline
        from PIL import Image

        video = [Image.fromarray(np.asarray(_image()) // (i + 1)) for i in range(9)]
        return WanVideoToVideoPipeline(**_components(16)), dict(video=video, height=32, width=32, strength=0.8)
    if kind == "vace":  # diffusers' tiny VACE DiT: 3 blocks, VACE context blocks at 0 and 2
        from diffusers import WanVACEPipeline, WanVACETransformer3DModel

        from wancompile.models import TINY_PIPELINE_TRANSFORMER

        parts = _components(16)
        torch.manual_seed(0)
        parts["transformer"] = WanVACETransformer3DModel(
            **dict(TINY_PIPELINE_TRANSFORMER, num_layers=3, vace_layers=[0, 2], vace_in_channels=96)
        ).eval()
        video = [Image.fromarray(np.asarray(_image()) // (i + 1)) for i in range(9)]
        mask = [Image.new("L", (32, 32), 255 if i % 2 else 0) for i in range(9)]
        return WanVACEPipeline(**parts), dict(video=video, mask=mask, height=32, width=32, num_frames=9)
    if kind == "animate":  # diffusers' tiny Animate DiT (image_dim 4), a small motion encoder and face adapter
        from diffusers import WanAnimatePipeline, WanAnimateTransformer3DModel

        from wancompile.models import FAMILIES, TINY_PIPELINE_TRANSFORMER

        # the tiny Animate family's motion encoder and face adapters (its default motion batch size)
        motion = {
            k: v
            for k, v in FAMILIES["animate"].transformer.items()
            if k.startswith(("motion_", "face_", "inject_")) and k != "motion_encoder_batch_size"
        }
        parts = _components(16)
        torch.manual_seed(0)
        parts["transformer"] = WanAnimateTransformer3DModel(
            **dict(TINY_PIPELINE_TRANSFORMER, in_channels=36, image_dim=4), **motion
        ).eval()
        pipe = WanAnimatePipeline(**parts, **_clip(size=4))
        pose = [Image.fromarray(np.asarray(_image()) // (i + 1)) for i in range(9)]
        face = [f.resize((16, 16)) for f in pose]
        return pipe, dict(image=_image(), pose_video=pose, face_video=face, height=32, width=32, segment_frame_length=9)
    raise ValueError(kind)


def _run(pipe, kwargs, steps: int):
    g = torch.Generator().manual_seed(0)
    embeds = dict(
        prompt_embeds=torch.randn(1, 16, 32, generator=g), negative_prompt_embeds=torch.randn(1, 16, 32, generator=g)
    )
    with torch.no_grad():
        out = pipe(
            **embeds,
            **kwargs,
            generator=torch.Generator().manual_seed(1),
            num_inference_steps=steps,
            guidance_scale=6.0,
            output_type="np",
        ).frames
    return torch.from_numpy(np.asarray(out))


@pytest.mark.slow
@pytest.mark.usefixtures("spmd")
@pytest.mark.parametrize("kind", ["i2v-wan2.1", "i2v-wan2.2", "v2v", "vace", "animate"])
def test_pipeline_matches_eager_on_2x4(kind, tmp_path):
    import wancompile
    from wancompile.pipeline import compilation
    from wancompile.verify import numerics

    torch._dynamo.reset()
    pipe, kwargs = build(kind)
    pipe.set_progress_bar_config(disable=True)
    steps = 4 if kind == "i2v-wan2.2" else 2  # boundary 0.875: step 1 runs `transformer`, steps 2-4 `transformer_2`
    ref = _run(pipe, kwargs, steps)
    original = pipe.transformer
    wancompile.compile_pipeline(pipe, mesh="2x4", dump_dir=tmp_path)
    frames = _run(pipe, kwargs, steps)
    result = numerics(frames, ref)
    assert result.pcc >= PCC and result.max_abs <= FRAMES_MAX_ABS, result

    state = compilation(pipe)
    experts = ("transformer", "transformer_2") if kind == "i2v-wan2.2" else ("transformer",)
    assert state.transformers == experts
    (program,) = state.programs()  # one DiT graph, for both experts where there are two
    assert program.plan.weight_sets == len(experts)
    for expert in experts:
        assert json.loads((tmp_path / expert / "plan.json").read_text())["weight_sets"] == len(experts)
    assert (tmp_path / "vae" / "plan.json").exists()
    wancompile.restore_pipeline(pipe)
    assert pipe.transformer is original


def test_a_pipeline_outside_the_table_is_refused_with_the_table():
    import wancompile
    from wancompile.models import build_tiny_pipeline
    from wancompile.pipeline import PIPELINES, transformer_attributes

    pipe = build_tiny_pipeline(two_experts=False)

    class MyWanPipeline(type(pipe)):  # a subclass keeps its base's row
        pass

    assert transformer_attributes(MyWanPipeline.__new__(MyWanPipeline)) == PIPELINES["WanPipeline"]

    class Lookalike:  # a WanPipeline's attributes, but not a pipeline of the table
        vae, transformer, encode_prompt = pipe.vae, pipe.transformer, pipe.encode_prompt

    with pytest.raises(TypeError, match=r"got Lookalike; compile its transformer with torch.compile") as error:
        wancompile.compile_pipeline(Lookalike(), mesh="2x4")
    assert all(name in str(error.value) for name in PIPELINES)
