"""``wancompile tt-check``: compile a tiny model's programs through tt-mlir and compare TTNN's collectives
with the plan's."""

from __future__ import annotations

import argparse
from pathlib import Path

from wancompile.cli.args import UsageError


def tt_check_command(args: argparse.Namespace) -> int:
    import json
    import tempfile

    from planner.mesh import parse_mesh
    from wancompile.tt.check import check_model, format_checks
    from wancompile.tt.env import TtUnavailable

    try:
        mesh = parse_mesh(args.mesh)
    except ValueError as e:
        raise UsageError(f"--mesh: {e}") from None
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="wancompile-tt-check-"))
    try:
        report = check_model(
            args.model,
            mesh,
            args.system,
            out,
            component=args.component,
            plan=args.plan,
            memory_gb=args.memory_gb,
            rewrites=args.rewrites,
            frames=args.frames,
            batch=args.batch,
            cfg_parallel=args.cfg_parallel,
            hardware=args.hardware,
            t_chunk=args.t_chunk,
        )
    except TtUnavailable as e:
        raise UsageError(str(e)) from None
    except Exception as e:  # the backend's own error, out of dynamo's BackendCompilerFailed
        inner = getattr(e, "inner_exception", None)
        if inner is not None:
            raise inner from None
        raise
    if args.json:
        print(json.dumps(report.to_json() | {"out": str(out)}))
    else:
        print(report.plan_summary)
        print(f"  pinned for tt-mlir: {report.pins} pins, {report.constraints} constraints in all")
        print(f"  on CPU (GSPMD) vs eager fp32: PCC {report.pcc:.7f}, max-abs {report.max_abs:.2e}")
        print(format_checks(report.checks))
        print(f"programs and IRs: {out}")
    return 0 if report.ok else 1
