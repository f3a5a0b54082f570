"""tt-check's report as text: per program, its compile (and whether its kernels are a compile-only stand-in),
collectives against the prediction, TTNN ops per part of the model, score matrices, what the pins cost, and DRAM
per chip (`wancompile.tt.check.ProgramCheck`)."""

from __future__ import annotations

from typing import Iterable, Mapping

from wancompile.tt.check import ProgramCheck
from wancompile.tt.parts import EPILOGUE, PROLOGUE


def format_checks(checks: Iterable[ProgramCheck]) -> str:
    lines = []
    for c in checks:
        head = (
            f"{c.program} on {c.system}: "
            + (f"compiled in {c.seconds:.1f} s" if c.compiled else f"REFUSED: {c.error}")
            + "".join(f" ({k} {v})" for k, v in c.options.items())
            + (f": level 0 because of {c.level_0_because}" if c.level_0_because else "")
        )
        lines.append(head)
        lines.extend(_format_stand_in(c))
        if not c.compiled:
            continue
        for m in c.matches:
            ok = "" if m.count_ok else "   <-- differs"
            lines.append(
                f"  {m.kind:18} {'+'.join(m.axes) or '-':12} predicted {m.predicted_count:4} / TTNN {m.observed_count:4}{ok}"
            )
        if not c.matches:
            lines.append("  no collectives predicted, none in TTNN")
        m = c.metrics
        if m:
            lines.append(
                f"  TTNN: {c.local_slices} local slices (mesh_partition); perf metrics: {m['total_flops']:.3g} FLOPs "
                f"per chip, {m['total_ops']:.0f} ops ({m['spilled_percentage']:.0f}% spilled to DRAM)"
            )
        if c.parameter_arguments or c.gathered_per_use:
            lines.append(
                f"  {c.parameter_arguments} parameter arguments handed over as parameters (tt-mlir computes what"
                " depends on them alone once)"
                + (f"; {len(c.gathered_per_use)} the plan gathers per use left as inputs" if c.gathered_per_use else "")
            )
        lines.extend(_format_parts(c.parts))
        lines.extend(_format_kernels(c))
        lines.extend(_format_scores(c))
        lines.extend(_format_pin_costs(c))
        if c.memory is not None:
            mem = c.memory
            vs = f"; planner's estimate {c.planned_bytes / 2**20:.2f} MiB" if c.planned_bytes else ""
            lines.append(
                f"  DRAM per chip (TTNN): peak {mem.peak_bytes / 2**20:.2f} MiB at {mem.peak_op} "
                f"({mem.peak_logical_bytes / 2**20:.2f} MiB of data, x{mem.tile_padding:.1f} in 32x32 tiles){vs}"
            )
        lines.append("  " + ("as predicted" if c.as_predicted else "NOT as predicted"))
    return "\n".join(lines)


def _format_stand_in(c: ProgramCheck) -> list[str]:
    """Where the chips' kernels were JIT-built from grafted sources: a compile-only stand-in (`ProgramCheck.stand_in`)."""
    s = c.stand_in
    if s is None:
        return []
    declared = f"; declared without code: {', '.join(s.declared_only)}" if s.declared_only else ""
    return [
        f"  COMPILE-ONLY STAND-IN: {s.chips} kernels JIT-built from {s.sources}'s sources with the {s.multilib} "
        f"multilib pointed at {s.multilib_from}{declared} (never to be run)"
    ]


def _format_pin_costs(c: ProgramCheck) -> list[str]:
    """Per part, what the pinned program has beyond the unannotated one, and whether the reshards explain it."""
    if c.unannotated_error:
        return [f"  pins vs unannotated: no comparison: {c.unannotated_error}"]
    out = []
    for p in c.pin_costs:
        diffs = [
            f"{k.removeprefix('ttnn.')} {a} (unannotated {b})"
            for k, (a, b) in {**p.kernels, **p.moves}.items()
            if a != b
        ]
        if not diffs:
            continue
        why = (
            f"{sum(p.moves_at_reshards.values())} moves the reshards need, "
            f"{p.matmuls_before_reductions} matmuls reduced before their bias"
        )
        verdict = f"UNEXPLAINED {p.unexplained}" if p.unexplained else "explained by the reshards"
        out.append(f"  pins vs unannotated, {p.part}: {', '.join(diffs)}; {why}: {verdict}")
    if c.pin_costs and not out:
        out.append("  pins vs unannotated: the same fused kernels and moves in every part")
    return out


def _format_scores(c: ProgramCheck) -> list[str]:
    """One line per kind of score matrix found: its type, how many, and whether it refuses the program."""
    seen: dict[tuple, int] = {}
    for x in c.score_matrices:
        key = (x.type, x.op, x.bytes, x.lq, x.lk, x in c.unfused_scores, x.kind)
        seen[key] = seen.get(key, 0) + 1
    out = []
    for (kind, op, nbytes, lq, lk, refused, role), n in seen.items():
        verdict = (
            "REFUSED: handed over as fused attention, priced as one kernel that never writes it"
            + (f" (compiled at level 0: {c.level_0_because})" if c.level_0_because else "")
            if refused
            else "priced by the planner (its memory holds the scores)"
            if c.scores_priced
            else "not handed over as fused attention (fp32, fused_ops off, or a program whose every argument "
            "and result is whole: the program's fused_sites say why)"
        )
        out.append(
            f"  {n} x {'score matrix' if role == 'scores' else 'L_q x L_k mask'} {kind} ({op}, "
            f"{nbytes / 2**20:.2f} MiB per chip) of an attention with "
            f"L_q {lq}, L_k {lk}: {verdict}"
        )
    return out


def _ops(ops: Mapping[str, int], top: int = 8) -> str:
    shown = sorted(((n, k) for k, n in ops.items() if k != "ttnn.deallocate"), reverse=True)
    head = ", ".join(f"{k.removeprefix('ttnn.')} {n}" for n, k in shown[:top])
    return f"{sum(ops.values())} ops: {head}" + (", ..." if len(shown) > top else "")


def _format_parts(by_part) -> list[str]:
    """The per-part histogram: identical blocks once, with their count."""
    out, k = [], 0
    while k < len(by_part):
        name, ops = by_part[k]
        same = 1
        while name not in (PROLOGUE, EPILOGUE) and k + same < len(by_part) and by_part[k + same][1] == ops:
            same += 1
        label = name if same == 1 else f"{name}..{by_part[k + same - 1][0]} (each)"
        out.append(f"  TTNN {label}: {_ops(ops)}")
        k += same
    return out


def _kernels(k) -> str:
    return f"{k.total} ({', '.join(f'{n} {v}' for n, v in k.to_json().items() if n != 'total' and v)})"


def _format_kernels(c: ProgramCheck) -> list[str]:
    """Per block, the kernels it runs per call as compiled and as the planner counts them; identical blocks once."""
    out, last = [], None
    for name, compiled, predicted in c.kernels:
        if (compiled, predicted) == last:
            continue
        last = (compiled, predicted)
        vs = "" if predicted is None else f"; predicted {_kernels(predicted)}"
        out.append(f"  kernels per call, {name}: TTNN {_kernels(compiled)}{vs}")
    if c.kernel_error is not None:
        out.append(f"  kernels per block: predicted within {100 * c.kernel_error:.1f}% of TTNN")
    return out
