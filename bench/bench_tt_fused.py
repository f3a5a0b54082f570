"""The tiny DiTs through tt-mlir as pipelines load them (bf16): fused attention, norms and GELU per block,
for the auto plan at its smallest budget and tt-xla's hand plan, on a Blackhole 2x4 and a Galaxy 8x4.

Each row is one ``wancompile tt-check --dtype bfloat16 --rewrites all --unannotated`` in its own process
(the virtual device count is fixed per process): the model's call compiled on CPU with ``target="tt-mlir"``
(numerics against eager fp32, beside eager bf16's own error), then its main program compiled by tt-mlir
for the system, read back per block (`wancompile.tt.parts`), and compiled once more with its plan taken out
(what the pins cost). Columns: the model (``tiny``: T2V; ``wan-i2v``, ``wan-ti2v``: `wancompile.models.FAMILIES`)
and plan; the system; the optimization level; per block (the same in every block unless two values are
shown) the TTNN kernels ``scaled_dot_product_attention`` / ``softmax`` / ``layer_norm`` / ``rms_norm`` /
``gelu`` / ``rotary_embedding`` (the `rope` rewrite's form for tt-mlir), and every kernel a block runs each call (all but ``deallocate`` and the const-eval loads, with its
``to_layout`` copies in brackets) and the planner's count of them (`planner.ttnn_kernels`, its largest error over
the blocks in brackets) and, for the block it misses most, both class by class; the parameters handed over as parameters (tt-mlir computes what depends
on them alone once) and those the plan gathers per use; score matrices in the program; TTNN's collectives against the plan's; the pins against the
unannotated program (per block: fusions lost or moves added that no reshard explains); PCC against eager
fp32 (eager bf16's in brackets); compile seconds.

    PYTHONPATH=. python bench/bench_tt_fused.py [--write]

(about 10 minutes on 2 cores.)
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODELS = ("tiny", "wan-i2v", "wan-ti2v")
PLANS = (("auto, smallest budget", ["--tightest"]), ("tt-xla", ["--plan", "tt-xla"]))
SYSTEMS = (("2x4", "bh-2x4"), ("8x4", "bh-galaxy"))
KERNELS = ("scaled_dot_product_attention", "softmax", "layer_norm", "rms_norm", "gelu", "rotary_embedding")


def _per_block(blocks: list[dict], op: str) -> str:
    counts = sorted({b.get(f"ttnn.{op}", 0) for b in blocks})
    return "-".join(map(str, counts))


def _kernels_per_call(ops: dict) -> int:
    """The ops a block runs every call: not the deallocations, not the const-eval results it loads."""
    return sum(n for op, n in ops.items() if op not in ("ttnn.deallocate", "ttcore.load_cached"))


def _by_class(m: dict) -> str:
    """The block the count misses most, class by class: TTNN's kernels vs the planner's."""
    counted = [k for k in m["kernels_by_block"] if k["predicted"]]
    if not counted:
        return "-"
    worst = max(counted, key=lambda k: abs(k["predicted"]["total"] - k["compiled"]["total"]))
    classes = ("fused", "matmul", "eltwise", "typecast", "move", "collective")
    return " vs ".join("/".join(str(worst[side][c]) for c in classes) for side in ("compiled", "predicted"))


def row(model: str, plan: str, flags: list[str], mesh: str, system: str) -> str:
    from _tt_check import tt_check

    args = ["--model", model, *flags, "--dtype", "bfloat16", "--rewrites", "all", "--unannotated"]
    r = tt_check(mesh, [*args, "--system", system])
    head = f"| {model} | {plan} | {system} ({mesh}) |"
    if "failed" in r:
        return f"{head} **failed**: {r['failed']} | | | | | | | | | | |"
    m = next(p for p in r["programs"] if ".fold" not in p["program"])
    if not m["compiled"]:
        return f"{head} **refused**: {m['error']} | | | | | | | | | | |"
    blocks = [p["ops"] for p in m["ttnn_ops_by_part"] if p["part"].startswith("blocks.")]
    kernels = " / ".join(_per_block(blocks, k) for k in KERNELS)
    per_call = "-".join(map(str, sorted({_kernels_per_call(b) for b in blocks})))
    predicted = "-".join(map(str, sorted({k["predicted"]["total"] for k in m["kernels_by_block"] if k["predicted"]})))
    error = "" if m["kernel_error"] is None else f" ({100 * m['kernel_error']:.1f}%)"
    kernels += (
        f" | {per_call} ({_per_block(blocks, 'to_layout')}) | {predicted or '-'}{error} | {_by_class(m)}"
        f" | {m['parameter_arguments']} / {len(m['gathered_per_use'])}"
    )
    same = all(c["predicted_count"] == c["ttnn_count"] for c in m["collectives"])
    total = sum(c["ttnn_count"] for c in m["collectives"])
    found = "; ".join(f"{c['part']}: {c['unexplained']}" for c in m["pin_costs"] if c["unexplained"])
    if m["unannotated_error"]:
        pins = f"no comparison: {m['unannotated_error']}"
    else:
        pins = ("blocks clean" if m["pins_clean"] else "**blocks not clean**") + (f" ({found})" if found else "")
    return (
        f"{head} {m['options'].get('optimization_level')} | {kernels} | {len(m['score_matrices'])} | "
        f"{total} ({'== predicted' if same else '**differs**'}) | {pins} | "
        f"{r['pcc']:.6f} ({r['eager_pcc']:.6f}) | {m['seconds']:.0f} |"
    )


def main() -> None:
    print(
        "| model | plan | system | level | per block: SDPA / softmax / LayerNorm / RMSNorm / GELU / RoPE "
        "| kernels per block per call (to_layout) | planner's count (error) "
        "| by class, TTNN vs planner: fused/matmul/eltwise/typecast/move/collective "
        "| parameters marked / gathered per use | score matrices "
        "| TTNN collectives | pins vs unannotated | PCC vs eager fp32 (eager bf16) | compile, s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for model in MODELS:
        for plan, flags in PLANS:
            for mesh, system in SYSTEMS:
                print(row(model, plan, flags, mesh, system), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "bench"))
    from _docs import main_writing

    main_writing(main, "tt-fused.md", "The tiny DiTs through tt-mlir in bf16: fused kernels per block")
