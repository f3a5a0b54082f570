"""Explicit halos (`wancompile.halo`): a spatially split convolution written so that no partitioner has
to exchange one, for tt-mlir, whose Shardy passes a conv's spatial dims through (tt-mlir #8216).

On the 8 virtual CPU devices (2x4): the same numbers as the unsharded conv, and in GSPMD's partitioned
HLO exactly the all-gathers the conv rule prices for a target without halos (`planner.rules.conv`)."""

import numpy as np
import pytest
import torch

from planner.hardware import get_profile
from planner.mesh import MeshSpec
from planner.placements import Layout
from planner.propagate import evaluate
from wancompile.capture import annotate, capture_fx
from wancompile.halo import halo_conv
from wancompile.verify import compare_collectives

from conftest import HLO_DUMP

MESH = MeshSpec((2, 4), ("batch", "model"))

CASES = {
    "conv3d, H over model, W over batch": ("conv3d", (1, 4, 3, 16, 8), (6, 4, 3, 3, 3), (0, 1, 1), "model", "batch"),
    "conv3d, H over both axes": ("conv3d", (1, 4, 3, 16, 8), (6, 4, 3, 3, 3), (0, 1, 1), ("batch", "model"), None),
    "conv3d, W over both axes": ("conv3d", (1, 4, 3, 8, 16), (6, 4, 3, 3, 3), (0, 1, 1), None, ("model", "batch")),
    "conv2d (the upsampler's), H over batch, W over model": (
        "conv2d",
        (3, 4, 8, 16),
        (6, 4, 3, 3),
        (1, 1),
        "batch",
        "model",
    ),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_explicit_halo_conv_is_exact_and_compiles_to_the_gathers_the_rule_prices(case):
    import torch_xla
    import torch_xla.distributed.spmd as xs

    from wancompile import hlo

    name, xshape, wshape, padding, h, w = CASES[case]
    conv = getattr(torch, name)
    spec = (None,) * (len(xshape) - 2) + (h, w)
    gen = torch.Generator().manual_seed(0)
    x, weight, bias = (torch.randn(s, generator=gen) for s in (xshape, wshape, wshape[:1]))
    mesh = xs.Mesh(np.arange(MESH.size), MESH.shape, MESH.axis_names)
    device = torch_xla.device()
    before = hlo.dump_state(HLO_DUMP)
    y = halo_conv(
        conv,
        x.to(device),
        weight.to(device),
        bias.to(device),
        1,
        padding,
        spec=spec,
        sizes=dict(zip(MESH.axis_names, MESH.shape)),
        mark=lambda t, sp: xs.mark_sharding(t, mesh, sp),
    )
    xs.mark_sharding(y, mesh, spec)
    torch_xla.sync()
    expected = conv(x, weight, bias, 1, padding)
    assert torch.allclose(y.cpu(), expected, atol=1e-4, rtol=1e-4)
    compiled = hlo.parse_collectives(hlo.main_module(hlo.new_modules(HLO_DUMP, before)).read_text(), MESH)

    graph = annotate(capture_fx(lambda a, b, c: conv(a, b, c, 1, padding), x, weight, bias), model="conv")
    (node,) = [n for n in graph if n.op == name]
    lay = Layout.from_spec(spec)
    ev = evaluate(
        graph,
        list(graph),
        MESH,
        get_profile("wh-loudbox"),
        boundary={node.inputs[0]: (lay,)},
        forced={node.name: lay},
        halo=False,
    )
    matches = compare_collectives(ev.events, compiled)
    assert matches and all(m.count_ok and m.predicted_bytes == m.observed_bytes for m in matches), matches
    assert {m.kind for m in matches} == {"all-gather"}  # the only exchange: every tile's edge rows
