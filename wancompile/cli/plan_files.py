"""The verbs that read saved plans: ``explain``, ``diff``, ``export``, ``report``, ``validate``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from wancompile.cli.args import UsageError, check_out_dir


def _load(path: str):
    from wancompile.report import Report

    return Report.load(path)


def explain_command(args: argparse.Namespace) -> int:
    from wancompile.report.explain import explain

    print(explain(_load(args.plan), args.what))
    return 0


def diff_command(args: argparse.Namespace) -> int:
    from wancompile.report.diff import diff

    print(diff(_load(args.plan_a), _load(args.plan_b)))
    return 0


def export_command(args: argparse.Namespace) -> int:
    from wancompile.report.export import export_python

    if args.output:
        if Path(args.output).is_dir():
            raise UsageError(f"-o {args.output} is a directory; give the path of the .py file to write")
        check_out_dir(Path(args.output).parent, "-o")
    text = export_python(_load(args.plan))
    if args.output:
        from planner.files import write_text

        write_text(args.output, text)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def report_command(args: argparse.Namespace) -> int:
    from wancompile.report import write_dumps

    rep = _load(args.plan)
    out = Path(args.out) if args.out else Path(rep.source).parent
    check_out_dir(out, "--out")
    paths = write_dumps(rep.plan, out, report=rep)
    for kind in ("json", "md", "html"):
        print(f"wrote {paths[kind]}")
    return 0


def validate_command(args: argparse.Namespace) -> int:
    import json

    from wancompile.report.schema import errors

    bad = 0
    for path in args.plans:
        p = Path(path)
        p = p / "plan.json" if p.is_dir() else p
        try:
            errs = errors(json.loads(p.read_text()))
        except OSError as e:
            print(f"wancompile validate: cannot read {p}: {e.strerror}", file=sys.stderr)
            bad += 1
            continue
        except json.JSONDecodeError as e:
            print(
                f"wancompile validate: {p} is not valid JSON ({e.msg} at line {e.lineno}); it may be truncated — regenerate it",
                file=sys.stderr,
            )
            bad += 1
            continue
        print(f"{p}: " + ("valid" if not errs else f"{len(errs)} problem(s)"))
        for e in errs[:20]:
            print(f"  {e}")
        bad += bool(errs)
    return 1 if bad else 0
