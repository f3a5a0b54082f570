"""Rewrites compose with the auto planner: ``rewrites="all"`` (fused QKV included) and no ``plan``.

The tiny DiT (2 blocks, 4 heads; sp_pad pads its tokens to the SP tile) compiled through the backend
with every rewrite and the planner's own plan, at a budget that forces weight sharding and at the
profile's (ample) budget, on 2x4 (in this process) and 8x4 (32 devices, a subprocess): per
(kind, mesh axes) the partitioned HLO holds the plan's predicted collectives (bytes within 5 %),
the output matches one device and eager fp32 to PCC >= 0.99999, the fold program (the packed
q/k/v weights) runs no collective, and each packed weight leaves it with the plan's spec, which its
source parameters share (planner/packing.py). Every attention strategy family is compiled with the
fused projections too (``only=``), as tests/test_fidelity.py does for the unfused graph.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from planner.mesh import parse_mesh
from planner.placements import Layout
from planner.placements import shard_count as mesh_devices
from planner.request import PlanRequest

ROOT = Path(__file__).resolve().parents[1]

# mesh -> (devices, cases); a case: (name, backend options, only= restriction or None)
CASES = {
    "2x4": (
        8,
        [
            ("tight", {"memory_gb": 0.00032}, None),  # FSDP everywhere; one SP axis across macros
            ("ample", {}, None),
            ("ulysses", {}, {"attn1": r"^Ulysses\(batch\)$"}),
            ("kv-gather", {}, {"attn1": r"^SP\(batch\)\+KV-gather$", "attn2": r"^SP\(batch\)$"}),
            ("head-tp", {}, {"attn1": r"^head-TP\(model\)$", "attn2": r"^head-TP\(batch\)$"}),
            (
                "head-tp-sp-fsdp",
                {},
                {"attn1": r"^head-TP\(model\)\+SP\(batch\)\+FSDP$", "attn2": r"^head-TP\(model\)\+SP\(batch\)\+FSDP$"},
            ),
            # the stream layouts beyond STATE A with the fused projections: hidden split over TP between
            # macros (STATE B), tokens split over TP too (sequence-parallel Megatron)
            ("state-b", {}, {m: r"\+SP\(batch\)\+hidden\(model\)$" for m in ("attn1", "attn2", "ffn")}),
            ("sp-megatron", {}, {m: r"\+SP\(batch\)\+seq\(model\)$" for m in ("attn1", "attn2", "ffn")}),
        ],
    ),
    "8x4": (32, [("tight", {"memory_gb": 0.00025}, None), ("ample", {}, None)]),
}
FAST = {("2x4", "tight"), ("8x4", "tight")}  # about 20 s and 40 s (a 32-device subprocess)


def compile_case(mesh: str, name: str, options: dict, only) -> dict:
    """Compile the tiny DiT with every rewrite under the auto plan (restricted by `only`); one row."""
    import tempfile

    import torch
    import torch_xla
    import torch_xla.distributed.spmd as xs

    from planner import plan_graph
    from planner.mesh import parse_mesh
    from planner.packing import packed_operand
    from planner.plan import save_plan
    from wancompile.backend import default_hardware, rewrite_graph
    from wancompile.capture import annotate, capture_module
    from wancompile.models import build_transformer, transformer_inputs
    from wancompile.options import Options
    from wancompile.verify import compare_collectives, numerics, run_with_backend

    model, inputs = build_transformer("tiny"), transformer_inputs("tiny", "tiny", 9)
    options = {"mesh": mesh, "rewrites": "all", **options}
    if only is not None:
        _, gm = capture_module(model, **inputs, return_dict=False, model="wan-dit")
        spec = parse_mesh(mesh)
        gm, records = rewrite_graph(gm, PlanRequest.make(spec), Options.from_user(options).rewrites)
        plan = plan_graph(annotate(gm, model="wan-dit"), spec, default_hardware(spec), only=only)
        path = Path(tempfile.mkdtemp(prefix="wancompile-rewrites-plan-")) / f"{name}.plan.json"
        options["plan"] = str(save_plan(plan.with_(rewrites=records), path))
    out, ref, program = run_with_backend(model, inputs, **options)
    with torch.no_grad():
        eager = model(**inputs, return_dict=False)[0]
    plan, graph = program.plan, program.graph
    packed = []
    for c in plan.activations:
        node = graph.by_location()[c.location]
        p = packed_operand(graph, node.name)
        if p is None or not any(u.op == "linear" for u in graph.users(node.name)):
            continue  # not a packed weight (the RoPE tables are buffer-only too)
        split = program.fold.split
        value = program.fold._values[split.folded.index(node.name)]
        probe = torch.zeros(value.shape, device=value.device)
        xs.mark_sharding(probe, program.mesh, tuple(c.spec))
        packed.append(
            {
                "where": str(c.location),
                "spec": list(c.spec),
                "sources": [list(plan.params[graph[s].param]) for s in p.sources],
                "folded_as_planned": torch_xla._XLAC._get_xla_sharding_spec(value)
                == torch_xla._XLAC._get_xla_sharding_spec(probe),
            }
        )
        del probe
    matches = compare_collectives(plan.collectives, program.collectives())
    return {
        "mesh": mesh,
        "case": name,
        "pcc": numerics(out, ref).pcc,
        "pcc_eager": numerics(out[0], eager).pcc,
        "rewrites": {r.name: r.count for r in plan.rewrites},
        "strategies": {d.node: d.strategy for d in plan.decisions},
        "sharded_params": len(plan.sharded_params()),
        "packed": packed,
        "fold_collectives": len(program.fold_collectives()),
        "matches": [
            [m.kind, list(m.axes), m.predicted_count, m.observed_count, m.predicted_bytes, m.observed_bytes]
            for m in matches
        ],
        "table": [str(m) for m in matches],
        "hlo": str(program.hlo_path),
    }


def _check(row: dict) -> None:
    where = f"{row['mesh']} {row['case']}: {row['strategies']} ({row['hlo']})\n" + "\n".join(row["table"])
    assert row["pcc"] >= 0.99999 and row["pcc_eager"] >= 0.99999, (where, row["pcc"], row["pcc_eager"])
    assert row["rewrites"]["qkv"] == 4 and row["rewrites"]["sp_pad"] == 2, row["rewrites"]
    for kind, axes, pc, oc, pb, ob in row["matches"]:
        assert pc == oc and abs(pb - ob) <= 0.05 * max(pb, ob), f"{kind} {axes}\n{where}"
    assert row["fold_collectives"] == 0, where
    # 2 self-attentions (weight + bias) and 2 cross-attention K/V packs (weight + bias)
    assert len(row["packed"]) == 8, row["packed"]
    for p in row["packed"]:
        assert p["folded_as_planned"] and all(s == p["spec"] for s in p["sources"]), p
    if row["case"] == "ample":
        assert not row["sharded_params"], where  # latency-bound collectives: replication is cheapest
    if re.search(r"head-TP|FSDP", row["strategies"]["blocks.*.attn1 (x2)"]):
        assert any(any(axes for axes in p["spec"]) for p in row["packed"]), where  # the packed weights are split


@pytest.fixture
def fused(tiny_capture):
    """The tiny DiT's graph after every rewrite (sp_pad to 64-token multiples), annotated."""
    from rewrites import RewriteContext, apply_rewrites
    from wancompile.capture import annotate

    from conftest import fresh

    gm, _ = apply_rewrites(fresh(tiny_capture[1]), "all", RewriteContext(sp_multiple=64))
    gm.recompile()
    return annotate(gm, model="wan-dit")


