"""The catalogue of bad inputs (docs/errors.md is rendered from it by tests/test_errors.py).

Each `Case` is one mistake a user can make, how to make it (`run`), what the project answers (error
type or CLI exit code, a message pattern) and the fix. `tests/test_errors.py` runs every case and
checks docs/errors.md against the messages it got; `tests/test_fuzz.py` names the catalogue case
(`documented`) of an error a fuzz case ends in (every fuzz case must plan).

Regenerate docs/errors.md after changing a case or a message:

    EXPECTTEST_ACCEPT=1 python -m pytest tests/test_errors.py
"""

from __future__ import annotations

import contextlib
import io
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Optional


@dataclass(frozen=True)
class Case:
    id: str
    where: str  # cli | backend | library
    input: str  # what the user did
    error: str  # exception type name, or "exit N" for the CLI
    pattern: str  # regular expression the message matches
    fix: str
    run: Callable[[Path], tuple[str, str]]  # -> (error as above, message); must not return normally otherwise
    needs_devices: bool = False  # runs through torch.compile on the 8 virtual devices


class NoError(AssertionError):
    pass


# --- how cases run ------------------------------------------------------------------------------------------


def cli(*argv: str) -> Callable[[Path], tuple[str, str]]:
    """Run ``wancompile ARGV`` in-process (``{tmp}`` in an argument is the case's temp directory):
    the exit code and the last stderr line; the run must print no traceback."""

    def run(tmp: Path) -> tuple[str, str]:
        from wancompile.cli import main

        args = [a.replace("{tmp}", str(tmp)) for a in argv]
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = main(args)
            except SystemExit as e:
                code = e.code
        text = err.getvalue()
        assert "Traceback" not in text, text
        lines = [line for line in text.splitlines() if line.startswith("wancompile")]
        if not code:
            raise NoError(f"wancompile {' '.join(args)} exited 0")
        return f"exit {code}", lines[-1].replace(str(tmp), "TMP") if lines else ""

    return run


def plan(*argv: str) -> Callable[[Path], tuple[str, str]]:
    """``wancompile plan`` on the tiny DiT (tiny resolution, 9 frames), `argv` overriding."""
    return cli("plan", "--model", "tiny", "--resolution", "tiny", "--frames", "9", *argv)


def raises(fn: Callable[[Path], object]) -> Callable[[Path], tuple[str, str]]:
    """Call `fn`; the error it raises (the backend's own, unwrapped from dynamo's BackendCompilerFailed),
    its type name marked when it is not a `wancompile.Error` (the one base every project error has)."""

    def run(tmp: Path) -> tuple[str, str]:
        from planner.errors import Error

        try:
            fn(tmp)
        except Exception as e:  # the catalogue records whatever comes out
            inner = getattr(e, "inner_exception", None) or e
            name = type(inner).__name__ if isinstance(inner, Error) else f"{type(inner).__name__} (not an Error)"
            return name, str(inner).replace(str(tmp), "TMP")
        raise NoError(f"{fn.__name__} raised nothing")

    run.raw = fn  # the call itself, for the test that the error comes out unwrapped
    return run


@lru_cache(maxsize=None)
def tiny_graph(resolution: str = "tiny", **overrides):
    """The tiny DiT captured on the meta device (no weights): what the planner sees."""
    from wancompile.capture import capture_module
    from wancompile.models import build_transformer, transformer_inputs

    m = build_transformer("tiny", device="meta", **overrides)
    inputs = transformer_inputs("tiny", resolution, 9, device="meta")
    return capture_module(m, **inputs, return_dict=False, model="tiny")[0]


def _plan_dir(tmp: Path) -> Path:
    """A real plan directory (the tiny hand plan on 2x4), for the verbs that read one."""
    from planner.hand_plans import tt_xla_plan
    from planner.mesh import parse_mesh
    from wancompile.report import write_dumps

    d = tmp / "plan"
    write_dumps(tt_xla_plan(tiny_graph(), parse_mesh("2x4")).with_(hardware="wh-loudbox"), d, graph=tiny_graph())
    return d


