"""The sharding ILP, written directly for OR-Tools CP-SAT (Alpa's node/edge formulation).

Sets. Groups g (one per macro-strategy choice; a DiT block's macros are one group each, shared by
all N identical blocks), options s ∈ S_g, and per group a key k(g, s) — the stream layout the
option reads and writes (for the DiT: the axes splitting the stream's tokens and its hidden dim,
`planner.strategies.Strategy.stream`; for the VAE: its spatial split). Edges (g, h) carry the stream from g to h.
Twins T_g ⊆ S_g × S_g: pairs (s, t) where t is s with its weights also split over its SP axes
(``+FSDP``): same key, same edges; a group of n = count_g blocks may run t on some of its blocks
and s on the rest (FSDP per block range: only as many blocks as memory needs pay t's weight gathers).

Variables.
  x[g,s] ∈ {0,1}     option s chosen for group g                          (a) exactly one per g
  z[g,k] ∈ {0,1}     group g runs with stream layout k; z[g,k] = Σ_{s: k(g,s)=k} x[g,s]   (b)
  y[g,h,k,l] ∈ {0,1} edge (g,h) carries k -> l: Σ_l y = z[g,k], Σ_k y = z[h,l]           (c)
  w[g,s] ∈ 0..n_g−1  blocks of g that run the twin t of s (for (s,t) ∈ T_g);            (e)
                     w[g,s] ≤ (n_g−1)·u[g,s], u[g,s] ≤ x[g,s], u[g,s] ≤ w[g,s]  (u ∈ {0,1}: w > 0)
                     all n_g blocks on t is x[g,t] = 1, so w stops at n_g − 1 (no two ways to say it)
  act ≥ 0            peak activation bytes per device

Edge variables are over stream keys, not options: options that share σ are followers of one
another on the edge (Alpa's ``e_follow``), so an edge has |K_g|·|K_h| variables, not |S_g|·|S_h|.

Objective (integer nanoseconds; ``count`` = how many blocks share the group):
  min Σ_g Σ_s x[g,s]·(count_g·c[g,s] + once[g,s]) + Σ_(g,h) Σ_{k,l} y[g,h,k,l]·count_gh·r[g,h,k,l]
      + Σ_g Σ_{(s,t)∈T_g} w[g,s]·(c[g,t] − c[g,s])
(the edges and once-costs of s and t are the same: they share the key)

Memory (per device, KiB):                                                 (d)
  Σ_g Σ_s x[g,s]·m[g,s] − Σ_g Σ_{(s,t)∈T_g} w[g,s]·δ[g,s] + act ≤ M,
  act ≥ Σ_s x[g,s]·a[g,s]  and  act ≥ a[g,t]·u[g,s]  for every g and (s,t) ∈ T_g
  m[g,s] = the option's parameter bytes per device, over all count_g repetitions and all resident
           weight sets (both A14B experts: ×2); M = the budget less the parameters no option shards;
  a[g,s] = 3 × the largest per-op live set of the option's ops (inputs as required + outputs, per
           device): the live set, the residual stream it came from and one fused temporary
           (`planner.pricing.ACTIVATION_FACTOR`); both rounded up to KiB;
  δ[g,s] = ⌊(m[g,s] − m[g,t]) / n_g⌋, what one block saves on its twin (rounded down: never overcounted).
A caller may fix Σ_s w[g,s] = k_g (`Group.twin_blocks`: a plan's per-block-range choice transferred
to another model). The blocks that run the twin are the last w (`twin_range`).

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
from typing import TYPE_CHECKING, Hashable, Mapping, Optional, Sequence

if TYPE_CHECKING:  # imported by the two solves: reading a plan (wancompile explain, diff) needs no solver
    from ortools.sat.python import cp_model

from planner.errors import Error

KIB = 1024  # the unit of the memory constraint (d): bytes per KiB


@dataclass(frozen=True)
class Option:
    name: str
    key: Hashable  # stream layout this option reads/writes
    cost_ns: int  # per repetition
    once_ns: int = 0  # paid once regardless of repetitions
    param_kib: int = 0  # total over repetitions
    act_kib: int = 0


def twin_range(count: int, k: int) -> tuple[int, int]:
    """The blocks [first, stop) of a group of `count` that run the chosen option's twin when k do:
    the last k (a block range; the plan writes their parameters and constraints by name)."""
    return (count - k, count)


@dataclass(frozen=True)
class Group:
    name: str
    options: tuple[Option, ...]
    count: int = 1
    twins: tuple[tuple[int, int], ...] = ()  # (option s, its FSDP twin t), T_g: blocks may run t instead of s
    twin_blocks: Optional[int] = None  # fixes Σ w[g,·] (blocks on the chosen option's twin); None: free

    def twin(self, j: int) -> Optional[int]:
        """The FSDP twin of option j, None if it has none."""
        return next((t for s, t in self.twins if s == j), None)

    def cost_ns(self, j: int, k: int = 0) -> int:
        """Option j over all its repetitions, k of them on its twin, plus its once-cost."""
        o, t = self.options[j], self.twin(j)
        twin = (self.options[t].cost_ns - o.cost_ns) * k if k and t is not None else 0
        return self.count * o.cost_ns + o.once_ns + twin

    def saving_kib(self, j: int) -> int:
        """δ: the parameter KiB one block saves on option j's twin (rounded down)."""
        t = self.twin(j)
        return 0 if t is None else max(0, (self.options[j].param_kib - self.options[t].param_kib) // self.count)

    def param_kib(self, j: int, k: int = 0) -> int:
        """Parameter KiB of option j with k blocks on its twin (the ILP's own accounting)."""
        return self.options[j].param_kib - k * self.saving_kib(j)

    def act_kib(self, j: int, k: int = 0) -> int:
        t = self.twin(j)
        return max(self.options[j].act_kib, self.options[t].act_kib if k and t is not None else 0)


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
    twin_blocks: dict[str, int] = field(default_factory=dict)  # group -> w: blocks on the chosen option's twin

    def blocks_on_twin(self, group: str) -> int:
        return self.twin_blocks.get(group, 0)

    @property
    def gap(self) -> float:
        return 0.0 if self.objective_ns == 0 else max(0.0, (self.objective_ns - self.bound_ns) / self.objective_ns)


class Infeasible(Error, RuntimeError):
    """The solver proved that no choice satisfies the constraints (CP-SAT status INFEASIBLE). Internal: the
    planner reports it as `MemoryBudgetError`, `InfeasiblePlanError` or `SolverTimeout`; an `Error` all the same."""

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
    from ortools.sat.python import cp_model

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
    w = add_twin_constraints(model, groups, x)
    for g in groups:
        for s, (ws, _) in w[g.name].items():
            terms.append((g.options[g.twin(s)].cost_ns - g.options[s].cost_ns, ws))
    act = add_memory_constraints(model, groups, x, memory_kib, w)
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
            for ws, us in w.get(g, {}).values():
                model.AddHint(ws, 0)
                model.AddHint(us, 0)
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
    twin_blocks = {g.name: k for g in groups if (k := sum(solver.Value(ws) for ws, _ in w[g.name].values())) > 0}
    return SolveResult(
        choice,
        name,
        int(solver.ObjectiveValue()),
        int(solver.BestObjectiveBound()),
        seconds,
        len(proto.variables),
        len(proto.constraints),
        twin_blocks,
    )


def min_memory_kib(groups: Sequence[Group], *, time_limit_s: float = 5.0) -> tuple[int, bool]:
    """The smallest ``memory_kib`` for which `solve` finds a plan: constraints (a) and (d) with the
    memory sum itself minimised (time ignored). Returns (KiB, proven optimal). The value is exactly
    the left side of (d) for the returned choice, so ``solve(..., memory_kib=value)`` is feasible
    (not a sum of per-group minima, which no single plan need reach: the activation peak and the
    parameters of different groups cannot all be at their minimum at once)."""
    from ortools.sat.python import cp_model

    model = cp_model.CpModel()
    x = {g.name: [model.NewBoolVar(f"x[{g.name},{o.name}]") for o in g.options] for g in groups}
    add_choice_constraints(model, groups, x)
    w = add_twin_constraints(model, groups, x)  # never below all blocks on the twin, but `twin_blocks` may fix w
    peak = max((o.act_kib for g in groups for o in g.options), default=0)
    act = model.NewIntVar(0, max(peak, 0), "act")
    saved = []
    for g in groups:
        model.Add(act >= sum(o.act_kib * v for v, o in zip(x[g.name], g.options)))
        for s, (ws, us) in w[g.name].items():
            model.Add(act >= g.options[g.twin(s)].act_kib * us)
            saved.append(g.saving_kib(s) * ws)
    model.Minimize(sum(o.param_kib * v for g in groups for v, o in zip(x[g.name], g.options)) - sum(saved) + act)
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


def add_twin_constraints(model: cp_model.CpModel, groups: Sequence[Group], x) -> dict:
    """(e) per twin pair (s, t) of a group of n blocks: w[g,s] ∈ 0..n−1 blocks on t, only if s is
    chosen, and u[g,s] = (w[g,s] > 0); `Group.twin_blocks` fixes Σ_s w[g,s]. Returns
    {group: {s: (w, u)}}."""
    out: dict[str, dict[int, tuple]] = {}
    for g in groups:
        out[g.name] = {}
        top = g.count - 1
        for s, _ in g.twins if top > 0 else ():
            ws = model.NewIntVar(0, top, f"w[{g.name},{g.options[s].name}]")
            us = model.NewBoolVar(f"u[{g.name},{g.options[s].name}]")
            model.Add(ws <= top * us)
            model.Add(ws >= us)
            model.AddImplication(us, x[g.name][s])
            out[g.name][s] = (ws, us)
        if g.twin_blocks is not None:
            model.Add(sum(ws for ws, _ in out[g.name].values()) == g.twin_blocks)
    return out


def add_memory_constraints(
    model: cp_model.CpModel, groups: Sequence[Group], x, memory_kib: Optional[int], w: Optional[dict] = None
):
    """(d) parameters + peak activation within the per-device budget; with `w` (`add_twin_constraints`)
    the blocks on a twin save δ each and bring its activation peak."""
    if memory_kib is None:
        return None
    w = w or {}
    peak = max((o.act_kib for g in groups for o in g.options), default=0)
    act = model.NewIntVar(0, max(peak, 0), "act")
    saved = []
    for g in groups:
        model.Add(act >= sum(o.act_kib * v for v, o in zip(x[g.name], g.options)))
        for s, (ws, us) in w.get(g.name, {}).items():
            model.Add(act >= g.options[g.twin(s)].act_kib * us)
            saved.append(g.saving_kib(s) * ws)
    params = sum(o.param_kib * v for g in groups for v, o in zip(x[g.name], g.options))
    model.Add(params - sum(saved) + act <= memory_kib)
    return act
