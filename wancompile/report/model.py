"""What every dump view (plan.md, plan.html, explain, diff) reads: a `Plan`, its optional per-op
trace (`wancompile.report.trace`), and the few things derived from them — the per-block collective
bill, the parallelism, the roofline, and the one layout notation (`planner.placements`) for the
trace's tensor states. Each decision's account in sentences and the number formats are
`wancompile.report.text`'s (re-exported here).

Views never reach into the planner's internals: the plan is read through `planner.plan.Plan` (its
decisions are typed: nothing here parses text), the cost model only through
`planner.cost_model.collective_seconds` and the hardware profile.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from planner.hardware import HardwareProfile, get_profile
from planner.mesh import entry_axes
from planner.placements import Layout
from planner.plan import MAIN_STACK, Collective, Decision, Plan, PlanError
from wancompile.report.text import _num
from wancompile.report.text import blocks_text as blocks_text
from wancompile.report.text import decision_account as decision_account
from wancompile.report.text import fsdp_range_text as fsdp_range_text
from wancompile.report.text import human_bytes as human_bytes
from wancompile.report.text import human_flops as human_flops
from wancompile.report.text import ms as ms
from wancompile.report.text import ring_text as ring_text
from wancompile.report.text import us as us
from wancompile.report.text import weights_text as weights_text

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
                from planner.cfg import plan_profile  # the solver's module: imported when a view prices

                self._hw = plan_profile(self.plan, get_profile(name)) if name else None
            except ValueError:
                self._hw = None
        return self._hw

    @property
    def num_blocks(self) -> int:
        if self.trace and self.trace.get("blocks"):
            return int(self.trace["blocks"])
        return self.plan.layers

    # --- the one layout notation, for the trace's tensor states -------------------------------------

    def layout(self, state: Optional[dict]) -> str:
        """A trace state's layout: ``(S(1), R)``; "" for an op without a tensor output."""
        if not state:
            return ""
        lay = Layout(tuple(entry_axes(e) for e in state["spec"]), tuple(state.get("partial", ())))
        return lay.show(self.plan.mesh)

    def state(self, state: Optional[dict]) -> str:
        """A trace state for people: the global shape and the layout, ``1 × 48 × 64 (S(1), R)``."""
        if not state:
            return ""
        shape = " × ".join(str(d) for d in state["shape"]) or "scalar"
        return f"{shape} {self.layout(state)}"

    def spec(self, spec) -> str:
        """A partition spec (plan.json's per-dim form) in the notation."""
        return Layout(tuple(entry_axes(e) for e in spec)).show(self.plan.mesh)

    def weights(self, row: dict) -> str:
        """The row's parameters: ``weight (R, S(0)); bias (R, S(0))``."""
        return "; ".join(f"{w['param'].rsplit('.', 1)[-1]} {self.spec(w['spec'])}" for w in row["weights"])

    def families(self) -> list[dict]:
        """The further block stacks of the trace (VACE's ``vace_blocks``): prefix, blocks, block_module."""
        return list((self.trace or {}).get("families", []))

    def rows(self, segment: Optional[str] = None) -> list[dict]:
        ops = (self.trace or {}).get("ops", [])
        return [r for r in ops if segment is None or r["segment"] == segment]

    def table_rows(self, segment: str) -> list[dict]:
        """The rows a reader wants: kernels, and any op that moves data or carries a constraint."""
        return [r for r in self.rows(segment) if r["kernel"] or r["collectives"] or r["constraint"]]

    def block_collectives(self) -> list[Collective]:
        return [c for c in self.plan.collectives if c.where.startswith(f"{MAIN_STACK}.*")]

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
        """The block-stack entry constraint: the (B, L, D) tokens in the root module, the first with the most
        tokens (sp_pad's padded stream where it pads: the patch embedding's output before it is another constraint)."""
        acts = [a for a in self.plan.activations if a.location.module == "" and len(a.spec) == 3]

        def tokens(a) -> int:  # a symbolic length, or a file written before shapes were: ranked first as before
            return a.shape[1] if len(a.shape) == 3 and isinstance(a.shape[1], int) else -1

        most = max(map(tokens, acts), default=None)
        return next((a for a in acts if tokens(a) == most), None)

    def sp_axes(self) -> tuple[str, ...]:
        e = self.entry_constraint()
        return entry_axes(e.spec[1]) if e is not None else ()

    def tp_axes(self) -> tuple[str, ...]:
        """Axes splitting the heads of the first self-attention (the ``attn1`` macro): the feature dim
        of its first projection's output (from the trace), else the Q weight's output dim less the SP
        axes (FSDP adds those)."""
        first = next((r for r in self.rows("block") if r["group"] == "attn1" and r["op"] == "linear"), None)
        if first is not None and first["out"]:
            return entry_axes(first["out"]["spec"][-1])
        spec = self.plan.params.get("blocks.0.attn1.to_q.weight") or self.plan.params.get(
            "blocks.0.attn1.to_qkv.weight"
        )
        return tuple(a for a in entry_axes(spec[0]) if a not in self.sp_axes()) if spec else ()

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

    def decisions(self) -> list[Decision]:
        return list(self.plan.decisions)

    def decision(self, name: str) -> Optional[Decision]:
        """The decision named by its macro (``attn1``), its scope (``blocks.*.attn1``) or its node
        (``blocks.*.attn1 (x40)``)."""
        return next((d for d in self.plan.decisions if name in (d.macro, d.scope, d.node)), None)

    def decision_for(self, module: str) -> Optional[Decision]:
        """The decision whose macro contains `module` (generic: ``blocks.*.attn1.to_q`` -> attn1)."""
        best = None
        for d in self.plan.decisions:
            for scope in (d.scope, *d.members):
                if module == scope or module.startswith(scope + "."):
                    if best is None or len(scope) > len(best[1]):
                        best = (d, scope)
        return best[0] if best else None

    def segment_costs(self) -> list[tuple[str, int, float, float]]:
        """(segment, times per forward, compute s, comm s) from the trace, per call of the segment."""
        out = []
        segments = [("prologue", 1, None), ("block", self.num_blocks, None)]
        segments += [(f["prefix"], f["blocks"], f["prefix"]) for f in self.families()]
        for seg, times, family in (*segments, ("epilogue", 1, None)):
            rows = [r for r in self.rows("family") if r["family"] == family] if family else self.rows(seg)
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
        times = {f["prefix"]: f["blocks"] for f in self.families()}
        return sum(
            r.get("flops", 0.0) * (self.num_blocks if r["segment"] == "block" else times.get(r.get("family"), 1))
            for r in self.rows()
        )

    def collective_seconds(self, c: Collective) -> Optional[float]:
        from planner.cost_model import collective_seconds

        hw = self.hardware
        if hw is None:
            return None
        try:
            return collective_seconds(c.kind, c.bytes, c.axes, self.plan.mesh, hw)
        except Exception:  # an axis the profile lacks
            return None