def _truncated(tmp: Path) -> Path:
    text = (_plan_dir(tmp) / "plan.json").read_text()
    bad = tmp / "truncated" / "plan.json"
    bad.parent.mkdir()
    bad.write_text(text[: len(text) // 2])
    return bad


def _cli_on(make: Callable[[Path], Path], *argv: str) -> Callable[[Path], tuple[str, str]]:
    def run(tmp: Path) -> tuple[str, str]:
        path = make(tmp)
        return cli(*[a.replace("{plan}", str(path)) for a in argv])(tmp)

    return run


# --- library / backend actions ----------------------------------------------------------------------------


def _options(options: Optional[dict] = None, env: Optional[dict] = None):
    """``torch.compile(nn.Linear(4, 4), backend="wan_autoshard", options=options)(x)`` with `env` added
    to the environment (``{tmp}`` in a string option is the case's temp directory): the backend refuses
    a bad option, or WANCOMPILE_* variable, before it plans anything."""

    def fn(tmp):
        import os
        from unittest import mock

        import torch

        given = {k: v.replace("{tmp}", str(tmp)) if isinstance(v, str) else v for k, v in (options or {}).items()}
        torch._dynamo.reset()
        with mock.patch.dict(os.environ, env or {}):
            torch.compile(torch.nn.Linear(4, 4), backend="wan_autoshard", options=given)(torch.randn(2, 4))

    return fn


def _memory(tmp):
    from planner import plan_graph
    from planner.mesh import parse_mesh

    plan_graph(tiny_graph(), parse_mesh("2x4"), memory_gb=1e-6)


def _timeout(tmp):
    from planner import plan_graph
    from planner.mesh import parse_mesh

    plan_graph(tiny_graph(), parse_mesh("2x4"), time_limit_s=0)


def _only_infeasible(tmp):
    from planner import plan_graph
    from planner.mesh import parse_mesh

    plan_graph(tiny_graph(), parse_mesh("2x4"), only={"attn1": r"^head-TP\(batchxmodel\)"})  # 4 heads over 8


def _tt_xla_tokens(tmp):
    from planner.hand_plans import tt_xla_plan
    from planner.mesh import parse_mesh

    tt_xla_plan(tiny_graph("480p"), parse_mesh("8x4"))  # 3 x 3 x 4 = 36 tokens over 8


def _tt_xla_heads(tmp):
    from planner.hand_plans import tt_xla_plan
    from planner.mesh import parse_mesh

    tt_xla_plan(tiny_graph(), parse_mesh("1x3"))


def _plan_other_heads(tmp):
    from planner.hand_plans import tt_xla_plan
    from planner.mesh import parse_mesh

    plan = tt_xla_plan(tiny_graph(), parse_mesh("2x4"))  # 4 heads x 16
    plan.check(tiny_graph(num_attention_heads=8, attention_head_dim=8))  # same parameter shapes, 8 heads x 8


def _plan_pads_unpaddable(tmp):
    from wancompile.backend import HeadPadder
    from wancompile.capture import capture_module
    from wancompile.models import build_transformer, transformer_inputs

    m = build_transformer("tiny", device="meta", num_attention_heads=16, attention_head_dim=4)
    graph, gm = capture_module(m, **transformer_inputs("tiny", "tiny", 9, device="meta"), return_dict=False)
    HeadPadder(gm, graph).graphs({"blocks.*.attn1": 16})  # what a plan padding 12 -> 16 asks of this model


def _plan_other_frames(tmp):
    from planner import plan_graph
    from planner.mesh import parse_mesh

    plan = plan_graph(tiny_graph(), parse_mesh("2x4"))  # 48 tokens
    plan.check(tiny_graph("480p"))  # 36 tokens


def _plan_truncated(tmp):
    from planner.plan import load_plan

    load_plan(_truncated(tmp))


def _plan_old_schema(tmp):
    import json

    from planner.plan import load_plan

    data = json.loads((_plan_dir(tmp) / "plan.json").read_text())
    data["schema_version"] = 1  # a plan written before decisions were typed
    old = tmp / "old" / "plan.json"
    old.parent.mkdir()
    old.write_text(json.dumps(data))
    load_plan(old)


def _plan_missing(tmp):
    from planner.plan import load_plan

    load_plan(tmp / "nowhere" / "plan.json")


def _compile(options: dict, *, nan: bool = False):
    def fn(tmp):
        import torch

        from wancompile.models import build_transformer, transformer_inputs

        model = build_transformer("tiny")
        inputs = transformer_inputs("tiny", "tiny", 9)
        if nan:
            inputs["hidden_states"][0, 0, 0, 0, 0] = float("nan")
        torch._dynamo.reset()
        with torch.no_grad():
            torch.compile(model, backend="wan_autoshard", options=options, fullgraph=True)(**inputs, return_dict=False)

    return fn


def _replicated_budget(tmp):
    import torch

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)).eval()
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(mlp, backend="wan_autoshard", options={"mesh": "2x4", "memory_gb": 1e-9}, fullgraph=True)(
            torch.randn(2, 64)
        )


