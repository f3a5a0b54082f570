"""SkyReels-V2 (diffusers' `SkyReelsV2Transformer3DModel`, T2V and diffusion forcing) is planned as a
Wan DiT: its blocks are found by structure, and on 2x4 under the tightest budget the planner names
it compiles to the collectives it predicts and matches eager fp32."""

import pytest
import torch

from planner.plan import MemoryBudgetError
from wancompile.capture import capture_module, unannotated
from wancompile.models import build_family
from wancompile.verify import compare_collectives, numerics, run_with_backend

pytestmark = pytest.mark.usefixtures("spmd")


@pytest.mark.parametrize("family", ["skyreels-t2v", "skyreels-df"])
def test_skyreels_blocks_are_one_family_found_by_structure(family):
    model, inputs = build_family(family)
    graph, _ = capture_module(model, **inputs, return_dict=False)
    assert unannotated(graph) == []
    assert [(f.prefix, f.indices, f.odd) for f in graph.families] == [("blocks", (0, 1), ())]
    assert {n.module.split(".")[0] for n in graph if n.op == "scaled_dot_product_attention"} == {"blocks"}


def _need_gb(model, inputs, **options) -> float:
    with pytest.raises(MemoryBudgetError) as e:
        run_with_backend(model, inputs, reference=False, mesh="2x4", memory_gb=1e-9, **options)
    return e.value.need_gb


def _compile(model, inputs, **options):
    out, _, program = run_with_backend(model, inputs, reference=False, mesh="2x4", **options)
    with torch.no_grad():
        eager = model(**inputs, return_dict=False)
    state = dict(model.named_parameters())
    sharded = sum(state[k].numel() for k, s in program.plan.params.items() if k in state and any(s))
    return (
        numerics(out, eager),
        compare_collectives(program.plan.collectives, program.collectives()),
        sharded / sum(p.numel() for p in state.values()),
        program.plan.rewrites,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "family, budget, rewrites",
    [
        ("skyreels-t2v", None, None),
        ("skyreels-t2v", "tight", None),
        ("skyreels-t2v", "tight", "all"),
        ("skyreels-df", None, None),
        ("skyreels-df", "tight", None),
        ("skyreels-df", "tight", "all"),
    ],
)
def test_skyreels_on_2x4_compiles_to_its_prediction_and_matches_eager(family, budget, rewrites):
    model, inputs = build_family(family)
    options = {"rewrites": rewrites} if rewrites else {}
    if budget == "tight":
        options["memory_gb"] = _need_gb(model, inputs, **options)
    result, matches, sharded, ran = _compile(model, inputs, **options)
    print(f"{family} {options}: {sharded:.3f} of parameters sharded, {result}")
    assert [r.skipped for r in ran if r.skipped] == []  # no rewrite dropped on the way
    if rewrites == "all":  # 48 tokens padded to the SP tile, the per-token modulation with them
        assert {r.name: r.count for r in ran}["sp_pad"] == 2
    assert result.pcc >= 0.99999, result
    assert all(m.count_ok and m.bytes_ok() for m in matches), "\n".join(map(str, matches))
    if budget == "tight":
        assert sharded > 0.5  # the budget forces the weights apart
