"""Fidelity: the auto plan's compiled program IS what the plan says.

For the tiny DiT (2 blocks, 4 heads, 48 tokens) on 2x4, 1x8 and 8x4 virtual CPU meshes (plus a 2x2
mesh for Ulysses with the TP split major), each in its own subprocess (the device count is fixed
per process), the backend plans, lowers and compiles; then:

- per (kind, mesh axes) the partitioned HLO holds exactly the plan's predicted collective count,
  with bytes within 5%;
- XLA combines nothing except what is documented: all-to-alls are emitted in tuple form (one
  operand per group member: one collective, bytes = the sum), every other collective is a single
  array (no all-reduce/all-gather combining on CPU);
- the output matches the same graph on one XLA device (``program.replicated()``): PCC >= 0.99999;
- GSPMD never falls back to "Involuntary full rematerialization" (a constraint that would force a
  reshape's split/merged dim to re-partition).

Memory budgets force non-trivial plans: on the Wormhole profiles (the backend's default per mesh
shape: wh-loudbox for 2x4 and 1x8, wh-galaxy for 8x4) the tiny model replicates when memory is
ample, because its collectives are latency-bound. The budgets sit just above the smallest plan
that fits, so weights must be sharded (FSDP) and the plan mixes head-TP / SP / Megatron. Ulysses
is never the cheapest here, so it is planned with ``plan_graph(..., only={"attn1": "^Ulysses"})``
and compiled through the backend's ``plan`` option.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import assert_matches_prediction, fidelity_row

ROOT = Path(__file__).resolve().parents[1]

# mesh -> (devices, cases); a case is (name, backend options, only= restriction or None)
MESHES = {
    "2x4": (
        8,
        [
            ("auto", {"memory_gb": 0.00025}, None),
            ("ulysses", {}, {"attn1": r"^Ulysses\(batch\)$"}),
            ("state-b", {}, {m: r"\+SP\(batch\)\+hidden\(model\)$" for m in ("attn1", "attn2", "ffn")}),
            ("sp-megatron", {}, {m: r"\+SP\(batch\)\+seq\(model\)$" for m in ("attn1", "attn2", "ffn")}),
        ],
    ),
    "1x8": (8, [("auto", {"memory_gb": 0.0003}, None)]),
    "8x4": (
        32,
        [
            ("auto", {"memory_gb": 0.0002}, None),
            ("state-b", {}, {m: r"\+SP\(batch\)\+hidden\(model\)$" for m in ("attn1", "attn2", "ffn")}),
        ],
    ),
    "2x2": (4, [("ulysses-tp-major", {}, {"attn1": r"^Ulysses\(model\+batch\)$"})]),
}


def _run(mesh: str) -> list[dict]:
    from conftest import fidelity_rows

    devices, cases = MESHES[mesh]
    return fidelity_rows([__file__, mesh], devices, len(cases))


def _check(row: dict) -> None:
    where = f"{row['mesh']} {row['case']}: {row['strategies']}"
    assert row["pcc"] >= 0.99999, (where, row["pcc"], row["max_abs"])
    table = "\n".join(row["table"])
    assert row["matches"], where
    assert_matches_prediction(row["matches"], f"{where}\n{table}")
    assert not row["combined"], f"{where}: XLA combined collectives other than all-to-all: {row['combined']}"
    assert row["sharded_params"] > 0 or row["case"].startswith("ulysses"), where


@pytest.mark.slow
@pytest.mark.parametrize("mesh", list(MESHES))
def test_compiled_collectives_are_the_plans(mesh):
    for row in _run(mesh):
        _check(row)
        strategies = row["strategies"]
        if row["case"] == "auto":
            # the budget forces weight sharding: the plan is not the replicated default
            assert any("FSDP" in s for s in strategies.values()), strategies
        elif row["case"] in ("state-b", "sp-megatron"):
            # the stream between macros split beyond the SP axes: the row-parallel sums are
            # reduce-scattered (3 per block, 2 blocks) and gathered before each column-parallel input
            suffix = "+hidden(model)" if row["case"] == "state-b" else "+seq(model)"
            assert all(s.endswith(suffix) for k, s in strategies.items() if k.startswith("blocks.")), strategies
            rs = [(m["axes"], m["observed_count"]) for m in row["matches"] if m["kind"] == "reduce-scatter"]
            assert rs == [(["model"], 6)], row["table"]
        else:
            assert strategies["blocks.*.attn1 (x2)"].startswith("Ulysses"), strategies
            a2a = [m for m in row["matches"] if m["kind"] == "all-to-all"]
            # q, k, v in and the attention output back, per block, on the SP axis only
            assert [(m["axes"], m["observed_count"]) for m in a2a] == [(["batch"], 8)], row["table"]
            assert not any(m["kind"] == "collective-permute" for m in row["matches"]), row["table"]
        if mesh == "1x8":
            attn1 = row["excluded"]["blocks.*.attn1 (x2)"]
            assert ["head-TP over model (8)", "4 heads do not divide into 8"] in attn1


@pytest.mark.usefixtures("spmd")
@pytest.mark.parametrize("shape", [(2, 4), (4, 2)])
def test_every_stream_reshard_is_what_the_partitioner_emits(shape):
    """`planner.propagate.redistribute` vs GSPMD for every pair of token splits of a (1, 72, 96)
    stream: (), each axis, both axes in either order. The value is pinned, pinned again, and read by
    a linear pinned to the second layout; the partitioned HLO holds exactly the predicted
    collectives, device-order collective-permutes included."""
    import itertools

    import numpy as np
    import torch
    import torch_xla
    import torch_xla.distributed.spmd as xs

    from planner.graph import TensorMeta
    from planner.mesh import MeshSpec
    from planner.placements import Layout
    from planner.propagate import redistribute
    from wancompile import hlo, runtime

    spec = MeshSpec(shape, ("batch", "model"))
    mesh = xs.Mesh(np.arange(8), shape, spec.axis_names)
    splits = [(), ("batch",), ("model",), ("batch", "model"), ("model", "batch")]
    meta = TensorMeta((1, 72, 96), "float32")
    dump, dev, w = runtime.current_dump_dir(), torch_xla.device(), torch.randn(96, 96).to(torch_xla.device())
    wrong = []
    for i, (a, b) in enumerate(itertools.permutations(splits, 2)):
        # a distinct input width per program: XLA dumps no module for a program it has compiled before
        k = 8 + i + 20 * (shape[0] == 4)
        before = hlo.dump_state(dump)
        x = torch.nn.functional.linear(torch.randn(1, 72, k).to(dev), torch.randn(96, k).to(dev)) + 1.0
        for s in (a, b):
            xs.mark_sharding(x, mesh, Layout(((), s, ())).to_spec())
        y = torch.nn.functional.linear(x * 2.0, w)
        xs.mark_sharding(y, mesh, Layout(((), b, ())).to_spec())
        torch_xla.sync()
        module = hlo.main_module(hlo.new_modules(dump, before))
        got = sorted((c.kind, c.axes, c.bytes) for c in hlo.parse_collectives(module.read_text(), spec))
        planned = redistribute(meta, Layout(((), a, ())), Layout(((), b, ())), spec)
        want = sorted((kind, axes, int(np.prod(shp)) * 4) for kind, axes, shp in planned)
        if got != want:
            wrong.append(f"{a} -> {b}: compiled {got}, predicted {want}")
    assert not wrong, "\n".join(wrong)


# --- the subprocess -------------------------------------------------------------------------------


def _main(mesh: str, only_cases: tuple[str, ...] = ()) -> None:
    import tempfile

    from wancompile import runtime

    _, cases = MESHES[mesh]
    cases = [c for c in cases if not only_cases or c[0] in only_cases]
    dump = Path(tempfile.mkdtemp(prefix=f"wancompile-fidelity-{mesh}-"))
    runtime.configure(num_devices=MESHES[mesh][0], dump_dir=dump / "hlo")

    from planner import plan_graph
    from planner.mesh import parse_mesh
    from planner.plan import save_plan
    from wancompile.backend import default_hardware
    from wancompile.capture import capture_module
    from wancompile.models import build_transformer, transformer_inputs
    from wancompile.verify import numerics, run_with_backend

    model = build_transformer("tiny")
    inputs = transformer_inputs("tiny", "tiny", 9)
    for name, options, only in cases:
        options = {"mesh": mesh, **options}
        if only is not None:
            graph, _ = capture_module(model, **inputs, return_dict=False, model="wan-dit")
            spec = parse_mesh(mesh)
            plan = plan_graph(graph, spec, default_hardware(spec), only=only, memory_gb=options.pop("memory_gb", None))
            options["plan"] = str(save_plan(plan, dump / f"{name}.plan.json"))
        out, ref, program = run_with_backend(model, inputs, **options)
        result = numerics(out, ref)
        observed = program.collectives()
        row = fidelity_row(
            name,
            result,
            program,
            mesh=mesh,
            excluded={d.node: [[x.option, x.reason] for x in d.excluded] for d in program.plan.decisions},
            sharded_params=len(program.plan.sharded_params()),
            combined=sorted({c.kind for c in observed if c.shape.startswith("(") and c.kind != "all-to-all"}),
            tuple_all_to_all=sum(1 for c in observed if c.shape.startswith("(") and c.kind == "all-to-all"),
        )
        print("FIDELITY " + json.dumps(row), flush=True)
        print(
            f"{mesh} {name}: {result}; hlo {row['hlo']}; "
            + "; ".join(f"{k}: {v}" for k, v in row["strategies"].items()),
            flush=True,
        )
        for line in row["table"]:
            print("   ", line, flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    _main(sys.argv[1], tuple(sys.argv[2:]))  # python tests/test_fidelity.py MESH [CASE ...]
