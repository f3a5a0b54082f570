"""tt-mlir's reshards, as the planner models them (`planner.reshard`): which Shardy cannot lower (it lowers
no collective-permute, tt-mlir #3370), the route the planner takes instead, and what TTNN compiles.

The model is held against every pair of layouts of a rank-3 value over a 2x4 and an 8x4 mesh, measured
with one-op modules (`wancompile.tt.probe`; tests/data/tt_reshards_*.json, how they were made is their
``about``), and a few of them are compiled again here by tt-mlir itself."""

import json
from collections import Counter

import pytest

from planner.collective import Collective
from planner.graph import TensorMeta
from planner.mesh import MeshSpec
from planner.placements import Layout
from planner.reshard import permutes, redistribute, route
from planner.targets import TARGETS

from conftest import ROOT

TT = TARGETS["tt-mlir"]
MEASURED = {m: json.loads((ROOT / "tests" / "data" / f"tt_reshards_{m}.json").read_text()) for m in ("2x4", "8x4")}
MESH = MeshSpec((2, 4), ("batch", "model"))
META = TensorMeta(tuple(MEASURED["2x4"]["shape"]), "float32")


def _layout(dims) -> Layout:
    return Layout(tuple(tuple(d) for d in dims))


def _ttnn(actual: Layout, required: Layout, mesh: MeshSpec = MESH, meta: TensorMeta = META) -> dict:
    """The TTNN collectives the planner predicts for a reshard on tt-mlir: kind:axes -> count."""
    lowered = TT.lower([Collective(k, a, 1) for k, a, _ in redistribute(meta, actual, required, mesh, TT)], mesh)
    counts = Counter()
    for c in lowered:
        counts[f"{c.kind}:{'+'.join(c.axes)}"] += c.count
    return dict(counts)


def _pairs(mesh: str):
    data = MEASURED[mesh]
    pairs = [(_layout(p["from"]), _layout(p["to"]), p) for p in data["pairs"]]
    return MeshSpec(tuple(data["mesh"]), ("batch", "model")), pairs


@pytest.mark.parametrize("mesh", sorted(MEASURED))
def test_the_measurement_covers_refusals_and_lowerings(mesh):
    _, pairs = _pairs(mesh)
    assert len(pairs) >= 90
    assert sum(not p["lowered"] for *_, p in pairs) >= 30 and sum(p["lowered"] for *_, p in pairs) >= 30


@pytest.mark.parametrize("mesh", sorted(MEASURED))
def test_shardy_permutes_exactly_where_tt_mlir_refused(mesh):
    m, pairs = _pairs(mesh)
    wrong = [(p["from"], p["to"], p["lowered"]) for a, b, p in pairs if permutes(a, b, m) == p["lowered"]]
    assert not wrong, wrong


@pytest.mark.parametrize("mesh", sorted(MEASURED))
def test_every_lowered_reshard_compiles_to_the_predicted_ttnn_collectives(mesh):
    m, pairs = _pairs(mesh)
    wrong = [(p["from"], p["to"], p["ttnn"], _ttnn(a, b, m)) for a, b, p in pairs if p["lowered"]]
    assert not [w for w in wrong if w[2] != w[3]], wrong


@pytest.mark.parametrize("mesh", sorted(MEASURED))
def test_every_refused_reshard_has_a_route_whose_steps_tt_mlir_lowers(mesh):
    m, pairs = _pairs(mesh)
    for a, b, p in pairs:
        if p["lowered"]:
            continue
        vias = route(META, a, b, m, TT)
        assert vias, (p["from"], p["to"])
        steps = (a, *vias, b)
        assert not any(permutes(x, y, m) for x, y in zip(steps, steps[1:])), (p["from"], p["to"], vias)


def test_an_axis_swap_goes_through_the_layouts_it_lowers():
    """Tokens on batch and hidden on model -> the other way round (the stream of a plan whose FFN takes
    its tensor parallelism on the other axis): on 2x4, three all-to-alls of an eighth of the value each
    (model onto the tokens, both axes onto hidden, model back onto the tokens) move less than gathering."""
    tokens_batch = _layout([[], ["batch"], ["model"]])
    swapped = _layout([[], ["model"], ["batch"]])
    assert permutes(tokens_batch, swapped, MESH)
    assert route(META, tokens_batch, swapped, MESH, TT) == (
        _layout([[], ["batch", "model"], []]),
        _layout([[], [], ["batch", "model"]]),
    )
    assert [(k, a) for k, a, _ in redistribute(META, tokens_batch, swapped, MESH, TT)] == [
        ("all-to-all", ("model",)),
        ("all-to-all", ("batch", "model")),
        ("all-to-all", ("model",)),
    ]
    assert [k for k, *_ in redistribute(META, tokens_batch, swapped, MESH)] == ["all-to-all"]  # GSPMD: one


def _needs_tt():
    from wancompile.tt.env import available

    return pytest.mark.skipif(bool(available()), reason=f"tt extra missing: {available()}")


@_needs_tt()
def test_tt_mlir_refuses_the_swap_and_compiles_its_route_as_predicted():
    from wancompile.tt.probe import probe_reshard

    a, b = _layout([[], ["batch"], ["model"]]), _layout([[], ["model"], ["batch"]])
    direct = probe_reshard(META.shape, MESH, a, [b], "bh-2x4")
    assert not direct.lowered and "CollectivePermuteOp" in direct.error
    routed = probe_reshard(META.shape, MESH, a, [*route(META, a, b, MESH, TT), b], "bh-2x4")
    assert routed.lowered, routed.error
    assert routed.ttnn == _ttnn(a, b)


@_needs_tt()
def test_a_4x2_mesh_compiles_with_its_axes_written_as_2x4():
    """tt-mlir partitions over a fixed list of mesh shapes without 4x2 ("Mesh is not valid"); the program
    names its axes, so written as ["model"=2, "batch"=4] it compiles on the 2x4 system, and TTNN's
    cluster_axis counts the axes in that order (`wancompile.tt.mesh`)."""
    from wancompile.tt.mesh import chip_mesh, sdy_mesh, system_for
    from wancompile.tt.probe import probe_reshard

    mesh = MeshSpec((4, 2), ("batch", "model"))
    assert sdy_mesh(mesh) == chip_mesh(mesh) == MeshSpec((2, 4), ("model", "batch"))
    assert system_for(mesh) == "bh-2x4"
    a, b = _layout([[], ["batch"], ["model"]]), _layout([[], ["batch"], []])
    as_is = probe_reshard(META.shape, mesh, a, [b], "bh-2x4")
    assert not as_is.lowered and "Mesh is not valid" in as_is.error
    written = probe_reshard(META.shape, sdy_mesh(mesh), a, [b], "bh-2x4")
    assert written.lowered, written.error
    assert written.ttnn == {"all-gather:model": 1}