def test_fused_projections_are_found_by_dataflow(fused):
    from planner.strategies import find_structure

    attn1, attn2 = (m for m in find_structure(fused).block_macros if m.kind == "attention")
    q, k, v = (fused[x] for x in attn1.qkv)
    assert q is k is v and q.out.shape[-1] == 3 * 64 and attn1.self_attention  # one linear for q, k and v
    q, k, v = (fused[x] for x in attn2.qkv)
    assert q is not k and k is v and k.out.shape[1] == 7 and not attn2.self_attention  # K/V of the prompt fused
    for m, sources in ((attn1, 3), (attn2, 2)):
        assert [len(p.sources) for p in m.packed] == [sources, sources]  # weight and bias
        assert all(fused[s].is_param for p in m.packed for s in p.sources)
        assert not {x for p in m.packed for x in p.nodes} & set(m.nodes)  # folded: not priced per call


def test_every_strategy_keeps_the_packed_weight_head_aligned(fused):
    from planner.strategies import find_structure, strategies

    mesh = parse_mesh("2x4")
    st = find_structure(fused)
    for m in (m for m in st.block_macros if m.kind == "attention"):
        opts, why = strategies(fused, m, mesh, st.tokens)
        assert {s.tp for s in opts} == {(), ("batch",), ("model",)}, why  # 4 heads: TP over 8 excluded
        for s in opts:
            split = s.tp + (s.sigma if s.fsdp else ())
            aligned = 4 % mesh_devices(mesh, split) == 0  # FSDP joins TP on dim 0 where the 4 heads allow
            for p in m.packed:
                lay = s.params[p.node]
                assert all(s.params[x] == lay for x in p.sources), (s.name, lay)
                if lay.ndim == 1:  # the bias: split like the features, never for memory
                    assert lay.dims == (s.tp,), (s.name, lay)
                else:
                    assert lay.dims == ((split, ()) if aligned else (s.tp, s.sigma)), (s.name, lay)


