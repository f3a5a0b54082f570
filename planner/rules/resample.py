"""VAE glue ops: ``pad``, ``interpolate``, ``clamp``, and the no-op ``_log_api_usage_once``.

- ``pad(x, pads)`` (the causal convs' explicit zero padding): every split survives, padded dims
  included: the consuming convolution exchanges the halo (`planner.rules.conv`), which is where
  GSPMD puts the collective-permutes for pad + conv (measured). No communication here.
- ``interpolate``: a split spatial dim is gathered first (torch_xla's nearest upsample under a
  spatial split made GSPMD all-reduce the whole image, docs/vae.md; the full-T walk writes the 2x
  upsample as a broadcast + reshape instead, which the view rules keep local).
- ``clamp``: elementwise.
"""

from __future__ import annotations

from planner.placements import Layout, numel
from planner.rules import OpView, RuleResult, register_rule


@register_rule("pad")
def pad_rule(op: OpView) -> RuleResult:
    xl = op.keep(0) or Layout.replicated(op.ndim(0))
    out_bytes = numel(op.local(op.out.shape, xl)) * op.out.itemsize
    return RuleResult((xl,) + (None,) * (len(op.ins) - 1), (xl,), bytes=out_bytes)


@register_rule("interpolate", "upsample_nearest2d", "upsample_bilinear2d")
def interpolate_rule(op: OpView) -> RuleResult:
    xl = op.keep(0) or Layout.replicated(op.ndim(0))
    req = Layout(xl.dims[:2] + ((),) * (xl.ndim - 2))
    out_bytes = numel(op.local(op.out.shape, req)) * op.out.itemsize
    return RuleResult(
        (req,) + (None,) * (len(op.ins) - 1),
        (req,),
        bytes=out_bytes,
        note="interpolate: spatial dims gathered (no local lowering of a split upsample)",
    )


@register_rule("clamp", "clamp_min", "clamp_max", "clip")
def clamp_rule(op: OpView) -> RuleResult:
    xl = op.keep(0) or Layout.replicated(op.ndim(0))
    local = numel(op.local(op.out.shape, xl))
    return RuleResult((xl,) + (None,) * (len(op.ins) - 1), (xl,), flops=local, bytes=local * op.out.itemsize)


@register_rule("_log_api_usage_once")
def no_op_rule(op: OpView) -> RuleResult:
    return RuleResult(tuple(None for _ in op.ins), ())