def _vae_retarget(tmp):
    import torch

    import wancompile.vae as wvae
    from wancompile.vae.configs import build_vae

    from conftest import save_vae_plan

    save_vae_plan(tmp / "spatial.json", target="gspmd")
    vae = wvae.enable_full_t(build_vae("tiny-wan2.1"))
    torch._dynamo.reset()
    with torch.no_grad():
        options = {"mesh": "2x4", "plan": str(tmp / "spatial.json"), "target": "tt-mlir"}
        torch.compile(vae.decode, backend="wan_autoshard", options=options)(torch.randn(1, 16, 3, 8, 8))


def _meshes(tmp):
    return None


CASES: tuple[Case, ...] = (
    # --- wancompile plan ---------------------------------------------------------------------------------
    Case(
        "cli-model",
        "cli",
        "`wancompile plan --model tinyy ...`",
        "exit 2",
        r"--model: unknown model 'tinyy'; choose one of",
        "a registered model name (listed)",
        plan("--model", "tinyy", "--mesh", "2x4", "--out", "{tmp}/o"),
    ),
    Case(
        "cli-tt-check-full-size",
        "cli",
        "`wancompile tt-check --model wan2.2-t2v-a14b ...` without `--blocks`",
        "exit 2",
        r"--model wan2.2-t2v-a14b is full size: say how many of its blocks to compile, e.g. --blocks 2",
        "`--blocks N`: the first N blocks at full width, planned for the whole model, exported without running",
        cli("tt-check", "--model", "wan2.2-t2v-a14b", "--mesh", "2x4", "--system", "bh-2x4", "--out", "{tmp}/o"),
    ),
    Case(
        "cli-tt-check-blocks",
        "cli",
        "`wancompile tt-check --model wan2.2-ti2v-5b --blocks 31 ...`",
        "exit 2",
        r"--blocks: wan2.2-ti2v-5b has 30 blocks; got 31",
        "at most the model's blocks (2 are enough to see a block's program)",
        cli("tt-check", "--model", "wan2.2-ti2v-5b", "--blocks", "31", "--mesh", "8x4", "--system", "bh-galaxy"),
    ),
    Case(
        "cli-resolution",
        "cli",
        "`--resolution 1080p`",
        "exit 2",
        r"--resolution: unknown resolution '1080p' .* choose one of",
        "one of the model's resolutions",
        plan("--mesh", "2x4", "--resolution", "1080p", "--out", "{tmp}/o"),
    ),
    Case(
        "cli-frames-80",
        "cli",
        "`--frames 80`",
        "exit 2",
        r"--frames: frames must be 4k\+1",
        "a frame count 4k+1 (81)",
        plan("--mesh", "2x4", "--resolution", "tiny", "--frames", "80", "--out", "{tmp}/o"),
    ),
    Case(
        "cli-frames-0",
        "cli",
        "`--frames 0`",
        "exit 2",
        r"--frames must be at least 1, got 0",
        "a frame count 4k+1 (81)",
        plan("--mesh", "2x4", "--frames", "0", "--out", "{tmp}/o"),
    ),
    Case(
        "cli-frames-negative",
        "cli",
        "`--frames -3`",
        "exit 2",
        r"--frames must be at least 1, got -3",
        "a frame count 4k+1 (81)",
        plan("--mesh", "2x4", "--frames", "-3", "--out", "{tmp}/o"),
    ),
    Case(
        "cli-mesh-syntax",
        "cli",
        "`--mesh 2y4`",
        "exit 2",
        r"--mesh: cannot parse mesh '2y4': write the axis sizes separated by 'x'",
        "axis sizes joined by x: 8x4, 2x4, 1x2",
        plan("--mesh", "2y4", "--out", "{tmp}/o"),
    ),
    Case(
        "cli-mesh-3d",
        "cli",
        "`--mesh 2x4x2` (no axis names)",
        "exit 2",
        r"has 3 axes, and only 1-D and 2-D meshes have default axis names",
        "a 2-D mesh, or name the axes (axis_names option)",
        plan("--mesh", "2x4x2", "--out", "{tmp}/o"),
    ),
    Case(
        "cli-memory-0",
        "cli",
        "`--memory-gb 0`",
        "exit 2",
        r"--memory-gb must be positive, got 0",
        "a positive budget in GB",
        plan("--mesh", "2x4", "--memory-gb", "0", "--out", "{tmp}/o"),
    ),
    Case(
        "cli-experts-0",
        "cli",
        "`--experts 0`",
        "exit 2",
        r"--experts must be at least 1, got 0",
        "1 or 2 weight sets",
        plan("--mesh", "2x4", "--experts", "0", "--out", "{tmp}/o"),
    ),
    Case(
        "cli-capture-blocks-0",
        "cli",
        "`--capture-blocks 0`",
        "exit 2",
        r"--capture-blocks must be at least 1, got 0",
        "1 or more (2 is the default)",
        plan("--mesh", "2x4", "--capture-blocks", "0", "--out", "{tmp}/o"),
    ),
    Case(
        "cli-hardware-unknown",
        "cli",
        "`--hardware wh-galaxyy`",
        "exit 2",
        r"--hardware: unknown hardware profile 'wh-galaxyy'; choose one of",
        "a profile name (listed)",
        plan("--mesh", "2x4", "--hardware", "wh-galaxyy", "--out", "{tmp}/o"),
    ),
    Case(
        "cli-hardware-too-small",
        "cli",
        "`--mesh 16x4 --hardware wh-galaxy`",
        "exit 2",
        r"has 64 devices but wh-galaxy has 32",
        "a mesh the system has, or another profile",
        plan("--mesh", "16x4", "--hardware", "wh-galaxy", "--out", "{tmp}/o"),
    ),
    Case(
        "cli-out-file",
        "cli",
        "`--out` names a file",
        "exit 2",
        r"--out /etc/hostname is a file; give a directory to write into",
        "a directory",
        plan("--mesh", "2x4", "--out", "/etc/hostname"),
    ),
    Case(
        "cli-out-unwritable",
        "cli",
        "`--out` cannot be created",
        "exit 2",
        r"--out /proc/wancompile/out: cannot create the directory",
        "a writable directory",
        plan("--mesh", "2x4", "--out", "/proc/wancompile/out"),
    ),
    Case(
        "cli-time-limit-0",
        "cli",
        "`--time-limit 0`",
        "exit 2",
        r"the solver stopped at its time limit \(0 s\) before finding any plan",
        "a larger --time-limit",
        plan("--mesh", "2x4", "--resolution", "tiny", "--frames", "9", "--time-limit", "0", "--out", "{tmp}/o"),
    ),
    Case(
        "cli-memory-too-small",
        "cli",
        "`--memory-gb 0.00001` (tiny model)",
        "exit 2",
        r"no plan fits 1e-05 GB per device on mesh 2x4 .* the smallest plan on this mesh needs [\d.e-]+ GB per device",
        "the budget it names (which plans), or the larger mesh it names",
        plan("--mesh", "2x4", "--resolution", "tiny", "--frames", "9", "--memory-gb", "0.00001", "--out", "{tmp}/o"),
    ),
    Case(
        "cli-tt-xla-tokens",
        "cli",
        "`--hand tt-xla` on 36 tokens over SP 8 (tiny 480p, 8x4)",
        "exit 2",
        r"splits the sequence of 36 tokens .* over the 'batch' axis of size 8, .* add the sp_pad rewrite",
        "the sp_pad rewrite, a mesh whose first axis divides the tokens, or another resolution",
        plan("--mesh", "8x4", "--resolution", "480p", "--frames", "9", "--hand", "tt-xla", "--out", "{tmp}/o"),
    ),
    # --- the other verbs ---------------------------------------------------------------------------------
    Case(
        "cli-validate-missing",
        "cli",
        "`wancompile validate` of a missing file",
        "exit 1",
        r"cannot read .*plan.json: No such file",
        "the path of a plan.json",
        cli("validate", "{tmp}/nowhere/plan.json"),
    ),
    Case(
        "cli-validate-truncated",
        "cli",
        "`wancompile validate` of a truncated plan.json",
        "exit 1",
        r"is not valid JSON .* it may be truncated",
        "regenerate it",
        _cli_on(_truncated, "validate", "{plan}"),
    ),
    Case(
        "cli-explain-missing",
        "cli",
        "`wancompile explain` of a missing plan",
        "exit 2",
        r"cannot read plan .*: No such file",
        "the path of a plan.json or its directory",
        cli("explain", "{tmp}/nowhere", "attn1"),
    ),
    Case(
        "cli-explain-truncated",
        "cli",
        "`wancompile explain` of a truncated plan.json",
        "exit 2",
        r"is not valid JSON .* regenerate it",
        "regenerate the plan",
        _cli_on(_truncated, "explain", "{plan}", "attn1"),
    ),
    Case(
        "cli-explain-no-such",
        "cli",
        "`wancompile explain PLAN blocks.0.attn3`",
        "exit 2",
        r"no such decision, parameter, module or op: .* try one of",
        "a name among the candidates",
        _cli_on(_plan_dir, "explain", "{plan}", "blocks.0.attn3"),
    ),
    Case(
        "cli-explain-no-such-block",
        "cli",
        "`wancompile explain PLAN blocks.99.attn1` on a 2-block plan",
        "exit 2",
        r"no such block: plan .* has blocks 0\.\.1, not 99",
        "a block index the plan has",
        _cli_on(_plan_dir, "explain", "{plan}", "blocks.99.attn1"),
    ),
    Case(
        "cli-diff-missing",
        "cli",
        "`wancompile diff A B` with B missing",
        "exit 2",
        r"cannot read plan .*: No such file",
        "two plan paths",
        _cli_on(_plan_dir, "diff", "{plan}", "{tmp}/nowhere"),
    ),
    Case(
        "cli-export-unwritable",
        "cli",
        "`wancompile export PLAN -o` into a place that cannot be written",
        "exit 2",
        r"-o /proc/wancompile: cannot create the directory",
        "a writable path",
        _cli_on(_plan_dir, "export", "{plan}", "-o", "/proc/wancompile/x.py"),
    ),
    Case(
        "cli-report-unwritable",
        "cli",
        "`wancompile report PLAN --out` that cannot be created",
        "exit 2",
        r"--out /proc/wancompile/r: cannot create the directory",
        "a writable directory",
        _cli_on(_plan_dir, "report", "{plan}", "--out", "/proc/wancompile/r"),
    ),
    # --- backend options (torch.compile(..., options=...) and WANCOMPILE_* variables) --------------------------
    Case(
        "option-unknown",
        "backend",
        "`options={'meshes': '2x4'}`",
        "OptionsError",
        r"unknown wan_autoshard option 'meshes' \(did you mean mesh\?\)",
        "an option name (listed)",
        raises(_options({"meshes": "2x4"})),
    ),
    Case(
        "option-target",
        "backend",
        "`options={'target': 'shardy'}`",
        "OptionsError",
        r"option 'target': unknown partitioner 'shardy'; choose gspmd or tt-mlir",
        "gspmd (XLA) or tt-mlir (Tenstorrent)",
        raises(_options({"target": "shardy"})),
    ),
    Case(
        "env-unknown",
        "backend",
        "`WANCOMPILE_MESHH=2x4` in the environment",
        "OptionsError",
        r"unknown environment variable WANCOMPILE_MESHH \(did you mean WANCOMPILE_MESH\?\)",
        "unset it or fix its name",
        raises(_options(env={"WANCOMPILE_MESHH": "2x4"})),
    ),
    Case(
        "option-mesh-3d",
        "backend",
        "`options={'mesh': '2x4x2'}` without axis_names",
        "OptionsError",
        r"option 'mesh': mesh '2x4x2' has 3 axes, and only 1-D and 2-D meshes have default axis names",
        "pass axis_names",
        raises(_options({"mesh": "2x4x2"})),
    ),
    Case(
        "option-hardware-unknown",
        "backend",
        "`options={'hardware': 'wh-galaxyy'}`",
        "OptionsError",
        r"option 'hardware': unknown profile 'wh-galaxyy' \(did you mean wh-galaxy\?\)",
        "a profile name (listed)",
        raises(_options({"hardware": "wh-galaxyy"})),
    ),
    Case(
        "option-hardware-too-small",
        "backend",
        "`options={'mesh': '8x4', 'hardware': 'wh-loudbox'}`",
        "OptionsError",
        r"option 'hardware': wh-loudbox has 8 devices \(2x4\) but mesh 8x4 has 32",
        "a profile for a system that large",
        raises(_options({"mesh": "8x4", "hardware": "wh-loudbox"})),
    ),
    Case(
        "option-memory-0",
        "backend",
        "`options={'memory_gb': 0}`",
        "OptionsError",
        r"option 'memory_gb' must be positive, got 0.0",
        "a positive budget",
        raises(_options({"memory_gb": 0})),
    ),
    Case(
        "option-plan-missing",
        "backend",
        "`options={'plan': 'nowhere/plan.json'}`, a file that does not exist",
        "OptionsError",
        r"option 'plan': no file at \S+/nowhere/plan.json; pass the path of a plan.json written by wancompile",
        "the path of a plan.json (`wancompile plan --out DIR` writes DIR/plan.json), or a built-in plan",
        raises(_options({"plan": "{tmp}/nowhere/plan.json"})),
    ),
    Case(
        "mesh-device-count",
        "backend",
        "`mesh='2x2'` on an 8-device runtime",
        "PlanError",
        r"mesh \S+ needs \d+ devices but the XLA runtime has \d+",
        "a mesh of the device count, or CPU_NUM_DEVICES",
        raises(_compile({"mesh": "2x2"})),
        needs_devices=True,
    ),
    Case(
        "plan-retarget-halo",
        "backend",
        "a saved VAE plan made for `gspmd` that splits convolutions spatially, compiled with `target='tt-mlir'`",
        "PlanError",
        r"plan \S+ was made for target 'gspmd' and splits \d+ convolution\(s\) spatially .* target 'tt-mlir' gets "
        r"their halos another way",
        "re-plan for the target (`wancompile plan --target tt-mlir`), or compile for the plan's own target",
        raises(_vae_retarget),
        needs_devices=True,
    ),
    Case(
        "replicated-budget",
        "backend",
        "a model with no repeated attention blocks (an MLP) compiled with a `memory_gb` its weights exceed",
        "MemoryBudgetError",
        r"the graph has no repeated attention blocks and is not a Wan VAE decode, so it runs replicated, and its "
        r"parameters \(1 weight set\(s\)\) need [\d.e-]+ GB per device, over memory_gb=[\d.e-]+\. Raise memory_gb",
        "memory_gb >= need_gb, or compile the transformer or the VAE decode by itself",
        raises(_replicated_budget),
        needs_devices=True,
    ),
    Case(
        "verify-nan",
        "backend",
        "`verify=True` with a NaN in `hidden_states`",
        "NonFiniteInputError",
        r"verify: input 'hidden_states' \(1, 4, 3, 8, 8\) holds 1 NaN and 0 Inf value\(s\)",
        "finite inputs",
        raises(_compile({"mesh": "2x4", "plan": "tt-xla", "verify": True}, nan=True)),
        needs_devices=True,
    ),
    # --- planner and saved plans (library calls; the backend raises the same) ----------------------------------
    Case(
        "memory-budget",
        "library",
        "a memory budget no plan fits (`plan_graph(..., memory_gb=1e-6)`)",
        "MemoryBudgetError",
        r"no plan fits [\d.e-]+ GB per device on mesh \S+ .* the smallest plan on this mesh needs [\d.e-]+ GB per device\. "
        r"Raise memory_gb to at least",
        "memory_gb >= need_gb (a budget that plans), or a mesh in `meshes`",
        raises(_memory),
    ),
    Case(
        "infeasible-only",
        "library",
        "`plan_graph(..., only={'attn1': '^head-TP\\(batchxmodel\\)'})`: 4 heads over 8 devices",
        "InfeasiblePlanError",
        r"no plan on mesh 2x4 for .*, at any memory budget: attn1 has no legal strategy left \(head-TP over "
        r"batchxmodel \(8\): 4 heads do not divide into 8; .*\d+ strategies: restricted by only=",
        "an only= pattern that matches a legal strategy (the exclusions list them), or another mesh",
        raises(_only_infeasible),
    ),
    Case(
        "solver-timeout",
        "library",
        "`plan_graph(..., time_limit_s=0)`",
        "SolverTimeout",
        r"the solver stopped at its time limit \([\d.]+ s\) before finding any plan \(status \w+\)",
        "a larger time_limit_s",
        raises(_timeout),
    ),
    Case(
        "tt-xla-tokens",
        "library",
        "`plan='tt-xla'` on 36 tokens over an SP axis of 8",
        "PlanError",
        r"the tt-xla plan splits the sequence of \d+ tokens .* add the sp_pad rewrite \(rewrites=\['sp_pad'\]",
        "rewrites=['sp_pad'], another mesh or resolution",
        raises(_tt_xla_tokens),
    ),
    Case(
        "tt-xla-heads",
        "library",
        "`plan='tt-xla'` with 4 heads on a TP axis of 3",
        "PlanError",
        r"4 heads do not divide over the 'model' axis of size 3",
        "a mesh whose last axis divides the heads",
        raises(_tt_xla_heads),
    ),
    Case(
        "plan-other-heads",
        "library",
        "a saved plan for 4 heads x 16 applied to 8 heads x 8",
        "PlanError",
        r"was made for attention heads 4 \(this model: 8\), head dim 16 \(this model: 8\)",
        "re-plan, or the plan made for this model",
        raises(_plan_other_heads),
    ),
    Case(
        "plan-other-frames",
        "library",
        "a saved plan for 48 tokens applied to 36 tokens (another resolution)",
        "PlanError",
        r"was made for tokens 48 \(this model: 36\) — another resolution or frame count",
        "one plan per resolution, or dynamic=True",
        raises(_plan_other_frames),
    ),
    Case(
        "plan-pad-heads",
        "library",
        "`plan=` a plan.json that pads attn1's heads 12 -> 16, on a model with 16 heads",
        "PlanError",
        r"the plan runs blocks\.\*\.attn1 on padded heads, but this model's attention there cannot be padded",
        "re-plan for this model",
        raises(_plan_pads_unpaddable),
    ),
    Case(
        "plan-truncated",
        "library",
        "`plan=` a truncated plan.json",
        "PlanError",
        r"is not valid JSON .* truncated",
        "regenerate it",
        raises(_plan_truncated),
    ),
    Case(
        "plan-old-schema",
        "library",
        "`plan=` a plan.json of schema_version 1 (before typed decisions)",
        "PlanError",
        r"schema_version 1, an older format.*Re-plan to write a new one: `wancompile plan",
        "re-plan with `wancompile plan`",
        raises(_plan_old_schema),
    ),
    Case(
        "plan-missing",
        "library",
        "`load_plan` of a missing file",
        "PlanError",
        r"cannot read plan .*: No such file",
        "the path of a plan.json",
        raises(_plan_missing),
    ),
)