def test_a_split_that_would_cut_heads_is_refused_by_the_rules(fused):
    from planner.packing import source_layouts
    from planner.strategies import find_structure

    attn1 = next(m for m in find_structure(fused).block_macros if m.kind == "attention")
    weight = attn1.packed[0]
    lays, why = source_layouts(fused, weight, Layout((("batch", "model"), ())), parse_mesh("2x4"))
    assert not lays and "rows would move between devices" in why, why  # 8 shards of 4 heads
    lays, why = source_layouts(fused, weight, Layout((("model",), ("batch",))), parse_mesh("2x4"))
    assert not why and set(lays) == set(weight.sources)


@pytest.mark.usefixtures("spmd")
@pytest.mark.parametrize(
    "name", [pytest.param(c[0], marks=() if ("2x4", c[0]) in FAST else pytest.mark.slow) for c in CASES["2x4"][1]]
)
def test_all_rewrites_auto_plan_on_2x4_compiles_to_its_prediction(name):
    case = next(c for c in CASES["2x4"][1] if c[0] == name)
    row = compile_case("2x4", *case)
    _check(row)
    if name == "tight":
        assert all(s.endswith("+FSDP") for k, s in row["strategies"].items() if k.startswith("blocks.")), row
    elif case[2] is not None:
        for macro, pattern in case[2].items():
            assert re.search(pattern, row["strategies"][f"blocks.*.{macro} (x2)"]), row["strategies"]


@pytest.mark.parametrize(
    "name", [pytest.param(c[0], marks=() if ("8x4", c[0]) in FAST else pytest.mark.slow) for c in CASES["8x4"][1]]
)
def test_all_rewrites_auto_plan_on_8x4_compiles_to_its_prediction(name):
    from conftest import fidelity_rows

    (row,) = fidelity_rows([__file__, "8x4", name], CASES["8x4"][0], 1)
    _check(row)
    if name == "tight":
        assert row["strategies"]["blocks.*.attn1 (x2)"].startswith("head-TP"), row["strategies"]


