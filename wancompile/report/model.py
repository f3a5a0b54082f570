"""What every dump view (plan.md, plan.html, explain, diff) reads: a `Plan`, its optional per-op
trace (`wancompile.report.trace`), and the few numbers derived from them — the per-block collective
bill, the parallelism, the roofline, and each decision's alternatives.

Views never reach into the planner's internals: the plan is read through `planner.plan.Plan`, the
cost model only through `planner.cost_model.collective_seconds` and the hardware profile.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from planner.cfg import plan_profile
from planner.hardware import HardwareProfile, get_profile
from planner.mesh import entry_axes
from planner.plan import Collective, Decision, Plan, PlanError

# A collective is "small" when it moves under 1/SMALL_RATIO of the block's largest one: the seed's
# norm_q/k statistics all-reduces are (1, L) against the (L, D) row-parallel ones, i.e. 1/D.
SMALL_RATIO = 16


@dataclass(frozen=True)
class BillEntry:
    kind: str
    axes: tuple[str, ...]
    bytes: int
    per_block: float  # calls per block
    where: str
    small: bool


@dataclass(frozen=True)
class Bill:
    """The per-block collective bill, the seed's "3 big + 4 small"."""

    entries: tuple[BillEntry, ...]

    @property
    def big(self) -> float:
        return sum(e.per_block for e in self.entries if not e.small)

    @property
    def small(self) -> float:
        return sum(e.per_block for e in self.entries if e.small)

    def headline(self) -> str:
        if not self.entries:
            return "no collectives"
        return f"{_num(self.big)} big + {_num(self.small)} small"

    def breakdown(self) -> str:
        """``3 all-reduce on model, 2 all-gather on batch; small: 4 all-reduce on model``."""

        def part(small: bool) -> str:
            c: Counter = Counter()
            for e in self.entries:
                if e.small == small:
                    c[(e.kind, e.axes)] += e.per_block
            return ", ".join(f"{_num(n)} {k} on {'+'.join(a) or '-'}" for (k, a), n in sorted(c.items()))

        big, small = part(False), part(True)
        return "; ".join(p for p in (big, f"small: {small}" if small else "") if p)


@dataclass(frozen=True)
class DecisionView:
    """A `Decision` with its note read apart: the options the solver priced, the excluded ones."""

    decision: Decision
    plan_delta_ms: Optional[float]  # the whole plan's cost change when this choice is forbidden
    options: tuple[tuple[str, float], ...]  # (strategy, ms per forward), cheapest first
    excluded: tuple[str, ...]
    memory: str
    other: tuple[str, ...]

    @property
    def where(self) -> str:
        return self.decision.node

    @property
    def key(self) -> str:
        """``attn1`` for ``blocks.*.attn1 (x40)``, the module path for root decisions."""
        return re.sub(r"^blocks\.\*\.", "", re.sub(r"\s*\(x\d+\)$", "", self.decision.node))


def parse_decision(d: Decision) -> DecisionView:
    """A decision for display. ``cost``/``rejected_cost`` are whole-plan totals per forward (the best
    plan with the choice vs the best plan without it), so their difference is what the choice is
    worth. The options priced on their own, the excluded ones and the weight memory are read from
    the note (``excluded: ...; options on their own (ms per forward): a=1.0, b=2.0; 1.2 GB
    weights/device``); other parts are kept verbatim."""
    note = d.note or ""
    delta = (d.rejected_cost - d.cost) * 1e3 if d.rejected_cost is not None and d.rejected else None
    options: list[tuple[str, float]] = []
    m = re.search(r"options on their own \(ms per forward\): (.*?)(?:; (?=\d[\d.]* GB)|$)", note)
    if m:
        for part in m.group(1).split(", "):
            name, _, val = part.rpartition("=")
            try:
                options.append((name, float(val)))
            except ValueError:
                pass
    excluded: tuple[str, ...] = ()
    m = re.search(r"excluded: (.*?); options on their own \(", note)
    if m:
        excluded = tuple(dict.fromkeys(x.strip() for x in m.group(1).split("; ") if x.strip()))
    m = re.search(r"([\d.]+ GB weights/device[^;]*)", note)
    memory = m.group(1) if m else ""
    known = re.compile(r"^(excluded:|options on their own \(ms per forward\)|[\d.]+ GB weights/device)")
    parts = [p.strip() for p in note.split("; ") if p.strip()]
    other = tuple(p for p in parts if not known.match(p) and p not in excluded)
    return DecisionView(d, delta, tuple(sorted(options, key=lambda o: o[1])), excluded, memory, other)