def documented(error: BaseException) -> Optional[Case]:
    """The catalogue case an error is an instance of (type name and message pattern), or None."""
    inner = getattr(error, "inner_exception", None) or error
    for c in CASES:
        if c.error == type(inner).__name__ and re.search(c.pattern, str(inner)):
            return c
    return None


def render(messages: dict[str, tuple[str, str]]) -> str:
    """docs/errors.md from the cases and the messages they produced."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    out = [HEADER]
    for where, title in (
        ("cli", "The `wancompile` CLI"),
        ("backend", 'The backend (`torch.compile(..., backend="wan_autoshard")`)'),
        ("library", "The planner and saved plans"),
    ):
        out += ["", f"## {title}", "", "| id | input | raises | message (as produced) | fix |", "|---|---|---|---|---|"]
        for c in CASES:
            if c.where == where:
                err, msg = messages[c.id]
                out.append(f"| `{c.id}` | {cell(c.input)} | {cell(err)} | {cell(msg)} | {cell(c.fix)} |")
    return "\n".join(out) + "\n"


HEADER = """# Errors on bad input

Every error the backend and the CLI raise on bad input, with the message it prints and the fix.
Generated from the cases in `tests/error_cases.py`, which `tests/test_errors.py` runs: each case's
error type and message are checked, and so is this page (it cannot drift). Regenerate with

    EXPECTTEST_ACCEPT=1 python -m pytest tests/test_errors.py

