"""`Error`: the one base of every error the project raises, and the planner's plan errors.

``except wancompile.Error`` (the same class) catches whatever the backend, the planner or the CLI
reports: a bad option, a mesh, a plan that cannot be made, read or applied, a failed verification,
a runtime started the wrong way. docs/errors.md lists them, case by case. Through
``torch.compile(..., backend="wan_autoshard")`` an `Error` reaches the caller as itself, with the
project's message and nothing of dynamo's appended (`wancompile.catchable`); anything that is not an
`Error` is a bug (ours or a library's) and keeps dynamo's wrapping.

Each error keeps the builtin base it had before there was one base, as a second base (``class
OptionsError(Error, ValueError)``): code that was written against ``except ValueError`` (argparse
converters, `Plan.from_json`'s own parsing, users' code) keeps working, and the builtin still says
what kind of mistake it is (a bad value, a runtime state). The exception is `VerificationError`:
it was an ``AssertionError``, which says "a bug in this program" and is what test frameworks treat
as a failed test; a sharded program that disagrees with the unsharded one is a finding about the
plan, so it is an `Error` only.

Not an `Error`: ``rewrites._core.Skip``, the signal a rewrite's check gives its driver to leave one
site unchanged. It never leaves the rewrite driver (the site is recorded as skipped in the plan's
``rewrites``), so no user sees it; it is control flow, not an error.

This module imports nothing: every package (planner, wancompile, the CLI) can define its errors on it.
"""

from __future__ import annotations


class Error(Exception):
    """An error the project raises: the message says what was wrong and how to fix it."""


class PlanError(Error, ValueError):
    """A plan that cannot be applied to this model or mesh; the message names the fix."""


class MemoryBudgetError(PlanError):
    """No plan fits the per-device memory budget. ``need_gb`` is a budget the planner then accepts
    on this mesh (found by solving, not estimated); ``meshes`` names larger system meshes that
    plan within the given budget (may be empty)."""

    def __init__(self, message: str, *, budget_gb: float, need_gb: float, meshes: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.budget_gb, self.need_gb, self.meshes = budget_gb, need_gb, meshes


class InfeasiblePlanError(PlanError):
    """The solver proved that no plan exists for a reason other than the memory budget (that one is
    `MemoryBudgetError`): ``group`` is the macro left without any option, ``excluded`` every option
    it was offered with what ruled it out (a shape that does not divide, an ``only=`` restriction, a
    preset, an op a rewrite produced that no strategy places); ``rewrites``: the graph rewrites the
    backend ran first (the message names the one that touched the macro)."""

    def __init__(
        self, message: str, *, group: str, excluded: tuple[tuple[str, str], ...] = (), rewrites: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message)
        self.group, self.excluded, self.rewrites = group, excluded, rewrites


class SolverTimeout(PlanError):
    """The solver stopped at its time limit before finding any plan; nothing says none exists.
    Raise ``time_limit_s`` (``wancompile plan --time-limit``)."""

    def __init__(self, message: str, *, time_limit_s: float) -> None:
        super().__init__(message)
        self.time_limit_s = time_limit_s
