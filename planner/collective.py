"""`Collective`: the one type for "a collective", predicted or observed.

The same record travels end to end: the op rules' propagation emits one per redistribution or in-op
collective (`planner.propagate.evaluate`, ``count`` 1, with its ``reason`` and ``seconds`` under the
cost model); the plan sums them per site (``plan.json`` ``collectives``, ``count`` = calls per
forward); the partitioned HLO is read into the same type (`wancompile.hlo.parse_collectives`, one per
instruction, ``where`` = the instruction's name, plus the HLO's own ``shape`` text and replica
``groups``); `wancompile.verify.compare_collectives` then counts both sides alike.

``shape`` and ``groups`` are kept as optional fields rather than a wrapper type: every reader of an
observed collective (the comparison, tests counting kinds, axes and bytes) treats it exactly as a
predicted one, and only a few diagnostics look at the HLO shape. They are never written to plan.json.

Bytes follow XLA's convention, per device and per call: the result for all-gather, the operand for
all-reduce, reduce-scatter, all-to-all and collective-permute.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Optional

from planner.records import HIDDEN, OMIT, Record, Schema

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


@dataclass(frozen=True)
class Collective(Record):
    """A collective the partitioned program runs: kind, mesh axes, bytes per device per call, calls."""

    kind: Annotated[str, Schema(enum=list(KINDS))]
    axes: tuple[str, ...]
    bytes: Annotated[int, Schema(minimum=0)]
    count: Annotated[int, Schema(minimum=0)] = 1
    where: str = ""  # the op's location (predicted), the HLO instruction's name (observed)
    # why the rules need it ("to_k for linear", "row-parallel partial sums"); predicted only
    reason: Annotated[str, OMIT] = ""
    seconds: Annotated[Optional[float], OMIT, Schema(minimum=0)] = None  # per call under the cost model; predicted only
    shape: Annotated[str, HIDDEN] = ""  # observed only: the HLO result shape text, e.g. ``f32[1,48,64]{2,1,0}``
    groups: Annotated[
        tuple[tuple[int, ...], ...], HIDDEN
    ] = ()  # observed only: replica groups (or source-target pairs)