def _main(mesh: str, names: list[str]) -> None:
    import tempfile

    from wancompile import runtime

    devices, cases = CASES[mesh]
    runtime.configure(
        num_devices=devices, dump_dir=Path(tempfile.mkdtemp(prefix=f"wancompile-rewrites-{mesh}-")) / "hlo"
    )
    for case in (c for c in cases if c[0] in names):
        row = compile_case(mesh, *case)
        print("FIDELITY " + json.dumps(row), flush=True)
        print(f"{mesh} {case[0]}: PCC {row['pcc']:.7f}; " + "; ".join(row["table"]), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    _main(sys.argv[1], sys.argv[2:])


def test_cli_plan_with_rewrites_records_them_and_validates_the_names(tmp_path, capsys):
    from planner.plan import load_plan
    from wancompile.cli import main

    from conftest import TINY_ALL_REWRITES, TINY_PLAN

    assert main([*TINY_PLAN, "--memory-gb", "0.0003", "--rewrites", "all", "--out", str(tmp_path)]) == 0
    plan = load_plan(tmp_path / "plan.json")
    assert {r.name: r.count for r in plan.rewrites} == TINY_ALL_REWRITES
    packed = [a for a in plan.activations if a.location.module == "blocks.0.attn1" and tuple(a.shape) == (192, 64)]
    assert len(packed) == 1 and packed[0].spec == plan.params["blocks.0.attn1.to_q.weight"], packed  # q/k/v packed
    assert main([*TINY_PLAN, "--rewrites", "qkv,fuse", "--out", str(tmp_path)]) == 2
    assert "--rewrites: option 'rewrites': unknown pass(es) ['fuse']" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.usefixtures("spmd")
@pytest.mark.parametrize("case, only", [("spatial", {}), ("2d", {"*": r"\(H:batch,W:model\)$"})])
def test_vae_with_every_rewrite_compiles_to_its_spatial_plan(case, only, tmp_path):
    """The VAE side of "all": rmsnorm and conv1x1 fire there (22 and 5 sites on the tiny Wan 2.1 VAE);
    the 1x1 convs become channel-last linears whose (B, T, H, W, C) rows torch_xla flattens, so an
    H/W split is gathered before them (planner/rules/matmul.py), predicted and compiled alike."""
    import torch

    import wancompile.vae as wvae
    from planner.plan import save_plan
    from planner.vae_plan import plan_vae
    from rewrites import PASS_NAMES
    from wancompile.backend import default_hardware, last_program, rewrite_graph
    from wancompile.capture import annotate, capture_fx
    from wancompile.vae.configs import build_vae
    from wancompile.vae.legalize import fold_conv_padding
    from wancompile.verify import compare_collectives, numerics

    vae = wvae.enable_full_t(build_vae("tiny-wan2.1"))
    z = torch.randn(1, vae.config.z_dim, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    spec = parse_mesh("2x4")
    gm, records = rewrite_graph(capture_fx(vae.decode, z), PlanRequest.make(spec), PASS_NAMES)
    assert {r.name: r.count for r in records if r.count} == {"rmsnorm": 22, "conv1x1": 5}
    graph = annotate(fold_conv_padding(gm)[0], model="wan-vae")
    plan = plan_vae(graph, spec, default_hardware(spec), preset="spatial", only=only)
    path = save_plan(plan.with_(rewrites=records), tmp_path / "plan.json")
    torch._dynamo.reset()
    options = {"mesh": "2x4", "rewrites": "all", "plan": str(path)}
    decode = torch.compile(vae.decode, backend="wan_autoshard", options=options, fullgraph=True)
    with torch.no_grad():
        out, eager = decode(z).sample, vae.decode(z).sample
    program = last_program()
    assert numerics(out, eager).pcc >= 0.99999
    assert not any("no sharding rule" in n for n in program.plan.notes), program.plan.notes
    matches = compare_collectives(program.plan.collectives, program.collectives())
    table = "\n".join(map(str, matches))
    assert all(m.count_ok and m.bytes_ok() for m in matches), table
    gathers = {m.axes: m.observed_count for m in matches if m.kind == "all-gather"}
    # the attention's input, then the 3 rewritten 1x1 convs whose split rows are gathered (under the calibrated
    # factors the spatial plan splits W over both axes, so those gathers run over both)
    assert gathers == ({("batch", "model"): 4} if case == "spatial" else {("batch",): 4, ("model",): 4}), table
