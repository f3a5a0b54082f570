"""conv1x1 and patch_embed: convolutions that are linears over channels / over patches."""

from __future__ import annotations

import torch
import torch.nn as nn
from expecttest import assert_expected_inline

from rewrites import apply_rewrites

from conftest import capture, normalized_code


class PatchEmbed(nn.Module):
    """The DiT's patchify: conv3d with kernel == stride, then flatten(2).transpose(1, 2) to (B, L, D)."""

    def __init__(self, patch=(1, 2, 2)):
        super().__init__()
        self.patch_embedding = nn.Conv3d(4, 8, kernel_size=patch, stride=patch)

    def forward(self, x):
        return self.patch_embedding(x).flatten(2).transpose(1, 2)


def rewrite(name, fn, *args):
    ((gm, inputs),) = capture(fn, *args)
    with torch.no_grad():
        expected = gm(*inputs)[0]
    _, (report,) = apply_rewrites(gm, [name])
    with torch.no_grad():
        error = (gm(*inputs)[0] - expected).abs().max().item()
    return gm, report, error


def test_golden_causal_conv_shortcut():
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d

    torch.manual_seed(0)
    model = nn.Module()
    model.conv_shortcut = WanCausalConv3d(4, 8, 1)
    gm, report, error = rewrite("conv1x1", lambda x: model.conv_shortcut(x), torch.randn(1, 4, 2, 3, 3))
    assert (report.where, error <= 1e-6) == (("conv_shortcut",), True)
    assert_expected_inline(
        normalized_code(gm),
        """\
def forward(self, L_x_ : torch.Tensor, L_model_modules_conv_shortcut_parameters_weight_ : torch.nn.parameter.Parameter, L_model_modules_conv_shortcut_parameters_bias_ : torch.nn.parameter.Parameter):
    x = torch._C._nn.pad(l_x_, [0, 0, 0, 0, 0, 0], 'constant', None)
    movedim = x.movedim(1, -1)
    flatten = l_model_modules_conv_shortcut_parameters_weight_.flatten(1)
    linear = torch._C._nn.linear(movedim, flatten, l_model_modules_conv_shortcut_parameters_bias_)
    movedim_1 = linear.movedim(-1, 1)
    return (movedim_1,)""",
    )


def test_conv2d_1x1_becomes_a_linear_too():
    torch.manual_seed(0)
    conv = nn.Conv2d(16, 48, 1)
    gm, report, error = rewrite("conv1x1", conv, torch.randn(3, 16, 4, 4))
    assert report.count == 1 and error <= 1e-6
    assert not any(n.target is torch.conv2d for n in gm.graph.nodes)


def test_a_strided_1x1_conv_is_left_alone():
    conv = nn.Conv3d(4, 8, 1, stride=2)
    gm, report, _ = rewrite("conv1x1", conv, torch.randn(1, 4, 2, 4, 4))
    assert report.count == 0 and report.skipped == ("<root>: stride (2, 2, 2) is not (1, 1, 1)",)


def test_golden_patch_embedding():
    torch.manual_seed(0)
    gm, report, error = rewrite("patch_embed", PatchEmbed(), torch.randn(1, 4, 3, 4, 6))
    assert (report.where, error <= 1e-6) == (("patch_embedding",), True)
    assert_expected_inline(
        normalized_code(gm),
        """\
def forward(self, L_self_modules_patch_embedding_parameters_weight_ : torch.nn.parameter.Parameter, L_self_modules_patch_embedding_parameters_bias_ : torch.nn.parameter.Parameter, L_x_ : torch.Tensor):
    unflatten = l_x_.unflatten(4, (-1, 2))
    unflatten_1 = unflatten.unflatten(3, (-1, 2))
    unflatten_2 = unflatten_1.unflatten(2, (-1, 1))
    permute = unflatten_2.permute(0, 2, 4, 6, 1, 3, 5, 7)
    flatten_1 = permute.flatten(4)
    patches = flatten_1.flatten(1, 3)
    flatten_2 = l_self_modules_patch_embedding_parameters_weight_.flatten(1)
    tokens = torch._C._nn.linear(patches, flatten_2, l_self_modules_patch_embedding_parameters_bias_)
    return (tokens,)""",
    )


def test_patch_embedding_with_a_temporal_patch():
    torch.manual_seed(0)
    gm, report, error = rewrite("patch_embed", PatchEmbed((2, 2, 2)), torch.randn(2, 4, 4, 4, 6))
    assert report.count == 1 and error <= 1e-6


def test_an_input_that_is_not_a_multiple_of_the_patch_is_left_alone():
    gm, report, _ = rewrite("patch_embed", PatchEmbed(), torch.randn(1, 4, 3, 5, 6))
    assert report.count == 0
    assert report.skipped == (
        "patch_embedding: input extent (3, 5, 6) is not a static multiple of the kernel (1, 2, 2)",
    )
    assert any(n.target is torch.conv3d for n in gm.graph.nodes)


def test_a_patch_conv_used_channels_first_becomes_a_linear_put_back_channels_first():
    """Wan Animate adds its pose patches into frames 1.. before flattening: no 3-D convolution is left."""
    torch.manual_seed(0)
    conv = nn.Conv3d(4, 8, (1, 2, 2), stride=(1, 2, 2))
    gm, report, error = rewrite("patch_embed", lambda x: conv(x)[:, :, 1:] * 2, torch.randn(1, 4, 3, 4, 6))
    assert (report.count, report.skipped, error <= 1e-6) == (1, (), True)
    assert not any(n.target is torch.conv3d for n in gm.graph.nodes)


def test_a_conv_whose_stride_is_not_its_kernel_is_not_a_candidate():
    conv = nn.Conv3d(4, 8, 3, stride=1, padding=1)
    gm, report, _ = rewrite("patch_embed", conv, torch.randn(1, 4, 3, 4, 4))
    assert (report.count, report.skipped) == (0, ())
