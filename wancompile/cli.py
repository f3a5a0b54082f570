"""The ``wancompile`` console script.

    wancompile plan --model M --component transformer --mesh 8x4 --hardware wh-galaxy \\
                    --resolution 720p --frames 81 --out DIR     # DIR/plan.json, plan.md, plan.html
    wancompile explain PLAN NODE-OR-PARAM                       # one decision / parameter / op
    wancompile diff PLAN_A PLAN_B                               # what changed, cost deltas
    wancompile export PLAN --format python [-o FILE]            # plain-torch_xla sharding module
    wancompile report PLAN [--out DIR]                          # re-render plan.md / plan.html
    wancompile validate PLAN...                                 # check against plan.schema.json

``plan`` works on the meta device (no weights, no accelerator): it captures a 2-block copy of the
transformer (the planner shares decisions across identical blocks and writes them for all blocks by
name), solves, and writes the dumps. PLAN arguments take a plan.json or the directory holding it.
``-v`` logs steps and decisions (``-vv``: debug) under the ``wancompile`` logger on stderr.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

log = logging.getLogger("wancompile")

USAGE_EXIT = 2  # argparse's convention for usage errors; every bad input through the CLI exits with it
FAILURE_EXIT = 1  # the input was fine but the work failed (a file that cannot be written, invalid plans)


class UsageError(Exception):
    """A bad command-line value; `main` prints it as one line and exits with USAGE_EXIT."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``wancompile plan: error: ...`` and exit 2, no usage block."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(USAGE_EXIT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _positive_int(what: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} must be a whole number, got {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{what} must be at least 1, got {value}")
        return value

    return parse


def _number(what: str, *, positive: bool):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} must be a number, got {text!r}") from None
        if not math.isfinite(value) or (value <= 0 if positive else value < 0):
            raise argparse.ArgumentTypeError(f"{what} must be {'positive' if positive else 'zero or more'}, got {text}")
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    from rewrites import PASS_NAMES

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-v", "--verbose", action="count", default=0, help="log progress (-v) or debug detail (-vv) to stderr"
    )
    p = _Parser(prog="wancompile", description="Wan 2.2 auto-sharding compiler tools", parents=[common])
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    plan = sub.add_parser(
        "plan", parents=[common], help="plan a model's sharding on the meta device; write plan.json, plan.md, plan.html"
    )
    plan.add_argument("--model", required=True, help="wan2.2-t2v-a14b | wan2.2-i2v-a14b | wan2.2-ti2v-5b | tiny")
    plan.add_argument("--component", default="transformer", choices=["transformer"])
    plan.add_argument("--mesh", required=True, help="mesh shape, e.g. 8x4 (axes batch, model)")
    plan.add_argument(
        "--hardware",
        default=None,
        help="hardware profile (planner.hardware.PROFILES); default: the system with this mesh shape",
    )
    plan.add_argument("--resolution", default="720p")
    plan.add_argument("--frames", type=_positive_int("--frames"), default=81, help="video frames, 4k+1 (81)")
    plan.add_argument("--out", required=True, help="directory for plan.json, plan.md, plan.html")
    plan.add_argument(
        "--memory-gb",
        type=_number("--memory-gb", positive=True),
        default=None,
        help="per-device budget (default: the profile's DRAM)",
    )
    plan.add_argument(
        "--experts",
        type=_positive_int("--experts"),
        default=None,
        help="weight sets resident per device (default 2 for A14B, else 1)",
    )
    plan.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    plan.add_argument(
        "--capture-blocks",
        type=_positive_int("--capture-blocks"),
        default=2,
        help="blocks captured on meta (decisions are shared by all blocks)",
    )
    plan.add_argument(
        "--time-limit", type=_number("--time-limit", positive=False), default=5.0, help="solver time limit, seconds"
    )
    plan.add_argument(
        "--batch",
        type=_positive_int("--batch"),
        default=1,
        help="batch of the planned forward; 2 = a denoising step's CFG pair as one forward (cond + uncond)",
    )
    plan.add_argument(
        "--cfg-parallel",
        choices=["auto", "on", "off"],
        default="auto",
        help="batch-2 graphs: split the batch over half the mesh each (on), never (off), or as the cost "
        "model decides (auto, default); every option is priced and written to the plan",
    )
    plan.add_argument(
        "--rewrites",
        default="none",
        help="graph rewrites to run before planning, as the backend's `rewrites` option: 'all', 'none' "
        f"(default) or a comma-separated list of {', '.join(PASS_NAMES)}",
    )
    plan.add_argument(
        "--preset",
        choices=["auto", "tt-xla"],
        default="auto",
        help="auto: the solver decides (default); tt-xla: the seed's hand plan through the same engine "
        "(head-TP / Megatron on the last mesh axis, SP on the others, STATE A), its decisions and bill the rules', "
        "within --memory-gb only when that is given; `--hand tt-xla` is the same",
    )
    plan.add_argument(
        "--target",
        choices=["gspmd", "tt-mlir"],
        default=None,
        help="the partitioner the plan is for (default: tt-mlir when --hardware names a Tenstorrent profile, "
        "else gspmd); recorded in plan.json",
    )
    plan.add_argument(
        "--hand",
        choices=["tt-xla"],
        default=None,
        help="an alias of --preset tt-xla (the seed's hand plan, seed 000, through the same engine)",
    )

    ex = sub.add_parser("explain", parents=[common], help="explain one decision, parameter, module or op of a plan")
    ex.add_argument("plan", help="plan.json or its directory")
    ex.add_argument("what", help="e.g. attn1, blocks.3.ffn, blocks.0.attn1.to_q.weight, proj_out:linear#0")

    df = sub.add_parser(
        "diff", parents=[common], help="compare two plans: decisions, parallelism, collectives, cost deltas"
    )
    df.add_argument("plan_a")
    df.add_argument("plan_b")

    xp = sub.add_parser("export", parents=[common], help="export a plan as a Python module for plain torch_xla")
    xp.add_argument("plan")
    xp.add_argument("--format", default="python", choices=["python"])
    xp.add_argument("-o", "--output", default=None, help="file to write (default: stdout)")

    rp = sub.add_parser("report", parents=[common], help="re-render plan.md and plan.html from a plan.json")
    rp.add_argument("plan")
    rp.add_argument("--out", default=None, help="directory (default: the plan's)")

    va = sub.add_parser(
        "validate", parents=[common], help="check plan.json files against wancompile/schema/plan.schema.json"
    )
    va.add_argument("plans", nargs="+")

    from wancompile.tt.env import SYSTEMS_DIR

    systems = sorted(p.stem for p in SYSTEMS_DIR.glob("*.ttsys"))
    tt = sub.add_parser(
        "tt-check",
        parents=[common],
        help="compile a tiny model's programs through tt-mlir (compile-only) and compare TTNN's collectives with the plan's",
    )
    tt.add_argument("--model", default="tiny", help="tiny (transformer); tiny-wan2.1 | tiny-wan2.2 (vae)")
    tt.add_argument("--component", default="transformer", choices=["transformer", "vae"])
    tt.add_argument("--mesh", required=True, help="mesh shape, e.g. 2x4 (axes batch, model)")
    tt.add_argument(
        "--system", required=True, action="append", choices=systems, help="system descriptor (repeat for several)"
    )
    tt.add_argument("--plan", default=None, help="a saved plan.json, or tt-xla (the seed's hand plan)")
    tt.add_argument("--memory-gb", type=_number("--memory-gb", positive=True), default=None)
    tt.add_argument("--rewrites", default="none", help="as the backend's `rewrites` option")
    tt.add_argument("--hardware", default=None, help="cost-model profile (default: the mesh's)")
    tt.add_argument("--frames", type=_positive_int("--frames"), default=9)
    tt.add_argument("--batch", type=_positive_int("--batch"), default=1, help="2: a CFG pair as one forward")
    tt.add_argument("--cfg-parallel", choices=["auto", "on", "off"], default="auto")
    tt.add_argument("--t-chunk", type=_positive_int("--t-chunk"), default=None, help="vae: chunked-T, k frames")
    tt.add_argument("--out", default=None, help="directory for the programs and IRs (default: a new temp dir)")
    tt.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def _check_plan_args(args: argparse.Namespace):
    """Every value `plan` needs, checked before anything slow runs: (model spec, mesh, hardware)."""
    from planner.hardware import UnknownHardware, resolve_hardware
    from planner.mesh import MeshError, parse_mesh
    from wancompile.models import get_model

    try:
        spec = get_model(args.model)
    except ValueError as e:
        raise UsageError(f"--model: {e}") from None
    try:
        spec.latent_shape(args.resolution, args.frames)
    except ValueError as e:
        raise UsageError(f"--{'resolution' if 'resolution' in str(e) else 'frames'}: {e}") from None
    try:
        mesh = parse_mesh(args.mesh)
    except MeshError as e:
        raise UsageError(f"--mesh: {e}") from None
    try:
        hw = resolve_hardware(args.hardware, mesh)
    except UnknownHardware as e:
        raise UsageError(f"--hardware: {e}") from None
    args.hardware = hw.name
    native = "x".join(map(str, hw.mesh_shape))
    if mesh.size > math.prod(hw.mesh_shape):
        raise UsageError(
            f"--mesh {mesh} has {mesh.size} devices but {hw.name} has {math.prod(hw.mesh_shape)} ({native}); "
            f"choose a profile for a system that large or a mesh of at most {math.prod(hw.mesh_shape)} devices"
        )
    if tuple(mesh.shape) != tuple(hw.mesh_shape):
        print(
            f"wancompile plan: warning: {hw.name}'s native mesh is {native}; mesh {mesh} is priced as part of it "
            f"(its links per axis). Pass --hardware for a {mesh} system if there is one",
            file=sys.stderr,
        )
    _check_out_dir(Path(args.out), "--out")
    from wancompile.options import OptionsError, parse_rewrites

    try:
        args.rewrites = parse_rewrites(args.rewrites)
    except OptionsError as e:
        raise UsageError(f"--rewrites: {e}") from None
    return spec, mesh


