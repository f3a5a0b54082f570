"""`wancompile export --format python` against the backend's own lowering, on 8 virtual devices.

The exported module is imported and applied to the unmodified diffusers model with plain torch_xla
(parameters: `shard_params`; activation constraints: forward hooks and the op-counting mode of
`apply_activation_sharding`), the model runs eagerly on lazy XLA tensors, and its partitioned HLO
must hold exactly the collectives (kind, mesh axes, bytes) of the backend's program for the same
plan, with the same outputs (PCC >= 0.99999). Plans: the tt-xla hand plan (its bill is known
exactly: tests/test_backend.py), an auto plan that the memory budget forces to shard, and one whose
macros split tokens over different axes (constraints on op inputs: copies).

Each side runs in its own subprocess (this file, run as a script), so that neither can reuse the
other's compiled program from XLA's cache.
"""

import json
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _plans(graph):
    from planner import plan_graph
    from planner.hand_plans import tt_xla_plan
    from planner.mesh import parse_mesh

    mesh = parse_mesh("2x4")
    hand = tt_xla_plan(graph, mesh, model="tiny").with_(hardware="wh-loudbox")
    auto = plan_graph(graph, mesh, "wh-loudbox", memory_gb=0.00025, model="tiny")
    # tokens over batch, model, batch x model in turn: stream values pinned twice and read through copies
    only = {"attn1": r"^SP\(batch\)\+KV-gather$", "attn2": r"^SP\(model\)$", "ffn": r"^SP\(batchxmodel\)$"}
    mixed = plan_graph(graph, mesh, "wh-loudbox", only=only, model="tiny")
    assert any(a.input is not None for a in mixed.activations)
    return {"tt-xla": hand, "auto": auto, "mixed": mixed}


def test_export_module_reads_like_the_seed(tmp_path, tiny_capture):
    from wancompile.report import Report, write_dumps
    from wancompile.report.export import export_python

    plan = _plans(tiny_capture[0])["tt-xla"]
    write_dumps(plan, tmp_path, graph=tiny_capture[0])
    text = export_python(Report.load(tmp_path))
    compile(text, "plan.py", "exec")
    assert (
        "import wancompile" not in text and "from wancompile" not in text and "planner" not in text.split('"""', 2)[2]
    )
    assert "    'attn1.to_q.weight': ('model', None),\n" in text
    assert "    'attn1.to_out.0.weight': (None, 'model'),\n" in text
    assert (
        "    ('', 'contiguous', 0, 0, (None, 'batch', None)),  # block-stack entry: tokens split over the SP axes"
        in text
    )
    namespace: dict = {}
    exec(compile(text.replace("import torch_xla.distributed.spmd as xs", "xs = None"), "plan.py", "exec"), namespace)
    specs = namespace["PARAM_SPECS"]
    assert specs == plan.sharded_params()  # every sharded parameter, nothing else
    assert namespace["MESH_SHAPE"] == (2, 4) and namespace["AXIS_NAMES"] == ("batch", "model")


def test_export_refuses_a_plan_made_with_rewrites(tiny_capture):
    from planner.plan import PlanError, RewriteRecord
    from wancompile.report import Report
    from wancompile.report.export import export_python

    plan = _plans(tiny_capture[0])["tt-xla"].with_(rewrites=(RewriteRecord("qkv", 4, ("blocks.0.attn1",)),))
    with pytest.raises(PlanError, match=r"made with graph rewrites \(qkv\).*Re-plan without rewrites"):
        export_python(Report(plan))


