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
It shows its stages on stderr as it goes and ends with one summary line on stdout: time per forward,
memory against the budget, and against the tt-xla hand plan (how many times faster; whether it fits).
``-v`` (before or after the verb) logs steps and decisions (``-vv``: debug) under the ``wancompile``
logger on stderr. The verbs that read saved plans import neither torch, diffusers nor torch_xla.

The argparse wiring and `main` live here; each verb group in its module: `plan` (wancompile.cli.plan),
the verbs on saved plans (`plan_files`), `tt-check` (`tt`), shared pieces in `args`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from planner.errors import Error
from wancompile.cli.args import (
    FAILURE_EXIT,
    USAGE_EXIT,
    UsageError,
    _Parser,
    count_flag,
    number_flag,
)
from wancompile.cli.plan import plan_command
from wancompile.cli.plan_files import (
    diff_command,
    explain_command,
    export_command,
    report_command,
    validate_command,
)
from wancompile.cli.tt import tt_check_command


class _PlanHelp(argparse.HelpFormatter):
    """Fills ``{passes}`` in a help text with the rewrite passes' names when help is printed: `rewrites`
    imports torch.fx, which the verbs that only read a plan never need."""

    def _get_help_string(self, action):
        text = super()._get_help_string(action) or ""
        if "{passes}" in text:
            from rewrites import PASS_NAMES

            text = text.replace("{passes}", ", ".join(PASS_NAMES))
        return text


_VERBOSE_HELP = "log progress (-v) or debug detail (-vv) to stderr"


