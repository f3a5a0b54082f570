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
    _record_memory(out / "plan.json", report.checks)
    if args.json:
        print(json.dumps(report.to_json() | {"out": str(out)}))
    else:
        print(report.plan_summary)
        print(f"  pinned for tt-mlir: {report.pins} pins, {report.constraints} constraints in all")
        print(f"  on CPU (GSPMD) vs eager fp32: PCC {report.pcc:.7f}, max-abs {report.max_abs:.2e}")
        print(format_checks(report.checks))
        print(f"programs and IRs: {out}")
    return 0 if report.ok else 1


def _record_memory(path: Path, checks) -> None:
    """The main program's TTNN memory per system, beside the planner's estimate in the dump's plan.json."""
    from planner.hardware import get_profile
    from planner.plan import CompiledMemory, load_plan, save_plan
    from wancompile.tt.env import SYSTEM_PROFILES

    if not path.exists():
        return
    rows = tuple(
        CompiledMemory(
            c.system,
            c.memory.peak_bytes,
            c.memory.peak_logical_bytes,
            c.memory.arguments_bytes,
            c.memory.constants_bytes,
            c.planned_bytes,
            int(get_profile(SYSTEM_PROFILES[c.system]).dram_bytes.value) if c.system in SYSTEM_PROFILES else 0,
        )
        for c in checks
        if c.memory is not None and c.planned_bytes is not None
    )
    if rows:
        save_plan(load_plan(path).with_(compiled_memory=rows), path)
