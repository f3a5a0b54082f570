"""The one planning path of every model family: build -> solve -> explain -> assemble.

A family (`planner.autoplan.DitFamily`, the DiT; `planner.vae_plan.VaeFamily`, the VAE) is built
from its captured graph and options and states its planning problem once, as a frozen `Problem`:
one ILP group per macro with its priced options and the strategy behind each option, the stream
edges between groups, each group's excluded options with their reasons, the parameter bytes no
option owns, the solver's hint and the evaluation of every option. `plan` solves the problem under
the per-device budget (`planner.ilp`, whose docstring states the model), turns a failed solve into
the user's error — the smallest budget that does plan is found here, the family words the advice —
and hands the `Solution` back to the family to explain (typed `Decision`s, `planner.explain`) and
to assemble (the `Plan`). What a family does with its macros the same way as the other is written
once beside the engine: `planner.macros` (the `Macro`, the values crossing into one, the stream
edges, the preset filter) and `planner.pricing` (an option's evaluation, the plan's bill).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol

from planner.explain import explain_choices
from planner.ilp import (
    KIB,
    Edge,
    Group,
    Infeasible,
    SolveResult,
    TimedOut,
    budget_gb,
    min_memory_kib,
    solve,
    twin_range,
)
from planner.mesh import MeshSpec
from planner.plan import (
    Decision,
    Exclusion,
    InfeasiblePlanError,
    MemoryBudgetError,
    Plan,
    SolverInfo,
    SolverTimeout,
)
from planner.propagate import Evaluation


@dataclass(frozen=True)
class Problem:
    """What the solver sees, and what the family needs back to explain and assemble its choice."""

    groups: tuple[Group, ...]
    edges: tuple[Edge, ...]
    tables: Mapping[str, tuple[Any, ...]]  # group -> the strategy behind each option, in option order
    excluded: Mapping[str, tuple[Exclusion, ...]]  # group -> options left out, with the reason
    evals: Mapping[tuple[str, str], Evaluation] = field(default_factory=dict)  # (group, strategy) -> its pricing
    fixed_bytes: float = 0.0  # parameter bytes per device that no option shards
    hint: Mapping[str, int] = field(default_factory=dict)  # group -> option index to start the search from

    def memory_kib(self, budget_bytes: float) -> int:
        """The ILP's M: the budget less the parameters no option shards (`planner.ilp`, (d))."""
        return int((budget_bytes - self.fixed_bytes) // KIB)

    def need_gb(self, time_limit_s: float) -> float:
        """The smallest per-device budget that plans (a minimise-memory solve)."""
        return budget_gb(min_memory_kib(self.groups, time_limit_s=time_limit_s)[0], self.fixed_bytes)


@dataclass(frozen=True)
class Solution:
    result: SolveResult
    memory_kib: int
    chosen: Mapping[str, Any]  # group -> the chosen strategy
    # group -> (the chosen strategy's FSDP twin, the blocks [first, stop) that run it): FSDP per block range
    twins: Mapping[str, tuple[Any, tuple[int, int]]] = field(default_factory=dict)


class Family(Protocol):
    """A model family: how its macros are found and priced (`problem`), how its choice reads
    (`decisions`), what its plan holds (`assemble`); `subject` names what is planned in messages
    ("tiny x1 weight set(s)", "the VAE decode") and `advice` says what else would plan when the
    budget is too small (text after the minimum, and the larger meshes it names)."""

    mesh: MeshSpec
    subject: str

    def problem(self) -> Problem: ...

    def decisions(self, problem: Problem, solution: Solution) -> tuple[Decision, ...]: ...

    def assemble(self, problem: Problem, solution: Solution, decisions: tuple[Decision, ...]) -> Plan: ...

    def advice(self, budget_bytes: float) -> tuple[str, tuple[str, ...]]: ...


def solve_problem(family: Family, problem: Problem, budget_bytes: float, time_limit_s: float) -> Solution:
    """Solve `problem` within `budget_bytes` per device. Raises `SolverTimeout`, or
    `MemoryBudgetError` naming the smallest budget that plans (and the family's advice)."""
    mesh = family.mesh
    check_options(family, problem)
    memory_kib = problem.memory_kib(budget_bytes)
    try:
        res = solve(
            problem.groups, problem.edges, memory_kib=memory_kib, hint=dict(problem.hint), time_limit_s=time_limit_s
        )
    except TimedOut as e:
        raise SolverTimeout(
            f"the solver stopped at its time limit ({time_limit_s:g} s) before finding any plan (status {e.status}) on "
            f"mesh {mesh} for {family.subject}; raise the time limit (time_limit_s=, `wancompile plan --time-limit`)",
            time_limit_s=time_limit_s,
        ) from None
    except Infeasible:
        try:  # every group has an option (`check_options`): some budget plans, the smallest is solved for
            need = problem.need_gb(time_limit_s)
        except TimedOut:
            raise SolverTimeout(
                f"the solver proved no plan within {budget_bytes / 1e9:.6g} GB per device on mesh {mesh} for "
                f"{family.subject} but stopped at its time limit ({time_limit_s:g} s) before finding the smallest "
                "budget that plans; raise the time limit (time_limit_s=, `wancompile plan --time-limit`)",
                time_limit_s=time_limit_s,
            ) from None
        advice, meshes = family.advice(budget_bytes)
        raise MemoryBudgetError(
            f"no plan fits {budget_bytes / 1e9:.6g} GB per device on mesh {mesh} ({mesh.size} devices) for "
            f"{family.subject}: the smallest plan on this mesh needs {need:.6g} GB per device. Raise memory_gb to at "
            f"least {need:.6g}" + advice,
            budget_gb=budget_bytes / 1e9,
            need_gb=need,
            meshes=meshes,
        ) from None
    chosen = {g.name: problem.tables[g.name][res.choice[g.name]] for g in problem.groups}
    twins = {
        g.name: (problem.tables[g.name][g.twin(res.choice[g.name])], twin_range(g.count, k))
        for g in problem.groups
        if (k := res.blocks_on_twin(g.name))
    }
    return Solution(res, memory_kib, chosen, twins)


def check_options(family: Family, problem: Problem) -> None:
    """Raise `InfeasiblePlanError` for a group left without any option: constraint (a) of
    `planner.ilp` then has no solution whatever the budget, and the group's exclusions say why."""
    for g in problem.groups:
        if g.options:
            continue
        excluded = tuple((x.option, x.reason) for x in problem.excluded.get(g.name, ()))
        raise InfeasiblePlanError(
            f"no plan on mesh {family.mesh} for {family.subject}, at any memory budget: {g.name} has no legal "
            "strategy left ("
            + (_summary(excluded) or "none was offered")
            + "). Lift what excluded them: an only= restriction or preset that matches none of its strategies, "
            "a mesh whose axes its shapes divide, or the rewrite that produced its ops",
            group=g.name,
            excluded=excluded,
        )


def _summary(excluded: tuple[tuple[str, str], ...]) -> str:
    """Exclusions by reason: ``option: reason`` for one or two options, ``N strategies: reason`` for more."""
    by_reason: dict[str, list[str]] = {}
    for option, reason in dict.fromkeys(excluded):
        by_reason.setdefault(reason, []).append(option)
    return "; ".join(
        f"{len(opts)} strategies: {r}" if len(opts) > 2 else "; ".join(f"{o}: {r}" for o in opts)
        for r, opts in by_reason.items()
    )


def solver_info(solution: Solution) -> SolverInfo:
    r = solution.result
    return SolverInfo(r.status, r.objective_ns / 1e9, r.seconds, r.variables, r.constraints, r.gap)


def explain(problem: Problem, solution: Solution, unit: str = "forward", **how) -> tuple[Decision, ...]:
    """The typed decisions of a solved problem (`planner.explain.explain_choices`; `how`: the
    family's stream, in_block, fsdp and members readers)."""
    return tuple(
        explain_choices(
            problem.groups, problem.edges, solution.result, solution.memory_kib, problem.excluded, unit, **how
        )
    )


def plan(family: Family, budget_bytes: float, time_limit_s: float) -> Plan:
    """The family's plan: its problem solved within `budget_bytes` per device, explained, assembled."""
    problem = family.problem()
    solution = solve_problem(family, problem, budget_bytes, time_limit_s)
    return family.assemble(problem, solution, family.decisions(problem, solution))
