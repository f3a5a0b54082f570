"""What the backend hands dynamo around a lowered program: `_GuardedProgram` (a dynamic graph's sizes
checked against the plan's guards, re-planned where they break them) and `_Verifying` (the first call
checked against the unsharded program)."""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch

from planner.plan import Plan
from wancompile.verify import VerificationError, check_finite_inputs, numerics, tolerance

log = logging.getLogger("wancompile")


class _GuardedProgram:
    """One dynamic graph, many resolutions: each call's sizes are checked against the plan's guards
    (e.g. tokens divisible by the SP degree); sizes that break them get a plan of their own
    (re-planned once per distinct size, then cached), instead of silently uneven shards."""

    def __init__(
        self, program, plan: Plan, symbols: dict[str, int], replan: Callable, planned_for: dict[str, int]
    ) -> None:
        # The contract is what the plan assumed and its own sizes satisfy; a guard already broken at
        # those sizes (e.g. 32-token tiles at 48 tokens) is a padding hint, not an assumption.
        self.plan = plan.with_(
            guards=tuple(dict.fromkeys(g for g in plan.guards if not planned_for or g.holds(planned_for)))
        )
        self.symbols, self.replan = symbols, replan
        self.programs: dict[tuple, Any] = {}
        self.base = program

    def __call__(self, *args: Any) -> Any:
        from planner.guards import check_guards

        values = {name: int(args[i]) for name, i in self.symbols.items()}
        key = tuple(sorted(values.items()))
        program = self.programs.get(key)
        if program is None:
            check = check_guards(self.plan, values)
            if check.action == "reuse":
                program = self.base
            else:
                log.info("wan_autoshard: sizes %s break the plan's guards (%s); re-planning for them", values, check)
                program = self.replan(values)
            self.programs[key] = program
        return program(*args)


class _Verifying:
    """Runs the program; on the first call also runs it unsharded and raises on mismatch."""

    def __init__(self, program) -> None:
        self.program = program

    def __call__(self, *args: Any) -> Any:
        if self.program.verification is None and hasattr(self.program, "graph"):
            check_finite_inputs(self.program.graph, args)  # bad inputs are not the plan's fault: say so first
        out = self.program(*args)
        if self.program.verification is None:
            ref = self.program.replicated()(*args)
            result = numerics(out, ref)
            if not all(torch.isfinite(t.detach().cpu()).all() for t in _tensors(ref)):
                raise VerificationError(
                    "wan_autoshard verify: the unsharded program itself gives NaN/Inf on these (finite) inputs, so the "
                    "plan cannot be checked; look at the model or its inputs' range, not the plan"
                )
            self.program.verification = result
            dtype = next((t.dtype for t in _tensors(out)), torch.float32)
            if not result.pcc >= tolerance(dtype):
                raise VerificationError(
                    f"wan_autoshard verify: the sharded program disagrees with the unsharded one ({result}; "
                    f"needs PCC >= {tolerance(dtype)}). Plan: {self.program.plan.summary()}. "
                    "Report this with the dump_dir contents; run with verify off only if you accept it."
                )
            log.info("wan_autoshard verify: %s", result)
        return out


def _tensors(x: Any) -> list:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in _tensors(v)]
    return []