def _check_out_dir(out: Path, flag: str) -> None:
    """`out` exists as a writable directory (created if needed), else a UsageError naming `flag`."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"{flag} {out} is a file; give a directory to write into")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{flag} {out}: cannot create the directory ({e.strerror})") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {out}: the directory is not writable; choose another --out")


def plan_command(args: argparse.Namespace) -> int:
    from wancompile.progress import Progress

    explicit_hardware = args.hardware  # the target follows a named profile, not the mesh's default

    spec, mesh = _check_plan_args(args)
    progress = Progress(3)
    with progress.step(f"capturing {args.capture_blocks}-block {args.model} {args.component} on meta"):
        import torch

        from wancompile.capture import capture_module
        from wancompile.models import build_transformer, transformer_inputs

        dtype = getattr(torch, args.dtype)
        num_layers = spec.transformer["num_layers"]
        module = build_transformer(args.model, device="meta", num_layers=min(args.capture_blocks, num_layers)).to(dtype)
        inputs = transformer_inputs(
            args.model, args.resolution, args.frames, device="meta", dtype=dtype, batch=args.batch
        )
        graph, gm = capture_module(module, **inputs, return_dict=False, model=args.model)
        if args.rewrites:
            from wancompile.backend import rewrite_graph
            from wancompile.capture import annotate

            gm, records = rewrite_graph(gm, mesh, args.rewrites, args.hardware)
            graph = annotate(gm, model=args.model)
    log.info("captured %s", graph.summary())

    from planner.cfg import plan_dit
    from wancompile.backend import HeadPadder

    padder = HeadPadder(gm, graph)  # padded-head options where a split does not divide the heads

    experts = args.experts if args.experts is not None else (2 if "a14b" in args.model else 1)
    hand = args.hand or (args.preset if args.preset != "auto" else None)  # --hand X: an alias of --preset X
    with progress.step("planning" + (" (tt-xla hand plan)" if hand else f" on {mesh} for {args.hardware}")):
        if hand == "tt-xla":
            from planner.hand_plans import tt_xla_plan

            plan = tt_xla_plan(
                graph,
                mesh,
                args.hardware,
                model=args.model,
                memory_gb=args.memory_gb,
                num_blocks=num_layers,
                weight_copies=experts,
                time_limit_s=args.time_limit,
            )
        else:
            plan = plan_dit(
                graph,
                mesh,
                args.hardware,
                cfg_parallel=args.cfg_parallel,
                memory_gb=args.memory_gb,
                num_blocks=num_layers,
                weight_copies=experts,
                time_limit_s=args.time_limit,
                model=args.model,
                preset=args.preset,
                pad_heads=padder,
            )
            graph = padder.graphs(plan.head_padding)[1]  # the graph the plan's locations name
    if args.rewrites:
        plan = plan.with_(rewrites=records)
    from planner.targets import default_target

    plan = plan.with_(target=args.target or default_target(explicit_hardware))
    for d in plan.decisions:
        log.info("decision %s: %s (next best %s)", d.node, d.strategy, d.rejected or "-")

    from wancompile.report import write_dumps

    with progress.step("writing plan.json, plan.md, plan.html"):
        paths = write_dumps(plan, args.out, graph=graph, hardware=args.hardware, num_blocks=num_layers)
    p = plan.predicted
    print(plan.summary())
    print(
        f"  tokens per forward: {spec.tokens(args.resolution, args.frames)}; blocks: {num_layers}; weight sets resident: {experts}"
    )
    if p.step_seconds:
        print(
            f"  predicted per forward: {p.step_seconds * 1e3:.1f} ms = compute {p.compute_seconds * 1e3:.1f} ms "
            f"({100 * p.compute_seconds / p.step_seconds:.0f}%) + comm {p.comm_seconds * 1e3:.1f} ms "
            f"({100 * p.comm_seconds / p.step_seconds:.0f}%)"
        )
    print(f"  memory per device: {p.memory_bytes_per_device / 1e9:.2f} GB")
    print(
        f"  solver: {plan.solver.status}, {plan.solver.seconds:.3f} s solving, gap {plan.solver.gap:.2%}; "
        f"capture {progress.times.get(next(iter(progress.times)), 0):.2f} s"
    )
    if plan.cfg_parallel is not None:
        c = plan.cfg_parallel
        print(
            f"  CFG parallel ({c.mode}): chosen {c.chosen}; "
            + "; ".join(
                f"{o.name} {o.step_seconds * 1e3:.1f} ms/step, {o.memory_bytes_per_device / 1e9:.2f} GB/device"
                + ("" if o.feasible else " (the caller's to run)")
                if o.step_seconds is not None
                else f"{o.name}: no plan"
                for o in c.options
            )
        )
    for d in plan.decisions:
        print(f"  {d.node}: {d.strategy}" + (f"  (next best: {d.rejected})" if d.rejected else ""))
    for n in plan.notes[2:]:
        print(f"  note: {n}")
    for kind in ("json", "md", "html"):
        print(f"wrote {paths[kind]}")
    return 0


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
        _check_out_dir(Path(args.output).parent, "-o")
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
    _check_out_dir(out, "--out")
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


COMMANDS = {
    "tt-check": tt_check_command,
    "plan": plan_command,
    "explain": explain_command,
    "diff": diff_command,
    "export": export_command,
    "report": report_command,
    "validate": validate_command,
}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run one verb. Bad input ends in one line on stderr, ``wancompile VERB: ...``, and exit 2
    (a file that cannot be written: exit 1); a traceback only with ``-v``."""
    from planner.mesh import MeshError
    from planner.plan import PlanError
    from wancompile.options import OptionsError
    from wancompile.progress import setup_logging
    from wancompile.report.schema import SchemaError

    args = _parser().parse_args(argv)
    setup_logging(args.verbose)
    prog = f"wancompile {args.command}"
    try:
        return COMMANDS[args.command](args)
    except UsageError as e:
        code, line = USAGE_EXIT, f"{prog}: error: {e}"
    except (PlanError, MeshError, OptionsError, SchemaError) as e:
        code, line = USAGE_EXIT, f"{prog}: {e}"
    except OSError as e:
        where = f" {e.filename}" if e.filename else ""
        code, line = FAILURE_EXIT, f"{prog}: cannot write{where}: {e.strerror or e}"
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # a bug, not a user mistake: still one line (the traceback with -v)
        code, line = (
            FAILURE_EXIT,
            f"{prog}: internal error: {type(e).__name__}: {e} (run with -v for the traceback, and report it)",
        )
    if args.verbose:
        import traceback

        traceback.print_exc()
    print(line, file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
