"""ChronoEdit and Wan Animate through the backend on 2x4: tiny random-weight DiTs
(`wancompile.models.FAMILIES`), each at the default budget, the tightest budget the planner accepts
(the ``need_gb`` of its `MemoryBudgetError`) and that budget with every rewrite. The sharded output
matches eager fp32 (PCC >= 0.99999); the compiled collectives are the plan's.

ChronoEdit runs its real edit step, 2 latent frames, whose RoPE indexes temporal positions with a
list (``freqs[:8][[0, -1]]``, advanced indexing). Animate runs its motion encoder twice (5 face
frames in batches of 4): after the conv1x1 rewrite its 1x1 ``conv_in`` is one linear module called
twice, not an MLP pair.
"""

import pytest
import torch

import wancompile
from wancompile.models import build_family
from wancompile.verify import compare_collectives, numerics, run_with_backend

from conftest import assert_matches_prediction

pytestmark = pytest.mark.usefixtures("spmd")

CASES = {"default": {}, "tight": {"tight": True}, "tight+rewrites": {"tight": True, "rewrites": "all"}}
_RUNS: dict = {}


def _run(family: str, case: str):
    """(numerics vs eager, the program, fraction of parameter elements sharded), compiled once per case."""
    if (family, case) not in _RUNS:
        model, inputs = build_family(family)
        with torch.no_grad():
            eager = model(**inputs, return_dict=False)[0]
        options = {"mesh": "2x4", **CASES[case]}
        if options.pop("tight", False):
            with pytest.raises(wancompile.MemoryBudgetError) as e:  # caught as itself around the compiled call
                run_with_backend(model, inputs, reference=False, memory_gb=1e-9, **options)
            options["memory_gb"] = e.value.need_gb
        out, _, program = run_with_backend(model, inputs, reference=False, **options)
        params = dict(model.named_parameters())
        sharded = sum(params[p].numel() for p in program.plan.sharded_params() if p in params)
        _RUNS[family, case] = numerics(out, eager), program, sharded / sum(p.numel() for p in params.values())
    return _RUNS[family, case]


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("family", ["chronoedit", "animate"])
def test_family_plans_compiles_and_matches_eager(family, case):
    result, program, sharded = _run(family, case)
    assert result.pcc >= 0.99999, result
    if case == "default":  # memory is ample: the latency-bound tiny model replicates
        assert sharded == 0.0
    else:  # the budget forces weight sharding
        assert sharded > 0.5 and any("FSDP" in d.strategy for d in program.plan.decisions)
    if "rewrites" in case:
        assert {r.name for r in program.plan.rewrites} >= {"conv1x1", "patch_embed"}
    if family == "animate" and "rewrites" in case:
        conv1x1 = next(r for r in program.plan.rewrites if r.name == "conv1x1")
        assert conv1x1.where == ("motion_encoder.conv_in",) * 2  # the two motion-encoder calls
        assert not any(d.node.startswith("motion_encoder") for d in program.plan.decisions)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("family", ["chronoedit", "animate"])
def test_family_compiled_collectives_are_the_plans(family, case):
    _, program, _ = _run(family, case)
    matches = compare_collectives(program.plan.collectives, program.collectives())
    assert_matches_prediction([vars(m) for m in matches], f"{family} {case}")


def test_a_list_index_is_advanced_indexing_not_one_int_per_dim():
    """ChronoEdit's ``freqs[:8][[0, -1]]`` (rows 0 and -1) is captured apart from ``freqs[0, -1]``
    (one element), and the index rule gives the (2, d) rows their own layout: the indexed dim
    gathered, the other dim's split kept."""
    from planner.graph import Location, Node, TensorMeta
    from planner.mesh import parse_mesh
    from planner.placements import Layout
    from planner.rules import OpView
    from planner.rules.index import getitem_rule
    from wancompile.capture import annotate, capture_fx

    graph = annotate(capture_fx(lambda f: (f[:8][[0, -1]] * 2, f[0, -1] * 2), torch.randn(16, 6)))
    picked = {str(n.attrs["args"][1]): n.out.shape for n in graph if n.op == "getitem" and n.outputs}
    assert picked["{'list': [0, -1]}"] == (2, 6) and picked["[0, -1]"] == ()

    index = {"args": [{"node": "f"}, {"list": [0, -1]}]}
    node = Node("g", "getitem", ("f",), (TensorMeta((2, 6), "float32"),), "", Location("", "getitem", 0), attrs=index)
    split = Layout((("batch",), ("model",)))
    res = getitem_rule(OpView(node, [split], [TensorMeta((8, 6), "float32")], parse_mesh("2x4")))
    assert res.required[0] == Layout(((), ("model",))) and res.outputs[0] == Layout(((), ("model",)))


def test_an_infeasible_plan_is_caught_as_a_plan_error_around_the_compiled_call():
    """The backend re-raises project errors past dynamo (`wancompile.catchable`): the new
    `InfeasiblePlanError` is caught by ``except wancompile.PlanError`` like the others."""
    from torch._dynamo.exc import ShortenTraceback

    from wancompile.catchable import catchable

    err = catchable(wancompile.InfeasiblePlanError("no plan", group="attn1", excluded=(("replicated", "only="),)))
    assert isinstance(err, wancompile.PlanError) and isinstance(err, ShortenTraceback)
    assert (err.group, err.excluded) == ("attn1", (("replicated", "only="),))


def test_animate_face_adapters_and_motion_encoder_blocks_are_planned_op_by_op():
    """Capture finds three repeated-block stacks in Animate; only ``blocks`` are transformer blocks
    (an attention or MLP child). The face adapters (one cross-attention module each, its SDPA in the
    block itself: it reads the stream after every second block, its output added back) plan as glue
    between the main blocks, the motion encoder's conv residual blocks as prologue ops, so the plan
    names exactly the model's parameters."""
    from planner.strategies import dit_graph, find_structure
    from wancompile.capture import capture_module

    model, inputs = build_family("animate")
    graph, _ = capture_module(model, **inputs, return_dict=False)
    assert set(graph.block_prefixes) == {"blocks", "face_adapter", "motion_encoder.res_blocks"}
    st = find_structure(graph)
    assert (st.root, st.captured_blocks, st.families) == ("blocks.0", 2, ())
    planned = dit_graph(graph)
    assert planned.block_prefixes == ("blocks",) and planned.families == (graph.family("blocks"),)
    face = {n.name for n in planned if n.module.startswith("face_adapter.0") and n.op != "placeholder"}
    motion = {n.name for n in planned if n.module.startswith("motion_encoder.res_blocks.") and n.op != "placeholder"}
    assert face and face <= set(st.glue) and motion and motion <= set(st.prologue)
