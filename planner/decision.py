"""`Decision`: what the solver chose for one group of ops, what it priced and what lost, as records.

Written to plan.json's ``decisions`` by `planner.records` from the fields below (no hand-written JSON):
a new field is a new key. Readers use the fields; no field is prose to re-parse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Optional

from planner.records import ADDED, OMIT, Record, Schema

MAIN_STACK = "blocks"  # the DiT's block stack: a block macro (``in_block``) applies to ``blocks.*.<macro>``
UNITS = ("forward", "decode", "step")  # what a decision's seconds are per
STATES = ("", "STATE A", "STATE B", "SP-Megatron")  # the stream layouts between DiT block macros
NonNeg = Schema(minimum=0)


@dataclass(frozen=True)
class OptionCost(Record):
    """One option the solver could choose for a decision, priced on its own: ``seconds_own`` is what
    the option itself costs per forward (per decode for the VAE, per step for CFG): the group's count
    times its per-call cost plus any once-per-forward cost, without the stream edges or the other
    groups. Memory as the ILP's constraint counts it: the group's weights per device (all its
    repetitions and weight sets) and its activation estimate (3 × the largest live set)."""

    name: str
    seconds_own: Annotated[float, NonNeg]
    param_bytes_per_device: Annotated[int, ADDED, NonNeg] = 0
    activation_bytes: Annotated[int, ADDED, NonNeg] = 0
    stream: Annotated[str, ADDED] = (
        ""  # layout of the stream the option reads/writes (planner.placements notation); "" if none
    )


@dataclass(frozen=True)
class Exclusion(Record):
    """An option (or a family of options, e.g. ``SP over batchxmodel (8)``) the planner did not offer
    the solver, and why (a split that does not divide, a restriction the caller gave)."""

    option: str
    reason: str


@dataclass(frozen=True)
class Move(Record):
    """Another decision whose choice differs in an alternative plan."""

    macro: str
    option: str


@dataclass(frozen=True)
class CostSplit(Record):
    """Where an alternative plan's whole cost differs from the chosen plan's (seconds, alternative
    minus chosen): this decision's own option, the stream-layout edges, the other groups (whose
    changed choices are ``moved``). ``for_memory``: the others moved to fit the memory budget
    (the alternative option with the others as chosen breaks it)."""

    this_macro: float
    edges: float
    other_macros: float
    moved: tuple[Move, ...] = ()
    for_memory: bool = False

    @property
    def total(self) -> float:
        return self.this_macro + self.edges + self.other_macros


@dataclass(frozen=True)
class Alternative(Record):
    """An option that is cheaper on its own than the chosen one but lost: the best whole plan that
    uses it (``plan_seconds``; None when no plan with it fits the memory budget) and why."""

    option: str
    seconds_own: float
    plan_seconds: Optional[float] = None
    split: Optional[CostSplit] = None


@dataclass(frozen=True)
class HeadPadding(Record):
    """An attention computed with ``padded`` heads of which ``heads`` are real (the rest zero:
    rewrites/pad_heads.py), for every attention at ``module`` (block-generic: ``blocks.*.attn1``)."""

    module: str
    heads: Annotated[int, Schema(minimum=1)]
    padded: Annotated[int, Schema(minimum=1)]


@dataclass(frozen=True)
class RingAttention(Record):
    """Ring attention for a self-attention with SP (`planner.ring`), priced beside the chosen option:
    ``option`` is the ring option with the chosen option's axes (σ, t, FSDP, stream) where the chosen
    option splits the tokens, else the cheapest ring option on its own; ``seconds_own`` its price and
    ``chosen_seconds_own`` the chosen option's (both as `OptionCost.seconds_own`: per unit, all
    repetitions). ``offered``: the target lowers ring attention, so the solver could choose it;
    otherwise ``why_not`` says why not (``no ring SDPA lowering in tt-mlir (tt-mlir #7598)``).
    ``chosen``: the plan runs it. Per call: ``steps`` ring steps (devices on σ), ``step_compute_s``
    one step's attention compute, ``step_transfer_s`` one step's K and V chunks to the neighbour,
    ``gather_s`` the K/V all-gathers the ring replaces."""

    option: str
    seconds_own: float
    chosen_seconds_own: float
    offered: bool
    why_not: str = ""
    chosen: bool = False
    steps: Annotated[int, ADDED, NonNeg] = 0
    step_compute_s: Annotated[float, ADDED, NonNeg] = 0.0
    step_transfer_s: Annotated[float, ADDED, NonNeg] = 0.0
    gather_s: Annotated[float, ADDED, NonNeg] = 0.0

    @property
    def saves(self) -> float:
        """Seconds per unit the ring option would save over the chosen one on its own (negative: it costs more)."""
        return self.chosen_seconds_own - self.seconds_own


@dataclass(frozen=True)
class Decision(Record):
    """What was chosen for one ILP group and what lost, as data.

    The group: ``macro`` (block-relative for a block macro, ``attn1``; a module path for a root or
    VAE macro; ``cfg-parallel``), ``count`` (how many repetitions share the choice: blocks, or VAE
    macros of one shape, listed in ``members``), ``in_block`` (a DiT block macro: it applies to
    ``blocks.*.<macro>``). ``cost`` and ``rejected_cost`` are whole-plan objectives in seconds per
    ``unit`` (``forward``, ``decode``, ``step``): the best plan with the chosen option vs the best
    plan without it (re-solved with the choice forbidden), so ``rejected_cost >= cost`` whenever the
    solve is optimal; ``rejected_split`` says where that difference comes from. ``rejected`` is ""
    when there was no alternative (one legal option, or every other one breaks the memory budget:
    tell the two apart by ``options``). ``cheaper_alone``: an option cheaper on its own than the
    chosen one, and why it lost anyway."""

    json_order = ("node", "macro", "count", "in_block", "members")
    json_derived = ("node",)

    macro: str
    strategy: str
    cost: float
    count: Annotated[int, Schema(minimum=1)] = 1
    in_block: bool = False
    members: Annotated[tuple[str, ...], ADDED] = ()
    rejected: str = ""
    rejected_cost: Optional[float] = None
    rejected_split: Annotated[Optional[CostSplit], ADDED] = None
    cheaper_alone: Annotated[Optional[Alternative], ADDED] = None
    options: tuple[OptionCost, ...] = ()
    excluded: tuple[Exclusion, ...] = ()
    weight_bytes_per_device: Annotated[int, ADDED, NonNeg] = 0
    fsdp: Annotated[bool, ADDED] = False  # the chosen option shards weights for memory
    stream: Annotated[str, ADDED] = (
        ""  # layout of the stream the chosen option reads/writes (planner.placements notation)
    )
    unit: Annotated[str, ADDED, Schema(enum=UNITS)] = "forward"
    # which stream layout that is (DiT block macros): STATE A | STATE B | SP-Megatron
    state: Annotated[str, ADDED, Schema(enum=STATES)] = ""
    family: Annotated[str, OMIT] = (
        ""  # a further block family's prefix (``vace_blocks``); ``macro`` is then its block-generic name
    )
    # FSDP per block range: blocks [first, stop) run ``fsdp_strategy`` (the chosen strategy with its
    # weights also split over its SP axes, gathered per use), the others ``strategy``; None: all
    # blocks run ``strategy`` (which may itself be an FSDP option: ``fsdp``)
    fsdp_blocks: Annotated[Optional[tuple[int, int]], OMIT] = None
    fsdp_strategy: Annotated[str, OMIT] = ""
    pad_heads: Annotated[Optional[HeadPadding], OMIT] = (
        None  # the chosen option runs the attention on zero-padded heads
    )
    ring: Annotated[Optional[RingAttention], OMIT] = (
        None  # a self-attention with SP: ring attention priced beside the choice
    )

    @property
    def scope(self) -> str:
        """The module path the choice applies to: ``blocks.*.attn1``, ``vace_blocks.*.attn1``,
        ``condition_embedder.time_embedder``."""
        if self.family:
            return self.macro
        return f"{MAIN_STACK}.*.{self.macro}" if self.in_block else self.macro

    @property
    def node(self) -> str:
        """For readers: ``blocks.*.attn1 (x40)``."""
        return self.scope + (f" (x{self.count})" if self.count > 1 else "")

    @property
    def margin(self) -> Optional[float]:
        """Seconds per unit the choice is worth: the best plan without it minus the best plan with it."""
        return self.rejected_cost - self.cost if self.rejected and self.rejected_cost is not None else None

    def option(self, name: str) -> Optional[OptionCost]:
        return next((o for o in self.options if o.name == name), None)
