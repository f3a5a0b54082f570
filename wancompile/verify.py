"""Ground truth: sharded numerics vs the one-device program, predicted vs compiled collectives.

Two questions a user asks of every plan, answered by running, never by simulating:

1. Does the sharded program compute the same thing? `verify_program` runs the lowered graph under
   the plan and the *same* graph with everything replicated (what one XLA device computes: with no
   sharding annotation the SPMD partitioner emits the unpartitioned program on every device) and
   returns PCC and max-abs in float64.
2. Did the partitioner emit what the planner predicted? `compare_collectives` matches the plan's
   `Collective`s with the ones parsed from the partitioned HLO (`wancompile.hlo`), per kind and
   mesh axes: counts and bytes.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Sequence

import torch

from planner.errors import Error
from planner.graph import Graph
from planner.plan import Collective


@dataclass(frozen=True)
class Numerics:
    pcc: float
    max_abs: float

    def __str__(self) -> str:
        return f"PCC {self.pcc:.7f}, max-abs {self.max_abs:.3g}"


class VerificationError(Error):
    """The sharded program disagrees with the unsharded one beyond tolerance (not an ``AssertionError``: a
    finding about the plan, not a bug in the program; `planner.errors`)."""


class NonFiniteInputError(VerificationError):
    """``verify=True`` was given inputs (or parameters) holding NaN or Inf: there is nothing to
    compare, and the plan is not to blame. The message names the input."""


def _input_name(ref: str) -> str:
    kind, _, key = ref.partition(".")
    return f"input {key!r}" if kind == "kwargs" else f"positional input {key}" if kind == "args" else f"input {ref!r}"


def check_finite_inputs(graph: Graph, args: Sequence[Any]) -> None:
    """Raise `NonFiniteInputError` naming the first graph input or parameter with NaN/Inf values."""
    names = [
        f"parameter {n.param}" if n.param else _input_name(n.attrs.get("input", n.name))
        for n in graph
        if n.op == "placeholder"
    ]
    for name, a in zip(names, args):
        if isinstance(a, torch.Tensor) and (a.is_floating_point() or a.is_complex()) and a.numel():
            t = a.detach().cpu()
            nan, inf = int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
            if nan or inf:
                raise NonFiniteInputError(
                    f"wan_autoshard verify: {name} {tuple(t.shape)} holds {nan} NaN and {inf} Inf value(s) of {t.numel()}; "
                    "the model's output is not finite either way, so the plan was not checked. Pass finite inputs "
                    "(or run with verify off)"
                )


def _flat_tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in _flat_tensors(v)]
    if isinstance(x, Mapping):
        return [t for v in x.values() for t in _flat_tensors(v)]
    if hasattr(x, "to_tuple"):  # diffusers' BaseOutput
        return _flat_tensors(x.to_tuple())
    return []


def numerics(actual: Any, expected: Any) -> Numerics:
    """PCC and max-abs over all tensors of two (nested) outputs, computed in float64 on the host."""
    a = _flat_tensors(actual)
    b = _flat_tensors(expected)
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
        raise VerificationError(
            f"outputs differ in structure: {[tuple(x.shape) for x in a]} vs {[tuple(y.shape) for y in b]}"
        )
    if not a:
        return Numerics(1.0, 0.0)
    x = torch.cat([t.detach().cpu().double().flatten() for t in a])
    y = torch.cat([t.detach().cpu().double().flatten() for t in b])
    max_abs = (x - y).abs().max().item() if x.numel() else 0.0
    xc, yc = x - x.mean(), y - y.mean()
    denom = (xc.norm() * yc.norm()).item()
    pcc = (xc @ yc).item() / denom if denom > 0 else (1.0 if max_abs == 0 else 0.0)
    return Numerics(pcc, max_abs)


def tolerance(dtype: torch.dtype) -> float:
    """Minimum PCC the `verify` option accepts for outputs of this dtype."""
    return 0.99999 if dtype in (torch.float32, torch.float64) else 0.999


def verify_program(program, args: Sequence[Any]) -> tuple[Numerics, Any]:
    """Run `program` (a lowering.ShardedProgram) and its replicated twin on the same inputs."""
    out = program(*args)
    ref = program.replicated()(*args)
    return numerics(out, ref), out


def run_with_backend(
    module: torch.nn.Module, inputs: Mapping[str, Any], *, reference: bool = True, **options: Any
) -> tuple[Any, Any, Any]:
    """Compile `module` with ``backend="wan_autoshard"`` (one graph, these options), call it with
    `inputs` as keyword arguments (plus ``return_dict=False``), and run the same lowered graph with
    everything replicated: (sharded output, one-device output or None, the ShardedProgram)."""
    from wancompile.programs import last_program

    torch._dynamo.reset()
    compiled = torch.compile(module, backend="wan_autoshard", options=options, fullgraph=True)
    with torch.no_grad():
        out = compiled(**inputs, return_dict=False)
        program = last_program()
        ref = program.replicated()(*placeholder_args(program.graph, module, inputs)) if reference else None
    return out, ref, program


def tightest_budget(module: torch.nn.Module, inputs: Mapping[str, Any], **options: Any) -> float:
    """The smallest per-device budget (GB) the planner accepts for `module` called with `inputs` under these
    backend options: the ``need_gb`` of the `MemoryBudgetError` a 1e-9 GB budget raises (nothing is lowered).
    With ``cfg_parallel="on"`` the refusal is a `CfgInfeasible` listing every option: the least a split needs."""
    from planner.cfg import CfgInfeasible
    from planner.plan import MemoryBudgetError

    try:
        run_with_backend(module, inputs, reference=False, **{**options, "memory_gb": 1e-9})
    except (MemoryBudgetError, CfgInfeasible) as e:  # the backend's errors, caught as themselves
        if isinstance(e, MemoryBudgetError):
            return e.need_gb
        needs = [o.memory_needed_bytes for o in e.options if o.split_axis is not None and o.memory_needed_bytes]
        if not needs:
            raise
        return (min(needs) + 1) / 1e9  # the record keeps whole bytes, rounded down
    raise AssertionError(f"a 1e-9 GB budget planned {type(module).__name__}")


def placeholder_args(graph: Graph, module: torch.nn.Module, inputs: Mapping[str, Any], *args: Any) -> list[Any]:
    """The flat argument list of a captured graph, from the module's parameters/buffers and the
    call's inputs (``args.N`` / ``kwargs.NAME`` placeholders)."""
    state = dict(module.named_parameters())
    state.update(dict(module.named_buffers()))
    out = []
    for n in graph:
        if n.op != "placeholder":
            continue
        if n.param is not None:
            out.append(state[n.param])
            continue
        kind, _, key = n.attrs["input"].partition(".")
        out.append(args[int(key)] if kind == "args" else inputs[key])
    return out


