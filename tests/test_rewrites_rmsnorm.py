"""rmsnorm: the VAE's F.normalize(x) * C**0.5 * gamma (+ bias) chain becomes one rms_norm over channels."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from expecttest import assert_expected_inline

from rewrites import apply_rewrites

from conftest import capture, normalized_code


def wan_rms_norm(channels: int = 4, **kwargs):
    """diffusers' WanRMS_norm as ``norm`` of a module, on a (B, C, T, H, W) input, random gamma."""
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanRMS_norm

    torch.manual_seed(0)
    model = nn.Module()
    model.norm = WanRMS_norm(channels, images=False, **kwargs)
    with torch.no_grad():
        model.norm.gamma.uniform_(0.5, 1.5)
        if kwargs.get("bias"):
            model.norm.bias.uniform_(-1, 1)
    return model


def rewritten(model, x):
    ((gm, inputs),) = capture(lambda t: model.norm(t), x)
    _, (report,) = apply_rewrites(gm, ["rmsnorm"])
    return gm, inputs, report


def test_golden_channel_first_wan_rms_norm():
    gm, _, report = rewritten(wan_rms_norm(), torch.randn(1, 4, 2, 3, 3))
    assert report.where == ("norm",)
    assert_expected_inline(
        normalized_code(gm),
        """\
def forward(self, L_t_ : torch.Tensor, L_model_modules_norm_parameters_gamma_ : torch.nn.parameter.Parameter):
    movedim = l_t_.movedim(1, -1)
    reshape = l_model_modules_norm_parameters_gamma_.reshape((4,))
    rms_norm = torch.nn.functional.rms_norm(movedim, (4,), reshape, 2.5e-25)
    movedim_1 = rms_norm.movedim(-1, 1)
    return (movedim_1,)""",
    )


@pytest.mark.parametrize("kwargs", [{}, {"bias": True}, {"channel_first": False}])
def test_rms_norm_matches_the_chain_within_1e_6(kwargs):
    model = wan_rms_norm(16, **kwargs)
    x = torch.randn(2, 16, 3, 5, 5) * 3 if kwargs.get("channel_first", True) else torch.randn(2, 3, 5, 5, 16) * 3
    gm, inputs, report = rewritten(model, x)
    assert report.count == 1
    with torch.no_grad():
        assert (gm(*inputs)[0] - model.norm(x)).abs().max().item() <= 1e-6


def test_eps_mapping_keeps_zero_and_tiny_channel_vectors_finite_and_bounded():
    model = wan_rms_norm(16)
    x = torch.randn(1, 16, 1, 4, 4)
    x[..., 0, 0] = 0.0  # a zero vector: 0 in both forms, no 0/0
    x[..., 1, 1] *= 1e-14  # norm below normalize's eps = 1e-12: the eps regimes differ
    x[..., 2, 2] *= 1e-6  # norm well above eps: rounding only
    gm, inputs, _ = rewritten(model, x)
    with torch.no_grad():
        new, old = gm(*inputs)[0], model.norm(x)
    assert torch.isfinite(new).all() and torch.equal(new[..., 0, 0], old[..., 0, 0])
    tiny = old[..., 1, 1].abs()  # documented bound there: |Δ| ≤ |y| · (1 - 1/√2)
    assert ((new[..., 1, 1] - old[..., 1, 1]).abs() <= tiny * (1 - 2**-0.5) + 1e-7).all()
    assert (new - old)[..., 2:, 2:].abs().max().item() <= 1e-6


def test_a_scale_other_than_sqrt_channels_is_left_alone():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.gamma = nn.Parameter(torch.ones(4, 1, 1, 1))

        def forward(self, x):
            return torch.nn.functional.normalize(x, dim=1) * 3.0 * self.gamma

    ((gm, _),) = capture(Scaled(), torch.randn(1, 4, 2, 3, 3))
    before = gm.code
    _, (report,) = apply_rewrites(gm, ["rmsnorm"])
    assert report.count == 0 and "not followed by '* 4**0.5'" in report.skipped[0]
    assert gm.code == before


def test_a_bf16_chain_is_left_alone():
    model = wan_rms_norm(4).to(torch.bfloat16)
    ((gm, _),) = capture(lambda t: model.norm(t), torch.randn(1, 4, 2, 3, 3, dtype=torch.bfloat16))
    before = gm.code
    _, (report,) = apply_rewrites(gm, ["rmsnorm"])
    assert report.count == 0 and "not fp32 throughout" in report.skipped[0]
    assert gm.code == before