def _parser() -> argparse.ArgumentParser:
    from planner.targets import TARGETS

    # -v counts before the verb and after it (`wancompile -v plan`, `wancompile plan -v`): two dests,
    # added up in `main`, since a subparser's own default would overwrite the top-level count
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", dest="verbose_after", action="count", default=0, help=_VERBOSE_HELP)
    p = _Parser(prog="wancompile", description="Wan 2.2 auto-sharding compiler tools")
    p.add_argument("-v", "--verbose", action="count", default=0, help=_VERBOSE_HELP)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    plan = sub.add_parser(
        "plan",
        parents=[common],
        formatter_class=_PlanHelp,
        help="plan a model's sharding on the meta device; write plan.json, plan.md, plan.html",
    )
    plan.add_argument("--model", required=True, help="wan2.2-t2v-a14b | wan2.2-i2v-a14b | wan2.2-ti2v-5b | tiny")
    plan.add_argument("--component", default="transformer", choices=["transformer"])
    plan.add_argument("--mesh", required=True, help="mesh shape, e.g. 8x4 (axes batch, model)")
    plan.add_argument(
        "--hardware",
        default=None,
        help="hardware profile (planner.hardware.PROFILES); default: the system with this mesh shape",
    )
    plan.add_argument("--resolution", default=None, help="a resolution of the model (default: 720p; tiny: tiny)")
    count_flag(plan, "--frames", None, "video frames, 4k+1 (default: 81; tiny: 9)")
    plan.add_argument("--out", required=True, help="directory for plan.json, plan.md, plan.html")
    number_flag(plan, "--memory-gb", None, "per-device budget (default: the profile's DRAM)")
    count_flag(plan, "--experts", None, "weight sets resident per device (default 2 for A14B, else 1)")
    plan.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    count_flag(plan, "--capture-blocks", 2, "blocks captured on meta (decisions are shared by all blocks)")
    number_flag(plan, "--time-limit", 5.0, "solver time limit, seconds", positive=False)
    count_flag(
        plan,
        "--batch",
        1,
        "batch of the planned forward; 2 = a denoising step's CFG pair as one forward (cond + uncond)",
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
        default="default",
        help="graph rewrites to run before planning, as the backend's `rewrites` option: 'all', 'none', "
        "'default' (the target's: every pass for tt-mlir, none for gspmd) or a comma-separated list of {passes}",
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
        choices=list(TARGETS),
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
        help="compile a tiny model's programs (or a full-size model's first --blocks at full width) through tt-mlir "
        "(compile-only) and compare TTNN's collectives and DRAM per chip with the plan's",
    )
    tt.add_argument(
        "--model",
        default="tiny",
        help="tiny, or a tiny Wan-family DiT (wan-i2v, wan-ti2v, ...: wancompile.models.FAMILIES) (transformer); "
        "tiny-wan2.1 | tiny-wan2.2 (vae); full size, exported without running: a "
        "transformer (wan2.2-t2v-a14b, ...) with --blocks, or a VAE (wan2.1 | wan2.2) with --component vae",
    )
    tt.add_argument("--component", default="transformer", choices=["transformer", "vae"])
    tt.add_argument("--mesh", required=True, help="mesh shape, e.g. 2x4 (axes batch, model)")
    tt.add_argument(
        "--system", required=True, action="append", choices=systems, help="system descriptor (repeat for several)"
    )
    tt.add_argument("--plan", default=None, help="a saved plan.json, or tt-xla (the seed's hand plan)")
    number_flag(tt, "--memory-gb", None)
    tt.add_argument(
        "--tightest",
        action="store_true",
        help="a tiny DiT: plan at the smallest per-device budget the planner accepts on --mesh",
    )
    tt.add_argument(
        "--unannotated",
        action="store_true",
        help="also compile each main program with its plan taken out, and hold the pinned program's fused "
        "kernels and moves per block against it (a second compile per program)",
    )
    tt.add_argument(
        "--rewrites",
        default="default",
        help="as the backend's `rewrites` option (default: tt-mlir's, every pass; plan.json's rewrites[].why says)",
    )
    tt.add_argument("--hardware", default=None, help="cost-model profile (default: the mesh's)")
    count_flag(tt, "--frames", None, "video frames (default: 9 for a tiny model, 81 at full size)")
    count_flag(
        tt,
        "--blocks",
        None,
        "full size: compile this many blocks of --model at full width (with the embedders and the output), "
        "planned for all of them; exported without running",
    )
    tt.add_argument("--resolution", default="720p", help="full size: as `wancompile plan --resolution`")
    tt.add_argument(
        "--dtype",
        default=None,
        choices=["bfloat16", "float32"],
        help="the model as a pipeline loads it in this dtype (default: bfloat16 at full size, float32 for a tiny model)",
    )
    count_flag(tt, "--experts", None, "full size: weight sets resident per device (default 2 for A14B, else 1)")
    count_flag(tt, "--batch", 1, "2: a CFG pair as one forward")
    tt.add_argument("--cfg-parallel", choices=["auto", "on", "off"], default="auto")
    count_flag(tt, "--t-chunk", None, "vae: chunked-T, k frames")
    tt.add_argument(
        "--out",
        default=None,
        help="directory for the programs and IRs (default: a new run-* folder under tt-check/ in the tt cache, "
        "WANCOMPILE_TT_CACHE or ~/.cache/wancompile/tt; printed)",
    )
    tt.add_argument("--json", action="store_true", help="print one JSON object")
    return p


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
    from wancompile.progress import setup_logging

    args = _parser().parse_args(argv)
    args.verbose += args.verbose_after  # `wancompile -v plan` and `wancompile plan -v` alike
    setup_logging(args.verbose)
    prog = f"wancompile {args.command}"
    try:
        return COMMANDS[args.command](args)
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        error = e
    if isinstance(error, UsageError):
        code, line = USAGE_EXIT, f"{prog}: error: {error}"
    elif isinstance(error, Error):  # every error the project raises says what to do (docs/errors.md)
        code, line = USAGE_EXIT, f"{prog}: {error}"
    elif isinstance(error, OSError):
        where = f" {error.filename}" if error.filename else ""
        code, line = FAILURE_EXIT, f"{prog}: cannot write{where}: {error.strerror or error}"
    else:  # a bug, not a user mistake: still one line (the traceback with -v)
        code, line = (
            FAILURE_EXIT,
            f"{prog}: internal error: {type(error).__name__}: {error} (run with -v for the traceback, and report it)",
        )
    if args.verbose:
        import traceback

        traceback.print_exception(error)  # the error's own traceback (print_exc here has none: `NoneType: None`)
    print(line, file=sys.stderr)
    return code