@pytest.mark.slow
def test_exported_module_compiles_to_the_backends_collectives_and_numerics(tmp_path, tiny_capture):
    import torch

    from wancompile.report import Report, write_dumps
    from wancompile.report.export import export_python

    from conftest import run_script

    cases = {}
    for name, plan in _plans(tiny_capture[0]).items():
        d = tmp_path / name
        write_dumps(plan, d, graph=tiny_capture[0])
        (d / "plan_export.py").write_text(export_python(Report.load(d)))
        cases[name] = str(d)
    results = {}
    for side in ("backend", "export"):
        out = tmp_path / f"{side}.json"
        run_script([__file__, side, json.dumps(cases), str(out), str(tmp_path / f"hlo-{side}")], num_devices=8)
        results[side] = json.loads(out.read_text())
    for name in cases:
        b, e = results["backend"][name], results["export"][name]
        assert Counter(map(tuple, map(_key, e["collectives"]))) == Counter(map(tuple, map(_key, b["collectives"]))), (
            name,
            b,
            e,
        )
        assert b["collectives"], f"{name}: the plan is sharded, its program must hold collectives"
        ob, oe = torch.load(b["output"]), torch.load(e["output"])
        from wancompile.verify import numerics

        r = numerics(oe, ob)
        assert r.pcc >= 0.99999 and r.max_abs <= 1e-4, (name, r)
        assert e["unapplied"] == [], e["unapplied"]
    # the hand plan's known bill (tests/test_backend.py): 16 all-reduces on model, 5 all-gathers on batch
    kinds = Counter((c[0], tuple(c[1])) for c in results["export"]["tt-xla"]["collectives"])
    assert kinds == {("all-reduce", ("model",)): 16, ("all-gather", ("batch",)): 5}


def _key(c):
    return (c[0], tuple(c[1]), c[2])


# --- the subprocess side -----------------------------------------------------------------------------


def _run(side: str, cases: dict, out: Path, dump: Path) -> None:
    import importlib.util

    import torch
    import torch_xla

    from planner.plan import load_plan
    from wancompile import hlo, runtime
    from wancompile.models import build_transformer, transformer_inputs

    runtime.use_spmd()
    model = build_transformer("tiny")
    inputs = transformer_inputs("tiny", "tiny", 9)
    results = {}
    for name, d in cases.items():
        d = Path(d)
        plan = load_plan(d / "plan.json")
        before = hlo.dump_state(dump)
        unapplied: list = []
        if side == "backend":
            from wancompile.backend import last_program

            torch._dynamo.reset()
            compiled = torch.compile(
                model, backend="wan_autoshard", options={"mesh": "2x4", "plan": str(d / "plan.json")}, fullgraph=True
            )
            with torch.no_grad():
                output = compiled(**inputs, return_dict=False)[0]
            path = last_program().hlo_path
        else:
            spec = importlib.util.spec_from_file_location(f"plan_{name.replace('-', '_')}", d / "plan_export.py")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            device = torch_xla.device()
            mesh = module.make_mesh()
            xmodel = build_transformer("tiny").to(device)
            module.shard_params(xmodel, mesh)
            module.apply_activation_sharding(xmodel, mesh)
            with torch.no_grad():
                output = xmodel(**{k: v.to(device) for k, v in inputs.items()}, return_dict=False)[0]
            torch_xla.sync()
            output = output.cpu()
            try:
                module.check_constraints_applied(xmodel)
            except RuntimeError as err:
                unapplied.append(str(err))
            path = hlo.main_module(hlo.new_modules(dump, before))
        colls = hlo.parse_collectives(Path(path).read_text(), plan.mesh)
        torch.save(output, out.parent / f"{side}-{name}.pt")
        results[name] = {
            "collectives": sorted([c.kind, list(c.axes), c.bytes] for c in colls),
            "output": str(out.parent / f"{side}-{name}.pt"),
            "hlo": str(path),
            "unapplied": unapplied,
        }
    out.write_text(json.dumps(results))


if __name__ == "__main__":
    side, cases, out, dump = sys.argv[1], json.loads(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
    dump.mkdir(parents=True, exist_ok=True)
    from wancompile import runtime as _rt

    _rt.configure(num_devices=8, dump_dir=dump)
    _run(side, cases, out, dump)