The CLI prints one line on stderr (`wancompile VERB: ...`) and exits 2 for a bad value (argparse's
convention) or 1 when the input was fine but a file could not be written / a plan was invalid; `-v`
adds the traceback.

Every error the project raises is a `wancompile.Error` (`planner.errors`; most keep their builtin base
too, `ValueError` or `RuntimeError`): `except wancompile.Error:` catches any of them, a narrower type
its own. Through `torch.compile`, the backend's errors reach the caller as themselves, with the
project's message and nothing of dynamo's appended (`wancompile.catchable`), where dynamo would wrap
them in `torch._dynamo.exc.BackendCompilerFailed` and add its advice for reporting a bug to PyTorch;
any other error keeps that wrapper (its `inner_exception`). All the types below are importable from
`wancompile`. Error types: `OptionsError` (wancompile.options), `PlanError` and its subclasses
`MemoryBudgetError` (`need_gb`: a budget that plans; `meshes`: larger system meshes that plan within
the budget), `InfeasiblePlanError` (no plan at any budget: `group`, the macro left without options,
`excluded`, why each was ruled out, `rewrites`) and `SolverTimeout` (`time_limit_s`) in planner.errors,
`NonFiniteInputError` (a `VerificationError`, wancompile.verify). `TMP` stands for the test's temporary directory."""