@dataclass(frozen=True)
class CollectiveMatch:
    """One row of the comparison: a (kind, axes) pair with the predicted and compiled calls and total bytes."""

    kind: str
    axes: tuple[str, ...]
    predicted_count: int
    observed_count: int
    predicted_bytes: int
    observed_bytes: int

    @property
    def count_ok(self) -> bool:
        return self.predicted_count == self.observed_count

    def bytes_ok(self, rel: float = 0.05) -> bool:
        if self.predicted_bytes == self.observed_bytes:
            return True
        return abs(self.predicted_bytes - self.observed_bytes) <= rel * max(self.predicted_bytes, self.observed_bytes)

    def __str__(self) -> str:
        return (
            f"{self.kind:<18} {'+'.join(self.axes) or '-':<12} count {self.predicted_count:>3} predicted / "
            f"{self.observed_count:>3} compiled, bytes {self.predicted_bytes:>10} / {self.observed_bytes:>10}"
        )


def compare_collectives(predicted: Iterable[Collective], observed: Iterable[Collective]) -> list[CollectiveMatch]:
    """Per (kind, axes): predicted vs compiled counts and total bytes (bytes × count), both sides
    `Collective`s (the plan's, and `wancompile.hlo.parse_collectives`' one per instruction)."""
    table: dict[tuple[str, tuple[str, ...]], list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for side, cs in ((0, predicted), (1, observed)):
        for c in cs:
            row = table[(c.kind, tuple(c.axes))]
            row[side] += c.count
            row[side + 2] += c.bytes * c.count
    return [CollectiveMatch(k, a, *v) for (k, a), v in sorted(table.items())]


# --- a Wan-family model through the backend, as a user would run it -----------------------------------

# case -> (tight budget?, backend options): the default budget, the tightest budget the planner names (the
# ``need_gb`` of the `MemoryBudgetError` a 1e-9 GB budget raises), and that with every rewrite
FAMILY_CASES: dict[str, tuple[bool, dict[str, Any]]] = {
    "default": (False, {}),
    "tight": (True, {}),
    "tight + rewrites all": (True, {"rewrites": "all"}),
}


@dataclass(frozen=True)
class FamilyCheck:
    """`check_family`'s result: what a user of one tiny Wan-family model sees on one mesh under one case."""

    family: str
    case: str
    mesh: str
    memory_gb: Optional[float]  # the tight budget (None: the default)
    params_sharded: float  # fraction of parameter elements with a mesh axis in their spec
    vs_eager: Numerics  # the sharded output against eager fp32
    matches: tuple[CollectiveMatch, ...]  # predicted vs compiled, per (kind, mesh axes)
    program: Any = field(compare=False, repr=False)  # the `ShardedProgram` (its plan, HLO, ...)

    @property
    def as_predicted(self) -> bool:
        return all(m.count_ok and m.bytes_ok() for m in self.matches)

    def to_json(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "case": self.case,
            "mesh": self.mesh,
            "memory_gb": self.memory_gb,
            "params_sharded": self.params_sharded,
            "pcc": self.vs_eager.pcc,
            "max_abs": self.vs_eager.max_abs,
            "predicted_eq_compiled": self.as_predicted,
            "collectives": sum(m.observed_count for m in self.matches),
        }


def check_family(family: str, case: str, mesh: str = "2x4", **options: Any) -> FamilyCheck:
    """Compile the tiny `family` (`wancompile.models.FAMILIES`) through the backend on `mesh` under
    `case` (`FAMILY_CASES`), call it, and compare with eager fp32 and the plan's prediction. Needs the
    SPMD runtime with the mesh's device count."""
    from wancompile.models import build_family

    tight, extra = FAMILY_CASES[case]
    model, inputs = build_family(family)
    with torch.no_grad():
        eager = model(**inputs, return_dict=False)[0]
    options = {"mesh": mesh, **extra, **options}
    budget = None
    if tight:
        budget = options["memory_gb"] = tightest_budget(model, inputs, **options)
    out, _, program = run_with_backend(model, inputs, reference=False, **options)
    sizes = {n: p.numel() for n, p in model.named_parameters()}
    sharded = sum(sizes.get(p, 0) for p in program.plan.sharded_params())
    return FamilyCheck(
        family,
        case,
        mesh,
        budget,
        sharded / sum(sizes.values()),
        numerics(out[0], eager),
        tuple(compare_collectives(program.plan.collectives, program.collectives())),
        program,
    )
