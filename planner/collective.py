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
from typing import Mapping, Optional

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


@dataclass(frozen=True)
class Collective:
    """A collective the partitioned program runs: kind, mesh axes, bytes per device per call, calls."""

    kind: str  # one of KINDS
    axes: tuple[str, ...]
    bytes: int
    count: int = 1
    where: str = ""  # the op's location (predicted), the HLO instruction's name (observed)
    reason: str = ""  # why the rules need it ("to_k for linear", "row-parallel partial sums"); predicted only
    seconds: Optional[float] = None  # per call under the cost model; predicted only
    shape: str = ""  # observed only: the HLO result shape text, e.g. ``f32[1,48,64]{2,1,0}``
    groups: tuple[tuple[int, ...], ...] = ()  # observed only: replica groups (or source-target pairs)

    def to_json(self) -> dict:
        out = {
            "kind": self.kind,
            "axes": list(self.axes),
            "bytes": int(self.bytes),
            "count": int(self.count),
            "where": self.where,
        }
        if self.reason:
            out["reason"] = self.reason
        if self.seconds is not None:
            out["seconds"] = float(self.seconds)
        return out

    @classmethod
    def from_json(cls, d: Mapping) -> "Collective":
        seconds = d.get("seconds")
        return cls(
            str(d["kind"]),
            tuple(d["axes"]),
            int(d["bytes"]),
            int(d.get("count", 1)),
            str(d.get("where", "")),
            str(d.get("reason", "")),
            None if seconds is None else float(seconds),
        )
