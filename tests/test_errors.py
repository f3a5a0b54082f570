"""Every bad input of the catalogue (tests/error_cases.py) ends in its documented error, and
docs/errors.md is exactly what the cases produce (regenerate: EXPECTTEST_ACCEPT=1 python -m pytest tests/test_errors.py)."""

import json
import os
import re
from pathlib import Path

import pytest

from conftest import run_script
from error_cases import CASES, documented, render

ROOT = Path(__file__).resolve().parents[1]
_MESSAGES: dict = {}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_ends_in_its_documented_error(case, tmp_path, request):
    if case.needs_devices:
        request.getfixturevalue("spmd")
    error, message = case.run(tmp_path)
    assert error == case.error, (case.id, error, message)
    assert re.search(case.pattern, message), (case.id, message)
    _MESSAGES[case.id] = (error, message)


# A user's script in a fresh process: every backend case of the catalogue, its compiled call inside
# ``try: ... except wancompile.Error``; one JSON line per case (argv[1]: a temp directory).
USER_SCRIPT = """
import json, sys
from pathlib import Path

sys.path.insert(0, "tests")
import wancompile
from error_cases import CASES
from wancompile import runtime

for case in CASES:
    if case.where != "backend":
        continue
    if case.needs_devices:  # its 8 virtual devices started, as the spmd fixture does
        runtime.use_spmd()
        runtime.device_count()
    tmp = Path(sys.argv[1]) / case.id
    tmp.mkdir()
    try:
        case.run.raw(tmp)
        row = {"caught": None}
    except wancompile.Error as e:
        row = {"caught": "wancompile.Error", "type": type(e).__name__, "message": str(e), "args": list(map(str, e.args))}
    except Exception as e:
        row = {"caught": None, "type": type(e).__name__, "message": str(e)}
    print("CASE " + json.dumps({"id": case.id, **row}))
"""
DYNAMO_ADVICE = ("TORCHDYNAMO_VERBOSE", "reporting a bug to PyTorch", 'TORCH_LOGS="+dynamo"', "from user code:")


def test_every_backend_error_is_caught_by_wancompile_error_around_the_compiled_call_without_dynamo_advice(tmp_path):
    """``try: torch.compile(m, backend="wan_autoshard", options=...)(x) except wancompile.Error`` in a
    fresh process catches each backend case's documented error, as itself (its own type, not dynamo's
    BackendCompilerFailed), with the project's message and none of dynamo's advice appended."""
    out = run_script(["-c", USER_SCRIPT, str(tmp_path)], num_devices=8)
    rows = {
        r["id"]: r for r in (json.loads(line[len("CASE ") :]) for line in out.splitlines() if line.startswith("CASE "))
    }
    backend = [c for c in CASES if c.where == "backend"]
    assert sorted(rows) == sorted(c.id for c in backend)
    wrong = []
    for case in backend:
        row = rows[case.id]
        if row["caught"] != "wancompile.Error" or row["type"] != case.error:
            wrong.append((case.id, "not caught as its own type", row))
        elif not re.search(case.pattern, row["message"]):
            wrong.append((case.id, "another message", row["message"]))
        elif any(advice in text for text in (row["message"], *row["args"]) for advice in DYNAMO_ADVICE):
            wrong.append((case.id, "dynamo's advice appended", row["args"]))
    assert not wrong, wrong


# Every exception class defined in the packages, with whether it is a `wancompile.Error`.
EXCEPTION_CLASSES = """
import importlib, inspect, pkgutil
from planner.errors import Error

for package in ("planner", "wancompile", "rewrites"):
    for m in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
        if m.name.endswith(".__main__"):
            continue
        module = importlib.import_module(m.name)
        for obj in vars(module).values():
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == module.__name__:
                print("CLASS", f"{module.__name__}.{obj.__qualname__}", issubclass(obj, Error))
"""
# a rewrite's signal to its driver to leave one site unchanged: it never leaves the driver (planner.errors)
# internal signals, never raised to a user: a rewrite's skip (reported), and a failed Wormhole graft (caught by
# `wancompile.tt.wormhole.ensure`, whose reason sends the program to level 0; the module runs in the worker's
# interpreter, which may not have wancompile, so it cannot derive from wancompile.Error)
NOT_AN_ERROR = {"rewrites._core.Skip", "wancompile.tt.wormhole.GraftFailed"}


def test_every_exception_the_project_defines_is_a_wancompile_error():
    """A new error type cannot miss the one base: every exception class in planner/, wancompile/ and
    rewrites/ (all their modules imported) is a `wancompile.Error`, but for the internal `NOT_AN_ERROR`."""
    out = run_script(["-c", EXCEPTION_CLASSES], num_devices=8)
    rows = dict(line.split()[1:] for line in out.splitlines() if line.startswith("CLASS "))
    found = set(rows)
    assert {"wancompile.options.OptionsError", "planner.errors.PlanError", "wancompile.cli.args.UsageError"} <= found
    assert {name for name, is_error in rows.items() if is_error != "True"} == NOT_AN_ERROR


def test_a_verification_that_fails_is_an_error_not_an_assertion():
    """A sharded program that disagrees with the unsharded one is a finding about the plan, not a bug in
    the program: ``except AssertionError`` (and test frameworks) do not take it for one."""
    import wancompile

    assert issubclass(wancompile.VerificationError, wancompile.Error)
    assert not issubclass(wancompile.VerificationError, AssertionError)


def test_an_error_keeps_its_builtin_base():
    """``except ValueError`` written before the one base still catches a bad option or plan."""
    import wancompile

    for error in (wancompile.OptionsError, wancompile.PlanError, wancompile.MeshError):
        assert issubclass(error, wancompile.Error) and issubclass(error, ValueError), error.__mro__


def test_documented_matches_by_type_and_pattern():
    from planner.plan import SolverTimeout

    assert (
        documented(
            SolverTimeout(
                "the solver stopped at its time limit (0 s) before finding any plan (status UNKNOWN)", time_limit_s=0
            )
        ).id
        == "solver-timeout"
    )
    assert (
        documented(ValueError("the solver stopped at its time limit (0 s) before finding any plan (status UNKNOWN)"))
        is None
    )


def test_docs_errors_md_is_the_catalogue():
    missing = [c.id for c in CASES if c.id not in _MESSAGES]
    if missing:
        pytest.skip(f"run the whole file: {len(missing)} case(s) did not run in this session")
    text = render(_MESSAGES)
    path = ROOT / "docs" / "errors.md"
    if os.environ.get("EXPECTTEST_ACCEPT"):
        path.write_text(text)
    assert path.read_text() == text, (
        "docs/errors.md is stale: EXPECTTEST_ACCEPT=1 python -m pytest tests/test_errors.py"
    )
