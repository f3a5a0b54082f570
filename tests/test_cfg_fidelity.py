"""CFG parallel, checked against the compiled program: a batch-2 tiny DiT (cond and uncond concatenated on
the batch) compiled by the backend with ``cfg_parallel="on"`` on 8 and 32 virtual CPU devices, and with
``cfg_parallel="off"`` (the batch-2 plan on the whole mesh: the batch whole, carried by every product as a
free dim, so sequence parallelism splits the tokens under it — `planner.rules.matmul.keeps_leading_dims`).

Per mesh (each in its own subprocess), the plan's mesh is the split 3-D mesh (planner.cfg; "off": the user's) and:

- numerics: the compiled batch-2 output vs eager fp32 running the two batch-1 forwards one after the
  other (what diffusers' WanPipeline does without CFG batching): PCC >= 0.99999, max-abs stated;
- collectives: per (kind, axes of the split mesh) the partitioned HLO holds exactly the predicted count,
  bytes within 5%, and none runs over ``cfg`` (the branches never exchange data);
- GSPMD never falls back to "Involuntary full rematerialization".

Budgets force non-trivial per-branch plans (weights sharded over the half mesh), as in test_fidelity.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import assert_matches_prediction, fidelity_row

ROOT = Path(__file__).resolve().parents[1]

# case -> (mesh, budget GB, axes the planner may halve (None: the default, the major-most axis), the split it
# must take; None: cfg_parallel="off"). "*/model" cases ask for cfg between two axes (cfg_axes=("model",)) and
# are compiled through the backend's `plan` option (a saved CFG plan on the user's 2-D mesh).
CASES = {
    "2x4": ("2x4", 0.00035, None, "batch"),
    "4x2": ("4x2", 0.00035, None, "batch"),
    "2x4/model": ("2x4", 0.00035, ("model",), "model"),
    "1x8": ("1x8", 0.00035, None, "model"),
    # Galaxy-shaped, 32 devices: 2x4x4 (head-TP + SP per branch, FSDP on the FFN), and cfg in the middle
    # (8x2x2, head-TP + SP + FSDP everywhere: the known GSPMD deviation, pinned below)
    "8x4": ("8x4", 0.00025, None, "batch"),
    "8x4/model": ("8x4", 0.0002, ("model",), "model"),
    # the pair unsplit on the whole mesh: tokens split under the whole batch of 2 (SP per linear, no gather)
    "2x4/off": ("2x4", 0.00035, None, None),
    "8x4/off": ("8x4", 0.00025, None, None),
}

# One subprocess per group. "1x8" (1x2x4) and "2x4" (2x1x4) put every device at the same coordinates: the same
# partitioned program, which XLA serves from its cache without a new HLO dump in the second case.
GROUPS = [
    (8, ["2x4", "4x2", "2x4/model"]),
    (8, ["1x8"]),
    (32, ["8x4", "8x4/model"]),
    (8, ["2x4/off"]),
    (32, ["8x4/off"]),
]


@pytest.mark.slow
@pytest.mark.parametrize("devices,cases", GROUPS, ids=["+".join(g) for _, g in GROUPS])
def test_cfg_parallel_compiles_to_its_plan(devices, cases):
    from conftest import fidelity_rows

    rows = fidelity_rows([__file__, str(devices), *cases], devices, len(cases))
    for row in rows:
        where = f"{row['case']}: {row['strategies']}\n" + "\n".join(row["table"])
        split = CASES[row["case"]][3]
        assert row["chosen"] == (f"split({split})" if split else "off"), where
        assert ("cfg" in row["plan_mesh"]["axis_names"]) == bool(split), where
        if not split:  # sequence parallel survives the whole batch of 2
            assert any("SP(" in s for s in row["strategies"].values()), where
        assert row["pcc"] >= 0.99999 and row["max_abs"] < 1e-5, (where, row["pcc"], row["max_abs"])
        assert row["pcc_one_device"] >= 0.99999, (where, row["pcc_one_device"])
        assert row["sharded_params"] > 0 and row["matches"], where
        matches = row["matches"]
        if row["case"] in ("4x2", "2x4/model"):
            # 2x2x2 meshes with a cfg axis: the FFN's FSDP twin (one block) splits net.0's weight rows over
            # (model, batch); GSPMD gathers it whole over (batch, model) and slices, where the plan (and GSPMD on
            # a 2-D mesh) gathers over batch only: one gather moves to the other axes at twice the bytes. Pinned
            # so we notice when it changes; the rule behind it is not known (the same form on 2x4x4 is as
            # predicted), so the planner does not model it
            by = {(m["kind"], tuple(m["axes"])): m for m in matches}
            on_batch, on_both = by[("all-gather", ("batch",))], by[("all-gather", ("batch", "model"))]
            assert on_batch["predicted_count"] - 1 == on_batch["observed_count"], where
            assert on_both["predicted_count"] + 1 == on_both["observed_count"], where
            matches = [m for m in matches if m["kind"] != "all-gather"]
        if row["case"] == "8x4/model":
            # GSPMD gathers some FSDP weights over (batch, model) where the plan gathers over batch only; pinned
            # so we notice when it changes (planner/cfg.py: why such splits are not tried by default)
            deviating = [m for m in matches if m["axes"] == ["batch", "model"] and m["kind"] == "all-gather"]
            assert deviating and deviating[0]["predicted_count"] == 0 < deviating[0]["observed_count"], where
            matches = [m for m in matches if m["kind"] != "all-gather"]
        assert all("cfg" not in m["axes"] for m in matches), where
        assert_matches_prediction(matches, where)


# --- the subprocess -------------------------------------------------------------------------------


def _main(devices: int, cases: list[str]) -> None:
    import tempfile

    from wancompile import runtime

    dump = Path(tempfile.mkdtemp(prefix="wancompile-cfg-fidelity-"))
    runtime.configure(num_devices=devices, dump_dir=dump / "hlo")

    import torch

    from planner.cfg import plan_dit
    from planner.mesh import parse_mesh
    from planner.plan import save_plan
    from wancompile.backend import default_hardware
    from wancompile.capture import capture_module
    from wancompile.models import build_transformer, transformer_inputs
    from wancompile.verify import numerics, run_with_backend

    model = build_transformer("tiny")
    cond = transformer_inputs("tiny", "tiny", 9, seed=1)
    uncond = transformer_inputs("tiny", "tiny", 9, seed=2)
    # the CFG pair: same latents and timestep, two prompt embeddings (as WanPipeline's two calls)
    uncond = {**cond, "encoder_hidden_states": uncond["encoder_hidden_states"]}
    pair = {k: torch.cat([cond[k], uncond[k]]) for k in cond}
    with torch.no_grad():
        eager = torch.cat([model(**cond, return_dict=False)[0], model(**uncond, return_dict=False)[0]])
    for case in cases:
        mesh, budget, axes, _ = CASES[case]
        options = {"mesh": mesh, "memory_gb": budget, "cfg_parallel": "on" if CASES[case][3] else "off"}
        if axes is not None:
            graph, _ = capture_module(model, **pair, return_dict=False, model="wan-dit")
            spec = parse_mesh(mesh)
            saved = plan_dit(graph, spec, default_hardware(spec), cfg_parallel="on", cfg_axes=axes, memory_gb=budget)
            options["plan"] = str(save_plan(saved, dump / f"{case.replace('/', '-')}.plan.json"))
        out, ref, program = run_with_backend(model, pair, **options)
        plan = program.plan
        save_plan(plan, dump / f"{case.replace('/', '-')}.compiled.plan.json")  # next to the HLO, to read both
        result, one = numerics(out[0], eager), numerics(out, ref)
        row = fidelity_row(
            case,
            result,
            program,
            mesh=mesh,
            plan_mesh=plan.mesh.to_json(),
            chosen=plan.cfg_parallel.chosen,
            options=[o.to_json() for o in plan.cfg_parallel.options],
            pcc_one_device=one.pcc,
            max_abs_one_device=one.max_abs,
            sharded_params=len(plan.sharded_params()),
        )
        print("FIDELITY " + json.dumps(row), flush=True)
        print(
            f"{case} -> {plan.mesh} {plan.mesh.axis_names}: vs eager two batch-1 forwards {result}; "
            f"vs one device {one}; " + "; ".join(f"{k}: {v}" for k, v in row["strategies"].items()),
            flush=True,
        )
        for line in row["table"]:
            print("   ", line, flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    _main(int(sys.argv[1]), sys.argv[2:])
