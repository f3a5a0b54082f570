"""The Wan models we plan for, as data: public configs (DESIGN.md §9), resolutions, example inputs.

Full-size configs are built on the meta device (no weights, no memory); ``tiny`` is a random-weight
stand-in with the same structure that runs on CPU in tests.

Why ~400 lines: half of it is the two tables (`MODELS`, the public configs and resolutions; `FAMILIES`, a
tiny model per Wan-family DiT with the inputs its forward takes); the code is the builders that read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch


@dataclass(frozen=True)
class WanModel:
    name: str
    transformer: dict[str, Any]
    vae_stride: tuple[int, int, int] = (4, 8, 8)
    text_len: int = 512
    resolutions: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (height, width) in pixels
    description: str = ""
    default_resolution: str = "720p"  # what `wancompile plan` plans without --resolution
    default_frames: int = 81  # and without --frames

    def latent_shape(self, resolution: str, frames: int) -> tuple[int, int, int]:
        """(T, H, W) of the latent for a pixel resolution name and frame count."""
        if resolution not in self.resolutions:
            raise ValueError(
                f"unknown resolution {resolution!r} for {self.name}; choose one of {sorted(self.resolutions)}"
            )
        if frames < 1 or (frames - 1) % self.vae_stride[0]:
            raise ValueError(
                f"frames must be 4k+1 (e.g. 81) for the Wan VAE's temporal stride {self.vae_stride[0]}; got {frames}"
            )
        h, w = self.resolutions[resolution]
        return (frames - 1) // self.vae_stride[0] + 1, h // self.vae_stride[1], w // self.vae_stride[2]

    def tokens(self, resolution: str, frames: int) -> int:
        t, h, w = self.latent_shape(resolution, frames)
        pt, ph, pw = self.transformer["patch_size"]
        return (t // pt) * (h // ph) * (w // pw)


_A14B = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=40,
    attention_head_dim=128,
    in_channels=16,
    out_channels=16,
    text_dim=4096,
    freq_dim=256,
    ffn_dim=13824,
    num_layers=40,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    eps=1e-6,
)
_A14B_RESOLUTIONS = {"480p": (480, 832), "720p": (720, 1280)}

MODELS: dict[str, WanModel] = {
    m.name: m
    for m in [
        WanModel(
            "wan2.2-t2v-a14b",
            _A14B,
            resolutions=_A14B_RESOLUTIONS,
            description="Wan 2.2 T2V-A14B, one of its two experts (identical structure)",
        ),
        WanModel(
            "wan2.2-i2v-a14b",
            {**_A14B, "in_channels": 36},
            resolutions=_A14B_RESOLUTIONS,
            description="Wan 2.2 I2V-A14B, one expert; image latents concatenated on channels",
        ),
        WanModel(
            "wan2.2-ti2v-5b",
            dict(_A14B, num_attention_heads=24, in_channels=48, out_channels=48, ffn_dim=14336, num_layers=30),
            vae_stride=(4, 16, 16),
            resolutions={"480p": (480, 832), "720p": (704, 1280)},
            description="Wan 2.2 TI2V-5B (Wan 2.2 VAE, 16x spatial)",
        ),
        WanModel(
            "tiny",
            dict(
                _A14B,
                num_attention_heads=4,
                attention_head_dim=16,
                in_channels=4,
                out_channels=4,
                text_dim=32,
                freq_dim=16,
                ffn_dim=96,
                num_layers=2,
                rope_max_seq_len=32,
            ),
            vae_stride=(4, 8, 8),
            text_len=7,
            resolutions={"tiny": (64, 64), "480p": (48, 64)},
            description="random-weight stand-in: 2 blocks, 4 heads x 16",
            default_resolution="tiny",
            default_frames=9,
        ),
    ]
}


def _lookup(table: dict[str, Any], name: str, what: str) -> Any:
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown {what} {name!r}; choose one of {sorted(table)}") from None


def get_model(name: str) -> WanModel:
    return _lookup(MODELS, name, "model")


def build_transformer(
    name: str, *, device: str | torch.device = "cpu", num_layers: Optional[int] = None, seed: int = 0, **overrides: Any
) -> torch.nn.Module:
    """A `WanTransformer3DModel` for a registered config: random weights on CPU (seeded), or
    weightless on ``device="meta"``."""
    from diffusers import WanTransformer3DModel

    cfg = dict(get_model(name).transformer, **overrides)
    if num_layers is not None:
        cfg["num_layers"] = num_layers
    if str(device) == "meta":
        with torch.device("meta"):
            return WanTransformer3DModel(**cfg).eval()
    torch.manual_seed(seed)
    return WanTransformer3DModel(**cfg).eval().to(device)


def as_loaded(module: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """`module` in `dtype` as a diffusers pipeline loads it (``from_pretrained(torch_dtype=dtype)``): every
    floating parameter and buffer cast, but those of the modules the model class keeps in fp32
    (``_keep_in_fp32_modules``: Wan's RoPE tables, time embedder, modulation tables and block norms),
    matched as diffusers matches them, by a name component."""
    keep = set(getattr(module, "_keep_in_fp32_modules", None) or ()) if dtype != torch.float32 else set()
    with torch.no_grad():
        for name, t in [*module.named_parameters(), *module.named_buffers()]:
            if t.is_floating_point() and not keep & set(name.split(".")):
                t.data = t.data.to(dtype)
    return module


def transformer_inputs(
    name: str,
    resolution: str,
    frames: int,
    *,
    device: str | torch.device = "cpu",
    batch: int = 1,
    seed: int = 1,
    dtype: torch.dtype = torch.float32,
) -> dict[str, torch.Tensor]:
    """Example `WanTransformer3DModel.forward` kwargs: latent video, timestep, prompt embeddings."""
    model = get_model(name)
    t, h, w = model.latent_shape(resolution, frames)
    cfg = model.transformer
    shapes = {
        "hidden_states": (batch, cfg["in_channels"], t, h, w),
        "encoder_hidden_states": (batch, model.text_len, cfg["text_dim"]),
    }
    if str(device) == "meta":
        out = {k: torch.empty(s, device="meta", dtype=dtype) for k, s in shapes.items()}
        out["timestep"] = torch.empty((batch,), device="meta", dtype=torch.long)
        return out
    g = torch.Generator().manual_seed(seed)
    out = {k: torch.randn(s, generator=g, dtype=dtype) for k, s in shapes.items()}
    out["timestep"] = torch.full((batch,), 500, dtype=torch.long)
    return {k: v.to(device) for k, v in out.items()}


# diffusers' own tiny Wan pipeline components (tests/pipelines/wan/test_wan.py, test_wan_22.py):
# a 2-block DiT with 2 heads x 12, text_dim 32, and a 3-channel Wan 2.1 VAE.
# (the tiny DiT's config at their sizes; no `eps`, as their tests write it: diffusers' default, 1e-6)
TINY_PIPELINE_TRANSFORMER = {
    k: v
    for k, v in dict(
        MODELS["tiny"].transformer,
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=16,
        out_channels=16,
        freq_dim=256,
        ffn_dim=32,
    ).items()
    if k != "eps"
}
TINY_PIPELINE_VAE = dict(
    base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True]
)


def build_tiny_pipeline(
    *, two_experts: bool = True, seed: int = 0, boundary_ratio: float = 0.875, transformer: Optional[dict] = None
):
    """diffusers' real `WanPipeline` from tiny random components, as diffusers' pipeline tests build them,
    without tokenizer or text encoder (call it with ``prompt_embeds``/``negative_prompt_embeds``, e.g.
    `tiny_pipeline_inputs`).

    ``two_experts=True``: Wan 2.2 style, `transformer_2` and `boundary_ratio` set, the two experts with
    different random weights (seeds `seed` and `seed + 1`); False: Wan 2.1 style, one transformer.
    `transformer` overrides entries of the DiT config."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel

    cfg = dict(TINY_PIPELINE_TRANSFORMER, **(transformer or {}))
    torch.manual_seed(seed)
    vae = AutoencoderKLWan(**TINY_PIPELINE_VAE).eval()
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    torch.manual_seed(seed)
    high = WanTransformer3DModel(**cfg).eval()
    low = None
    if two_experts:
        torch.manual_seed(seed + 1)
        low = WanTransformer3DModel(**cfg).eval()
    return WanPipeline(
        tokenizer=None,
        text_encoder=None,
        transformer=high,
        vae=vae,
        scheduler=scheduler,
        transformer_2=low,
        boundary_ratio=boundary_ratio if two_experts else None,
    )


def tiny_pipeline_inputs(
    pipe,
    *,
    seed: int = 0,
    steps: int = 2,
    height: int = 32,
    width: int = 32,
    frames: int = 9,
    text_len: int = 16,
    guidance_scale: float = 6.0,
) -> dict[str, Any]:
    """`WanPipeline.__call__` kwargs for `build_tiny_pipeline`: random prompt embeddings (cond and uncond),
    a seeded generator, a few steps; the caller picks ``output_type``."""
    model = pipe.transformer if pipe.transformer is not None else pipe.transformer_2
    text_dim = model.config.text_dim
    g = torch.Generator().manual_seed(seed)
    return dict(
        prompt_embeds=torch.randn(1, text_len, text_dim, generator=g),
        negative_prompt_embeds=torch.randn(1, text_len, text_dim, generator=g),
        generator=torch.Generator().manual_seed(seed + 1),
        num_inference_steps=steps,
        guidance_scale=guidance_scale,
        height=height,
        width=width,
        num_frames=frames,
    )


# --- the other Wan-family DiTs diffusers ships, tiny, as data ----------------------------------------


@dataclass(frozen=True)
class FamilyConfig:
    """A Wan-family DiT as data: the diffusers class, a tiny random-weight config (the ``tiny`` DiT's
    4 heads x 16, 2 blocks, plus what the family adds) and its example forward call: ``inputs`` are
    seeded random tensors by shape, ``call`` other kwargs as given (flags, ``fps``); ``timestep`` is a
    long tensor of ``timestep`` (nested ints) if given, else 500 per sample."""

    name: str
    diffusers_class: str
    transformer: dict[str, Any]
    inputs: dict[str, tuple[int, ...]]
    call: dict[str, Any] = field(default_factory=dict)
    timestep: Any = None
    description: str = ""


_TINY_DIT = dict(MODELS["tiny"].transformer)
_VIDEO = {"hidden_states": (1, 4, 3, 8, 8), "encoder_hidden_states": (1, 7, 32)}  # 3 x 4 x 4 = 48 tokens

FAMILIES: dict[str, FamilyConfig] = {
    f.name: f
    for f in [
        FamilyConfig("wan-t2v", "WanTransformer3DModel", _TINY_DIT, _VIDEO, description="Wan 2.1 / 2.2 T2V"),
        FamilyConfig(
            "wan-i2v",
            "WanTransformer3DModel",
            # Wan 2.1 I2V layout: latents, mask and image condition on channels (4 + 4 + 4), CLIP image tokens
            dict(_TINY_DIT, in_channels=12, image_dim=16),
            {**_VIDEO, "hidden_states": (1, 12, 3, 8, 8), "encoder_hidden_states_image": (1, 5, 16)},
            description="Wan 2.1 I2V: the CLIP image tokens joined to the prompt's for cross-attention",
        ),
        FamilyConfig(
            "wan-flf2v",
            "WanTransformer3DModel",
            # first and last frame: two images' CLIP tokens, viewed as one sequence with a learnt position embedding
            dict(_TINY_DIT, in_channels=12, image_dim=16, pos_embed_seq_len=10),
            {**_VIDEO, "hidden_states": (1, 12, 3, 8, 8), "encoder_hidden_states_image": (2, 5, 16)},
            description="Wan 2.1 FLF2V: first- and last-frame image tokens with a position embedding",
        ),
        FamilyConfig(
            "wan-ti2v",
            "WanTransformer3DModel",
            _TINY_DIT,
            _VIDEO,
            # Wan 2.2 TI2V: a timestep per token (the first latent frame, the given image, at 0)
            timestep=[[0] * 16 + [500] * 32],
            description="Wan 2.2 TI2V: a timestep per token, so a per-token (B, L, 6, D) modulation",
        ),
        # as diffusers' tests/models/transformers/test_models_transformer_wan_vace.py, at the tiny DiT's width
        FamilyConfig(
            "vace",
            "WanVACETransformer3DModel",
            dict(_TINY_DIT, vace_layers=[0, 1], vace_in_channels=8),
            {**_VIDEO, "control_hidden_states": (1, 8, 3, 8, 8)},
            description="Wan VACE: a control stack (vace_blocks) whose hints are added to the main blocks' outputs",
        ),
        FamilyConfig(
            "skyreels-t2v",
            "SkyReelsV2Transformer3DModel",
            _TINY_DIT,
            _VIDEO,
            description="SkyReels-V2 T2V: one timestep per sample, as SkyReelsV2Pipeline calls it",
        ),
        FamilyConfig(
            "skyreels-df",
            "SkyReelsV2Transformer3DModel",
            dict(_TINY_DIT, inject_sample_info=True),
            _VIDEO,
            # fps 24 -> embedding index 1, as SkyReelsV2DiffusionForcingPipeline calls it
            call={"enable_diffusion_forcing": True, "fps": [1]},
            timestep=[[999, 750, 500]],
            description="SkyReels-V2 diffusion forcing: a timestep per latent frame and the fps embedding",
        ),
        FamilyConfig(
            "chronoedit",
            "ChronoEditTransformer3DModel",
            # Wan 2.1 I2V layout: latents, mask and image condition on channels (4 + 4 + 4), CLIP image tokens
            dict(_TINY_DIT, in_channels=12, image_dim=16, rope_temporal_skip_len=8),
            {
                # ChronoEdit's edit step: 2 latent frames (input image, edited image); its RoPE then
                # reads temporal positions 0 and temporal_skip_len - 1 (`freqs[:skip][[0, -1]]`)
                "hidden_states": (1, 12, 2, 8, 8),
                "encoder_hidden_states": (1, 7, 32),
                "encoder_hidden_states_image": (1, 5, 16),
            },
            description="ChronoEdit (Wan 2.1 I2V based image editing), its two-frame edit step",
        ),
        FamilyConfig(
            "animate",
            "WanAnimateTransformer3DModel",
            dict(
                _TINY_DIT,
                in_channels=12,
                latent_channels=4,
                image_dim=16,
                # the motion encoder at 16x16 faces (2 residual blocks), as diffusers' own tiny test
                motion_encoder_channel_sizes={"4": 16, "8": 16, "16": 16},
                motion_encoder_size=16,
                motion_style_dim=8,
                motion_dim=4,
                motion_encoder_dim=16,
                face_encoder_hidden_dim=16,
                face_encoder_num_heads=2,
                inject_face_latents_blocks=2,
                # 5 face frames in batches of 4: the motion encoder runs twice (the real model: 77 in 8s)
                motion_encoder_batch_size=4,
            ),
            {
                # T + 1 = 3 latent frames, pose on T = 2; 5 face frames -> 2 after the face encoder's
                # two stride-2 convs, + 1 padding frame = 3 (one face-attention group per latent frame)
                "hidden_states": (1, 12, 3, 8, 8),
                "encoder_hidden_states": (1, 7, 32),
                "encoder_hidden_states_image": (1, 5, 16),
                "pose_hidden_states": (1, 4, 2, 8, 8),
                "face_pixel_values": (1, 3, 5, 16, 16),
            },
            description="Wan 2.2 Animate: pose latents, a face motion encoder and face cross-attention adapters",
        ),
    ]
}


def get_family(name: str) -> FamilyConfig:
    return _lookup(FAMILIES, name, "model family")


def build_family(name: str, *, seed: int = 0, **overrides: Any) -> tuple[torch.nn.Module, dict[str, Any]]:
    """(the family's diffusers DiT with its tiny config and `overrides`, random weights (seeded), eval
    mode; its example forward kwargs: `family_inputs`)."""
    import diffusers

    family = get_family(name)
    torch.manual_seed(seed)
    model = getattr(diffusers, family.diffusers_class)(**dict(family.transformer, **overrides)).eval()
    return model, family_inputs(name, seed=seed + 1)


def family_inputs(name: str, *, seed: int = 1) -> dict[str, Any]:
    """Example forward kwargs for `build_family(name)`: seeded random tensors, the family's call kwargs."""
    family = get_family(name)
    g = torch.Generator().manual_seed(seed)
    out: dict[str, Any] = {k: torch.randn(s, generator=g) for k, s in family.inputs.items()}
    batch = family.inputs["hidden_states"][0]
    out["timestep"] = torch.tensor(family.timestep) if family.timestep is not None else torch.full((batch,), 500)
    return {**out, **family.call}
