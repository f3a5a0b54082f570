"""Compile a tiny random-weight Wan DiT with backend="wan_autoshard" on virtual CPU devices.

    python examples/tiny_dit_sharded.py --mesh 2x4 [--plan FILE|tt-xla] [--hardware NAME] [--memory-gb GB] [--json]
                                        [--dump-dir DIR]

Arranges as many virtual XLA CPU devices as the mesh has, compiles the unmodified diffusers
`WanTransformer3DModel` with `torch.compile(..., backend="wan_autoshard")`, runs it, and reports how
the sharded result compares with the same graph on one XLA device (PCC, max-abs) and which
collectives the compiled (partitioned) program holds. Its files (the backend's plan.json, plan.md,
plan.html and XLA's HLO dumps) go to one folder it prints: ``out/tiny_dit_sharded`` unless ``--dump-dir``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

DEFAULT_DUMP = Path("out") / "tiny_dit_sharded"  # relative to where it runs; out/ is git-ignored


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mesh", default="2x4", help="device mesh, e.g. 2x4, 1x4, 8x4")
    p.add_argument(
        "--plan", default=None, help="a saved plan.json to run instead of planning, or 'tt-xla' (the seed's hand plan)"
    )
    p.add_argument(
        "--hardware", default=None, help="cost-model profile (default: by mesh shape, e.g. wh-loudbox for 2x4)"
    )
    p.add_argument("--memory-gb", type=float, default=None, help="per-device memory budget for the planner")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument(
        "--dump-dir",
        default=None,
        help=f"where plan.json, plan.md, plan.html and the HLO dumps go (default: {DEFAULT_DUMP}, replaced by each run)",
    )
    p.add_argument("--frames", type=int, default=9, help="video frames (4k+1); 9 -> 3 latent frames, 48 tokens")
    args = p.parse_args(argv)

    from planner.mesh import MeshError, parse_mesh

    try:
        mesh = parse_mesh(args.mesh)
    except MeshError as e:
        p.error(str(e))
    dump_dir = Path(args.dump_dir or DEFAULT_DUMP)
    if args.dump_dir is None:  # the example's own folder: this run's files only (XLA numbers its dumps on)
        shutil.rmtree(dump_dir, ignore_errors=True)

    from wancompile import runtime

    # Must happen before torch_xla starts: the device count and dump directory are fixed then.
    runtime.configure(num_devices=mesh.size, dump_dir=dump_dir / "hlo")

    import torch

    from wancompile.backend import last_program
    from wancompile.models import build_transformer, transformer_inputs
    from wancompile.progress import GSPMD_DEPRECATION, without_stderr_lines
    from wancompile.verify import compare_collectives, numerics

    model = build_transformer("tiny")
    inputs = transformer_inputs("tiny", "tiny", args.frames)
    options = {"mesh": args.mesh, "dump_dir": str(dump_dir)}
    for key in ("plan", "hardware", "memory_gb"):
        if getattr(args, key) is not None:
            options[key] = getattr(args, key)
    compiled = torch.compile(model, backend="wan_autoshard", options=options, fullgraph=True)
    with torch.no_grad(), without_stderr_lines(GSPMD_DEPRECATION):
        out = compiled(**inputs, return_dict=False)[0]
    program = last_program()
    with torch.no_grad(), without_stderr_lines(GSPMD_DEPRECATION):
        ref = program.replicated()(*_last_args(program, model, inputs))[0]
        eager = model(**inputs, return_dict=False)[0]
    result = numerics(out, ref)
    vs_eager = numerics(out, eager)
    collectives = program.collectives()
    matches = compare_collectives(program.plan.collectives, collectives)

    report = {
        "mesh": list(mesh.shape),
        "axis_names": list(mesh.axis_names),
        "devices": mesh.size,
        "plan": str(dump_dir / "plan.json"),
        "solver": program.plan.solver.status,
        "pcc": result.pcc,
        "max_abs": result.max_abs,
        "eager_pcc": vs_eager.pcc,
        "eager_max_abs": vs_eager.max_abs,
        "collectives": [
            {"kind": c.kind, "axes": list(c.axes), "bytes": c.bytes, "shape": c.shape} for c in collectives
        ],
        "predicted_vs_compiled": [
            {
                "kind": m.kind,
                "axes": list(m.axes),
                "predicted": m.predicted_count,
                "compiled": m.observed_count,
                "predicted_bytes": m.predicted_bytes,
                "compiled_bytes": m.observed_bytes,
            }
            for m in matches
        ],
        "hlo": str(program.hlo_path),
    }
    if args.json:
        print(json.dumps(report))
        return 0
    print(program.plan.summary())
    print(f"sharded vs one XLA device: {result}")
    print(f"sharded vs eager CPU:      {vs_eager}  (XLA-vs-eager differences: docs/numerics.md)")
    print(f"compiled program: {program.hlo_path}")
    print("collectives, predicted by the plan vs in the compiled HLO:")
    for m in matches:
        print("  " + str(m))
    print(f"plan.json, plan.md, plan.html and the HLO: {dump_dir}/")
    return 0


def _last_args(program, model, inputs):
    from wancompile.verify import placeholder_args

    return placeholder_args(program.graph, model, inputs)


if __name__ == "__main__":
    sys.exit(main())
