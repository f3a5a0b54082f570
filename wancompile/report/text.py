"""The sentences and numbers the dump views print: each decision's account, its ring / block-range / FSDP /
weights phrases, and human-readable FLOPs, bytes and times."""

from __future__ import annotations

from typing import Optional

from planner.plan import CostSplit, Decision


def _split_text(split: CostSplit) -> str:
    txt = (
        f"this macro {split.this_macro * 1e3:+.3f} ms, stream-layout edges {split.edges * 1e3:+.3f} ms, "
        f"other macros {split.other_macros * 1e3:+.3f} ms"
    )
    if split.moved:
        txt += (
            " ("
            + ", ".join(f"{m.macro} -> {m.option}" for m in split.moved)
            + (" to fit the memory budget" if split.for_memory else "")
            + ")"
        )
    return txt


def decision_account(d: Decision) -> list[str]:
    """The decision's own account in sentences (plan.md's "why" bullets, explain's notes), rendered
    from its typed fields: the whole plan and this group's share, the runner-up and where its extra
    cost comes from, and an option that is cheaper on its own but loses."""
    unit = d.unit
    chosen = d.option(d.strategy)
    share = f" ({d.strategy}: {chosen.seconds_own * 1e3:.3f} ms of it" + (f", x{d.count}" if d.count > 1 else "") + ")"
    out = [f"plan total {d.cost * 1e3:.3f} ms per {unit}" + (share if chosen is not None else "")]
    if d.rejected and d.rejected_cost is not None:
        line = f"next best: {d.rejected}, plan total {d.rejected_cost * 1e3:.3f} ms"
        if d.rejected_split is not None:
            line += f" ({d.rejected_split.total * 1e3:+.3f} ms: {_split_text(d.rejected_split)})"
        out.append(line)
    elif len(d.options) > 1:
        out.append("every alternative breaks the memory budget")
    elif len(d.options) == 1:
        out.append("only legal option")
    alt = d.cheaper_alone
    if alt is not None:
        head = f"{alt.option} is cheaper on its own ({alt.seconds_own * 1e3:.3f} ms) but "
        if alt.plan_seconds is None:
            out.append(head + "no plan with it fits the memory budget")
        else:
            out.append(
                head
                + f"its best plan totals {alt.plan_seconds * 1e3:.3f} ms"
                + (f": {_split_text(alt.split)}" if alt.split is not None else "")
            )
    return out


def ring_text(d: Decision) -> str:
    """Ring attention beside the choice, from `Decision.ring`: its price vs the chosen option's, what a
    step costs, and whether the target offered it (why not); "" for a decision without one."""
    r = d.ring
    if r is None:
        return ""
    if r.chosen:
        head = f"ring attention chosen: `{r.option}` {r.seconds_own * 1e3:.3f} ms per {d.unit}"
    else:
        verb = "would save" if r.saves >= 0 else "would cost"
        head = (
            f"ring attention `{r.option}` {r.seconds_own * 1e3:.3f} ms per {d.unit} vs {r.chosen_seconds_own * 1e3:.3f} "
            f"ms chosen: it {verb} {abs(r.saves) * 1e3:.3f} ms"
        )
    step = (
        f" ({r.steps} steps of {r.step_compute_s * 1e6:.1f} µs attention and {r.step_transfer_s * 1e6:.1f} µs K/V "
        f"transfer, replacing {r.gather_s * 1e6:.1f} µs of K/V all-gathers per call)"
    )
    return head + step + ("" if r.offered else f"; not offered: {r.why_not}")


def blocks_text(first: int, stop: int) -> str:
    """Blocks [first, stop) in words: ``blocks 37..39``, ``block 1``."""
    return f"block {first}" if stop - first == 1 else f"blocks {first}..{stop - 1}"


def fsdp_range_text(d: Decision) -> str:
    """FSDP per block range in words: ``blocks 37..39 run `X+FSDP` (weights also split over the SP
    axes, gathered per use), blocks 0..36 `X```; "" for a decision all of whose blocks run one option."""
    if d.fsdp_blocks is None:
        return ""
    first, stop = d.fsdp_blocks
    rest = [blocks_text(a, b) for a, b in ((0, first), (stop, d.count)) if b > a]
    return (
        f"{blocks_text(first, stop)} {'runs' if stop - first == 1 else 'run'} `{d.fsdp_strategy}` (weights also split over the SP axes, gathered per "
        f"use: only as many blocks as memory needs), {' and '.join(rest)} `{d.strategy}`"
    )


def weights_text(d: Decision) -> str:
    """``0.71 GB weights/device (weights sharded for memory)``; "" for a decision without weights data."""
    if not d.options or d.unit == "step":
        return ""
    return f"{d.weight_bytes_per_device / 1e9:.2f} GB weights/device" + (
        " (weights sharded for memory)" if d.fsdp else ""
    )


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
