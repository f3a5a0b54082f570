"""The sharding ILP, written directly for OR-Tools CP-SAT (Alpa's node/edge formulation).

Sets. Groups g (one per macro-strategy choice; a DiT block's macros are one group each, shared by
all N identical blocks), options s ∈ S_g, and per group a key k(g, s) — the stream layout the
option reads and writes (for the DiT: the axes splitting the stream's tokens and its hidden dim,
`planner.strategies.Strategy.stream`; for the VAE: its spatial split). Edges (g, h) carry the stream from g to h.

Variables.
  x[g,s] ∈ {0,1}     option s chosen for group g                          (a) exactly one per g
  z[g,k] ∈ {0,1}     group g runs with stream layout k; z[g,k] = Σ_{s: k(g,s)=k} x[g,s]   (b)
  y[g,h,k,l] ∈ {0,1} edge (g,h) carries k -> l: Σ_l y = z[g,k], Σ_k y = z[h,l]           (c)
  act ≥ 0            peak activation bytes per device

Edge variables are over stream keys, not options: options that share σ are followers of one
another on the edge (Alpa's ``e_follow``), so an edge has |K_g|·|K_h| variables, not |S_g|·|S_h|.

Objective (integer nanoseconds; ``count`` = how many blocks share the group):
  min Σ_g Σ_s x[g,s]·(count_g·c[g,s] + once[g,s]) + Σ_(g,h) Σ_{k,l} y[g,h,k,l]·count_gh·r[g,h,k,l]

Memory (per device, KiB):                                                 (d)
  Σ_g Σ_s x[g,s]·m[g,s] + act ≤ M,    act ≥ Σ_s x[g,s]·a[g,s]  for every g
  m[g,s] = the option's parameter bytes per device, over all count_g repetitions and all resident
           weight sets (both A14B experts: ×2); M = the budget less the parameters no option shards;
  a[g,s] = 3 × the largest per-op live set of the option's ops (inputs as required + outputs, per
           device): the live set, the residual stream it came from and one fused temporary
           (`planner.pricing.ACTIVATION_FACTOR`); both rounded up to KiB.

A heuristic plan is given as a hint (`AddHint`), the solver is deterministic (one worker, fixed
seed) and time-limited; status, objective, bound gap, wall time and model size are reported.

Batch axes (CFG parallel, `planner.cfg`). With ``batch_axes = β`` (the ``cfg`` half of a split mesh)
every stream key is ``(β on dim 0, σ on the tokens)``, no option's σ or t contains an axis of β, and
every constraint an option forces on a batch-carrying value has β major on dim 0: the model above is
unchanged, its costs are those of per-device batch B/|β|. The CFG choice itself is outside this
model: one solve per CFG option o ∈ {off, split(axis)} on o's mesh, then
  o* = argmin_o  T(o),   T(o) = the predicted step time (compute + comm) of o's solved plan,
over the options whose solve is feasible (memory (d) on o's mesh: weights over the devices of one
half for a split); ties go to ``off``. Forcing (``on``/``off``) restricts the argmin's domain.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Hashable, Mapping, Optional, Sequence

from ortools.sat.python import cp_model

KIB = 1024  # the unit of the memory constraint (d): bytes per KiB


@dataclass(frozen=True)
class Option:
    name: str
    key: Hashable  # stream layout this option reads/writes
    cost_ns: int  # per repetition
    once_ns: int = 0  # paid once regardless of repetitions
    param_kib: int = 0  # total over repetitions
    act_kib: int = 0


@dataclass(frozen=True)
class Group:
    name: str
    options: tuple[Option, ...]
    count: int = 1


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    count: int
    cost_ns: Mapping[tuple[Hashable, Hashable], int] = field(hash=False, compare=False)


@dataclass(frozen=True)
class SolveResult:
    choice: dict[str, int]
    status: str
    objective_ns: int
    bound_ns: int
    seconds: float
    variables: int
    constraints: int

    @property
    def gap(self) -> float:
        return 0.0 if self.objective_ns == 0 else max(0.0, (self.objective_ns - self.bound_ns) / self.objective_ns)


class Infeasible(RuntimeError):
    """The solver proved that no choice satisfies the constraints (CP-SAT status INFEASIBLE)."""

    def __init__(self, status: str, time_limit_s: Optional[float] = None) -> None:
        super().__init__(status)
        self.status = status
        self.time_limit_s = time_limit_s


class TimedOut(Infeasible):
    """The solver stopped (time limit) before finding any choice: nothing is proven either way.
    A subclass of `Infeasible` so that callers that only care "no plan" still catch it; callers
    that report to a user catch it first and name the time limit to raise."""


def solve(
    groups: Sequence[Group],
    edges: Sequence[Edge],
    *,
    memory_kib: Optional[int] = None,
    hint: Optional[Mapping[str, int]] = None,
    forbid: Optional[Mapping[str, int]] = None,
    only: Optional[Mapping[str, int]] = None,
    time_limit_s: float = 5.0,
    seed: int = 0,
) -> SolveResult:
    """Minimize the objective; `forbid` excludes one option of a group, `only` fixes one."""
    model = cp_model.CpModel()
    x = {g.name: [model.NewBoolVar(f"x[{g.name},{o.name}]") for o in g.options] for g in groups}
    by_name = {g.name: g for g in groups}
    add_choice_constraints(model, groups, x)
    z = add_key_constraints(model, groups, x)
    terms = []
    for g in groups:
        for var, o in zip(x[g.name], g.options):
            terms.append((g.count * o.cost_ns + o.once_ns, var))
    for e in edges:
        terms.extend(add_edge_constraints(model, e, z))
    act = add_memory_constraints(model, groups, x, memory_kib)
    if forbid:
        for g, i in forbid.items():
            model.Add(x[g][i] == 0)
    if only:
        for g, i in only.items():
            model.Add(x[g][i] == 1)
    if hint:
        for g, i in hint.items():
            for j, var in enumerate(x[g]):
                model.AddHint(var, int(j == i))
    del act, by_name
    model.Minimize(sum(c * v for c, v in terms if c))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = seed
    t0 = time.perf_counter()
    status = solver.Solve(model)
    seconds = time.perf_counter() - t0
    name = solver.StatusName(status)
    proto = model.Proto()
    if status == cp_model.INFEASIBLE:
        raise Infeasible(name, time_limit_s)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise TimedOut(name, time_limit_s)  # UNKNOWN: the limit ran out first (MODEL_INVALID would be our bug)
    choice = {g.name: next(i for i, v in enumerate(x[g.name]) if solver.Value(v)) for g in groups}
    return SolveResult(
        choice,
        name,
        int(solver.ObjectiveValue()),
        int(solver.BestObjectiveBound()),
        seconds,
        len(proto.variables),
        len(proto.constraints),
    )


def min_memory_kib(groups: Sequence[Group], *, time_limit_s: float = 5.0) -> tuple[int, bool]:
    """The smallest ``memory_kib`` for which `solve` finds a plan: constraints (a) and (d) with the
    memory sum itself minimised (time ignored). Returns (KiB, proven optimal). The value is exactly
    the left side of (d) for the returned choice, so ``solve(..., memory_kib=value)`` is feasible
    (not a sum of per-group minima, which no single plan need reach: the activation peak and the
    parameters of different groups cannot all be at their minimum at once)."""
    model = cp_model.CpModel()
    x = {g.name: [model.NewBoolVar(f"x[{g.name},{o.name}]") for o in g.options] for g in groups}
    add_choice_constraints(model, groups, x)
    peak = max((o.act_kib for g in groups for o in g.options), default=0)
    act = model.NewIntVar(0, max(peak, 0), "act")
    for g in groups:
        model.Add(act >= sum(o.act_kib * v for v, o in zip(x[g.name], g.options)))
    model.Minimize(sum(o.param_kib * v for g in groups for v, o in zip(x[g.name], g.options)) + act)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(time_limit_s, 1.0)
    solver.parameters.num_workers = 1
    status = solver.Solve(model)
    if status == cp_model.INFEASIBLE:  # (a) alone: a group without options
        raise Infeasible(solver.StatusName(status), time_limit_s)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise TimedOut(solver.StatusName(status), time_limit_s)
    return int(round(solver.ObjectiveValue())), status == cp_model.OPTIMAL


def budget_gb(need_kib: int, fixed_bytes: float) -> float:
    """The smallest 6-significant-digit budget in GB that gives the solver `need_kib` KiB after
    the `fixed_bytes` every plan holds (the rounding of a printed number must not fall below it)."""
    exact = (need_kib * KIB + fixed_bytes) / 1e9
    if exact <= 0:
        return float(f"{1e-9:.6g}")
    step = 10.0 ** (math.floor(math.log10(exact)) - 5)
    gb = float(f"{math.ceil(exact / step) * step:.6g}")
    while int((gb * 1e9 - fixed_bytes) // KIB) < need_kib:
        gb = float(f"{gb + step:.6g}")
    return gb


def add_choice_constraints(model: cp_model.CpModel, groups: Sequence[Group], x) -> None:
    """(a) exactly one option per group."""
    for g in groups:
        model.AddExactlyOne(x[g.name])


def add_key_constraints(model: cp_model.CpModel, groups: Sequence[Group], x) -> dict:
    """(b) z[g,k] is the OR of the options with key k (exactly one holds, by (a))."""
    z: dict[str, dict[Hashable, cp_model.IntVar]] = {}
    for g in groups:
        keys: dict[Hashable, list] = {}
        for var, o in zip(x[g.name], g.options):
            keys.setdefault(o.key, []).append(var)
        z[g.name] = {}
        for k, vs in keys.items():
            zk = model.NewBoolVar(f"z[{g.name},{k}]")
            model.Add(zk == sum(vs))
            z[g.name][k] = zk
    return z


def add_edge_constraints(model: cp_model.CpModel, e: Edge, z) -> list:
    """(c) one y per (src key, dst key) pair, linked to both ends; returns its objective terms."""
    terms = []
    zs, zd = z[e.src], z[e.dst]
    y = {(k, l): model.NewBoolVar(f"y[{e.src}->{e.dst},{k},{l}]") for k in zs for l in zd}
    for k, zk in zs.items():
        model.Add(sum(y[k, l] for l in zd) == zk)
    for l, zl in zd.items():
        model.Add(sum(y[k, l] for k in zs) == zl)
    for (k, l), var in y.items():
        c = e.count * e.cost_ns.get((k, l), 0)
        if c:
            terms.append((c, var))
    return terms


def add_memory_constraints(model: cp_model.CpModel, groups: Sequence[Group], x, memory_kib: Optional[int]):
    """(d) parameters + peak activation within the per-device budget."""
    if memory_kib is None:
        return None
    peak = max((o.act_kib for g in groups for o in g.options), default=0)
    act = model.NewIntVar(0, max(peak, 0), "act")
    for g in groups:
        model.Add(act >= sum(o.act_kib * v for v, o in zip(x[g.name], g.options)))
    model.Add(sum(o.param_kib * v for g in groups for v, o in zip(x[g.name], g.options)) + act <= memory_kib)
    return act