@dataclass
class Report:
    plan: Plan
    trace: Optional[dict] = None
    source: str = ""
    _hw: Optional[HardwareProfile] = field(default=None, repr=False)

    # --- loading -------------------------------------------------------------------------------

    @classmethod
    def from_json(cls, data: dict, source: str = "") -> "Report":
        plan = Plan.from_json(data)
        trace = data.get("report")
        return cls(plan, trace if isinstance(trace, dict) else None, source)

    @classmethod
    def load(cls, path: str | Path) -> "Report":
        path = Path(path)
        if path.is_dir():
            path = path / "plan.json"
        try:
            data = json.loads(path.read_text())
        except OSError as e:
            raise PlanError(f"cannot read plan {path}: {e.strerror}") from None
        except json.JSONDecodeError as e:
            raise PlanError(
                f"plan {path} is not valid JSON ({e.msg} at line {e.lineno}); regenerate it with `wancompile plan`"
            ) from None
        return cls.from_json(data, str(path))

    def to_json(self) -> dict:
        out = self.plan.to_json()
        if self.trace is not None:
            out["report"] = self.trace
        return out

    # --- facts -----------------------------------------------------------------------------------

    @property
    def hardware(self) -> Optional[HardwareProfile]:
        if self._hw is None:
            name = self.plan.hardware or (self.trace or {}).get("hardware", "")
            try:
                self._hw = plan_profile(self.plan, get_profile(name)) if name else None
            except ValueError:
                self._hw = None
        return self._hw

    @property
    def num_blocks(self) -> int:
        if self.trace and self.trace.get("blocks"):
            return int(self.trace["blocks"])
        idx = {int(m.group(1)) for p in self.plan.params for m in [re.match(r"^blocks\.(\d+)\.", p)] if m}
        return max(idx) + 1 if idx else 0

    def rows(self, segment: Optional[str] = None) -> list[dict]:
        ops = (self.trace or {}).get("ops", [])
        return [r for r in ops if segment is None or r["segment"] == segment]

    def table_rows(self, segment: str) -> list[dict]:
        """The rows a reader wants: kernels, and any op that moves data or carries a constraint."""
        return [r for r in self.rows(segment) if r["kernel"] or r["collectives"] or r["constraint"]]

    def block_collectives(self) -> list[Collective]:
        return [c for c in self.plan.collectives if c.where.startswith("blocks.*")]

    def bill(self) -> Bill:
        n = max(self.num_blocks, 1)
        cs = self.block_collectives()
        biggest = max((c.bytes for c in cs), default=0)
        return Bill(
            tuple(
                BillEntry(c.kind, tuple(c.axes), c.bytes, c.count / n, c.where, c.bytes * SMALL_RATIO < biggest)
                for c in cs
            )
        )

    def trace_bill(self) -> Bill:
        """The same bill counted from the trace's block rows (a cross-check of the plan's prediction)."""
        evs = [(c, r["loc"]) for r in self.rows("block") for c in r["collectives"]]
        biggest = max((c["bytes"] for c, _ in evs), default=0)
        return Bill(
            tuple(
                BillEntry(c["kind"], tuple(c["axes"]), c["bytes"], 1, loc, c["bytes"] * SMALL_RATIO < biggest)
                for c, loc in evs
            )
        )

    def entry_constraint(self):
        """The block-stack entry constraint: the (B, L, D) tokens in the root module."""
        acts = [a for a in self.plan.activations if a.location.module == "" and len(a.spec) == 3]
        return acts[0] if acts else None

    def sp_axes(self) -> tuple[str, ...]:
        e = self.entry_constraint()
        return entry_axes(e.spec[1]) if e is not None else ()

    def tp_axes(self) -> tuple[str, ...]:
        """Axes splitting the heads of the first self-attention: the feature dim of its Q projection's
        output (from the trace), else the Q weight's output dim less the SP axes (FSDP adds those)."""
        for r in self.rows("block"):
            if re.match(r"^blocks\.\*\.attn1\.to_q(kv)?:linear#0$", r["loc"]):
                last = r["out"].split(" +")[0].split(" × ")[-1]
                return tuple(last.split("/", 1)[1].split("·")) if "/" in last else ()
        for name, spec in self.plan.params.items():
            if re.match(r"^blocks\.0\.attn1\.to_q(kv)?\.weight$", name) and spec:
                return tuple(a for a in entry_axes(spec[0]) if a not in self.sp_axes())
        return ()

    def parallelism(self) -> str:
        mesh = self.plan.mesh

        def axes(a: tuple[str, ...]) -> str:
            n = 1
            for x in a:
                n *= mesh.axis_size(x)
            return f"{'×'.join(a)} ({n})"

        sp, tp = self.sp_axes(), self.tp_axes()
        parts = [
            f"SP: tokens over {axes(sp)}" if sp else "SP: none (tokens whole)",
            f"TP: attention heads over {axes(tp)}" if tp else "TP: none in self-attention",
        ]
        return "; ".join(parts)

    def decisions(self) -> list[DecisionView]:
        return [parse_decision(d) for d in self.plan.decisions]

    def segment_costs(self) -> list[tuple[str, int, float, float]]:
        """(segment, times per forward, compute s, comm s) from the trace, per call of the segment."""
        out = []
        for seg, times in (("prologue", 1), ("block", self.num_blocks), ("epilogue", 1)):
            rows = self.rows(seg)
            out.append(
                (
                    seg,
                    times,
                    sum(r["compute_s"] for r in rows),
                    sum(c["seconds"] for r in rows for c in r["collectives"]),
                )
            )
        return out

    def group_costs(self) -> list[tuple[str, float, float]]:
        """(group, compute s, comm s) per call, for the macros of one block, in block order."""
        acc: dict[str, list[float]] = {}
        for r in self.rows("block"):
            a = acc.setdefault(r["group"], [0.0, 0.0])
            a[0] += r["compute_s"]
            a[1] += sum(c["seconds"] for c in r["collectives"])
        return [(g, v[0], v[1]) for g, v in acc.items()]

    def flops_per_forward(self) -> float:
        return sum(r.get("flops", 0.0) * (self.num_blocks if r["segment"] == "block" else 1) for r in self.rows())

    def collective_seconds(self, c: Collective) -> Optional[float]:
        from planner.cost_model import collective_seconds

        hw = self.hardware
        if hw is None:
            return None
        try:
            return collective_seconds(c.kind, c.bytes, c.axes, self.plan.mesh, hw)
        except Exception:  # an axis the profile lacks
            return None


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.2f}"


def human_flops(n: float) -> str:
    for unit, size in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} FLOP"


def human_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def ms(seconds: Optional[float]) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:.3f}"


def us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f}"
