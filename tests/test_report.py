"""plan.md goldens, the per-block bill, plan.schema.json, and plan.html's structure.

Regenerate the goldens after a deliberate change (planner tuning changes the auto plan's numbers):

    EXPECTTEST_ACCEPT=1 python -m pytest tests/test_report.py

The auto golden is `wancompile plan --model tiny --mesh 2x4 --hardware wh-loudbox --resolution tiny
--frames 9 --memory-gb 0.00025`: the tiny DiT is launch-bound, so only a memory budget makes the
planner shard it (SP, Megatron, FSDP and a replicated embedder in one plan). The hand golden is
the tt-xla plan of seed 000, whose per-block bill is the seed's "5 big + 4 small" with SP.
"""

import json
import re
from html.parser import HTMLParser

import pytest
from expecttest import assert_expected_inline

TINY = ["--model", "tiny", "--mesh", "2x4", "--hardware", "wh-loudbox", "--resolution", "tiny", "--frames", "9"]


ASCII = str.maketrans({"×": "x", "—": "--", "µ": "u", "Δ": "delta", "·": ".", "→": "->", "%": "%"})


def stable(md: str) -> str:
    """plan.md without what changes run to run (solver wall time), in ASCII (expecttest writes
    printable ASCII only: × -> x, — -> --, µ -> u, Δ -> delta)."""
    return re.sub(r"in \d+\.\d+ s", "in <t> s", md).translate(ASCII)


@pytest.fixture(scope="module")
def auto_dir(tmp_path_factory):
    from wancompile.cli import main

    out = tmp_path_factory.mktemp("auto")
    assert main(["plan", *TINY, "--memory-gb", "0.00025", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def hand_dir(tmp_path_factory):
    from wancompile.cli import main

    out = tmp_path_factory.mktemp("hand")
    assert main(["plan", *TINY, "--hand", "tt-xla", "--out", str(out)]) == 0
    return out


def section(md: str, title: str) -> str:
    start = md.index(f"## {title}")
    end = md.find("\n## ", start + 1)
    return md[start : end if end > 0 else len(md)].strip()


def test_hand_plan_block_table_and_bill_are_the_seeds(hand_dir):
    md = (hand_dir / "plan.md").read_text()
    assert (
        "| collectives per block | 5 big + 4 small (2 all-gather on batch, 3 all-reduce on model; small: 4 all-reduce on model) |"
        in md
    )
    assert_expected_inline(
        stable(section(md, "One block")),
        """\
## One block, op by op (`blocks.*`, x2)

State = global shape and layout, one placement per mesh axis (batch, model): `S(d)` split on dim d, `R` replicated, `P(sum)` partial sums (`[d: a>b]`: dim d split over a then b, against the mesh order). us = predicted compute + collectives of the op, per block.

| op | weights | state in | state out | constraint | collective | bytes | us |
|---|---|---|---|---|---|---|---|
| `blocks.*.norm1:layer_norm#0` | -- | 1 x 64 x 64 (S(1), R) | 1 x 64 x 64 (S(1), R) | -- | -- | -- | 2.3 |
| `blocks.*.attn1:flatten#2` | -- | 4 x 48 x 64 (R, S(0)) | 192 x 64 (R, S(0)) | `(R, S(0))` | -- | -- | 0.0 |
| `blocks.*.attn1:flatten#5` | -- | 4 x 48 (R, S(0)) | 192 (R, S(0)) | `(R, S(0))` | -- | -- | 0.0 |
| `blocks.*.attn1:linear#0` | -- | 1 x 64 x 64 (S(1), R)<br>192 x 64 (R, S(0))<br>192 (R, S(0)) | 1 x 64 x 192 (S(1), S(2)) | `(S(1), S(2))` | -- | -- | 2.3 |
| `blocks.*.attn1.norm_q:rms_norm#0` | -- | 1 x 64 x 64 (S(1), S(2))<br>64 (R, R) | 1 x 64 x 64 (S(1), S(2)) | -- | all-reduce on model | 128 B | 28.9 |
| `blocks.*.attn1.norm_k:rms_norm#0` | -- | 1 x 64 x 64 (S(1), S(2))<br>64 (R, R) | 1 x 64 x 64 (S(1), S(2)) | -- | all-reduce on model | 128 B | 28.9 |
| `blocks.*.attn1:transpose#5` | -- | 1 x 64 x 1 x 8 (R, R) | 1 x 1 x 64 x 8 (R, R) | `(R, R)` | -- | -- | 0.0 |
| `blocks.*.attn1:transpose#6` | -- | 1 x 64 x 1 x 8 (R, R) | 1 x 1 x 64 x 8 (R, R) | `(R, R)` | -- | -- | 0.0 |
| `blocks.*.attn1:cat#2` | -- | 1 x 1 x 64 x 8 (R, R) | 1 x 1 x 64 x 16 (R, R) | `(R, R)` | -- | -- | 0.0 |
| `blocks.*.attn1:cat#3` | -- | 1 x 1 x 64 x 8 (R, R) | 1 x 1 x 64 x 16 (R, R) | `(R, R)` | -- | -- | 0.0 |
| `blocks.*.attn1:transpose#9` | -- | 1 x 64 x 1 x 8 (R, R) | 1 x 1 x 64 x 8 (R, R) | `(R, R)` | -- | -- | 0.0 |
| `blocks.*.attn1:transpose#10` | -- | 1 x 64 x 1 x 8 (R, R) | 1 x 1 x 64 x 8 (R, R) | `(R, R)` | -- | -- | 0.0 |
| `blocks.*.attn1:cat#5` | -- | 1 x 1 x 64 x 8 (R, R) | 1 x 1 x 64 x 16 (R, R) | `(R, R)` | -- | -- | 0.0 |
| `blocks.*.attn1:cat#6` | -- | 1 x 1 x 64 x 8 (R, R) | 1 x 1 x 64 x 16 (R, R) | `(R, R)` | -- | -- | 0.0 |
| `blocks.*.attn1:getitem#8` | -- | 1 x 4 x 64 x 16 (S(2), S(1)) | 1 x 4 x 48 x 16 (R, S(1)) | `(R, S(1))` | all-gather on batch | 2.0 KiB | 7.3 |
| `blocks.*.attn1:getitem#9` | -- | 1 x 4 x 64 x 16 (S(2), S(1)) | 1 x 4 x 48 x 16 (R, S(1)) | `(R, S(1))` | all-gather on batch | 2.0 KiB | 7.3 |
| `blocks.*.attn1:scaled_dot_product_attention#0` | -- | 1 x 4 x 64 x 16 (S(2), S(1))<br>1 x 4 x 48 x 16 (R, S(1)) | 1 x 4 x 64 x 16 (S(2), S(1)) | -- | -- | -- | 2.2 |
| `blocks.*.attn1.to_out.0:linear#0` | weight (R, S(1)); bias (R, R) | 1 x 64 x 64 (S(1), S(2)) | 1 x 64 x 64 (S(1), R) | `(S(1), R)` | all-reduce on model | 4.0 KiB | 34.6 |
| `blocks.*.norm2:layer_norm#0` | -- | 1 x 64 x 64 (S(1), R)<br>64 (R, R) | 1 x 64 x 64 (S(1), R) | -- | -- | -- | 2.3 |
| `blocks.*.attn2.to_q:linear#0` | weight (R, S(0)); bias (R, S(0)) | 1 x 64 x 64 (S(1), R) | 1 x 64 x 64 (S(1), S(2)) | `(S(1), S(2))` | -- | -- | 2.3 |
| `blocks.*.attn2:flatten#0` | -- | 4 x 32 x 64 (R, S(0)) | 128 x 64 (R, S(0)) | `(R, S(0))` | -- | -- | 0.0 |
| `blocks.*.attn2:flatten#1` | -- | 4 x 32 (R, S(0)) | 128 (R, S(0)) | `(R, S(0))` | -- | -- | 0.0 |
| `blocks.*.attn2:linear#0` | -- | 1 x 7 x 64 (R, R)<br>128 x 64 (R, S(0))<br>128 (R, S(0)) | 1 x 7 x 128 (R, S(2)) | `(R, S(2))` | -- | -- | 2.2 |
| `blocks.*.attn2.norm_q:rms_norm#0` | weight (R, S(0)) | 1 x 64 x 64 (S(1), S(2)) | 1 x 64 x 64 (S(1), S(2)) | -- | all-reduce on model | 128 B | 28.9 |
| `blocks.*.attn2.norm_k:rms_norm#0` | weight (R, S(0)) | 1 x 7 x 64 (R, S(2)) | 1 x 7 x 64 (R, S(2)) | -- | all-reduce on model | 28 B | 28.8 |
| `blocks.*.attn2:scaled_dot_product_attention#0` | -- | 1 x 4 x 64 x 16 (S(2), S(1))<br>1 x 4 x 7 x 16 (R, S(1)) | 1 x 4 x 64 x 16 (S(2), S(1)) | -- | -- | -- | 2.2 |
| `blocks.*.attn2.to_out.0:linear#0` | weight (R, S(1)); bias (R, R) | 1 x 64 x 64 (S(1), S(2)) | 1 x 64 x 64 (S(1), R) | `(S(1), R)` | all-reduce on model | 4.0 KiB | 34.6 |
| `blocks.*.norm3:layer_norm#0` | -- | 1 x 64 x 64 (S(1), R) | 1 x 64 x 64 (S(1), R) | -- | -- | -- | 2.3 |
| `blocks.*.ffn.net.0.proj:linear#0` | weight (R, S(0)); bias (R, S(0)) | 1 x 64 x 64 (S(1), R) | 1 x 64 x 96 (S(1), S(2)) | `(S(1), S(2))` | -- | -- | 2.3 |
| `blocks.*.ffn.net.2:linear#0` | weight (R, S(1)); bias (R, R) | 1 x 64 x 96 (S(1), S(2)) | 1 x 64 x 64 (S(1), R) | `(S(1), R)` | all-reduce on model | 4.0 KiB | 34.6 |

Block total: 364.2 us (compute 146.0 us + comm 218.2 us) x 2 blocks = 0.728 ms per forward.

**Collective bill per block: 5 big + 4 small**

| collective | axes | bytes per call | per block | size | where |
|---|---|---|---|---|---|
| all-reduce | model | 128 B | 1 | small | blocks.*.attn1.norm_k:rms_norm#0 |
| all-reduce | model | 128 B | 1 | small | blocks.*.attn1.norm_q:rms_norm#0 |
| all-reduce | model | 4.0 KiB | 1 | big | blocks.*.attn1.to_out.0:linear#0 |
| all-gather | batch | 2.0 KiB | 1 | big | blocks.*.attn1:getitem#8 |
| all-gather | batch | 2.0 KiB | 1 | big | blocks.*.attn1:getitem#9 |
| all-reduce | model | 28 B | 1 | small | blocks.*.attn2.norm_k:rms_norm#0 |
| all-reduce | model | 128 B | 1 | small | blocks.*.attn2.norm_q:rms_norm#0 |
| all-reduce | model | 4.0 KiB | 1 | big | blocks.*.attn2.to_out.0:linear#0 |
| all-reduce | model | 4.0 KiB | 1 | big | blocks.*.ffn.net.2:linear#0 |""",
    )


def test_auto_plan_md_golden(auto_dir):
    assert_expected_inline(
        stable((auto_dir / "plan.md").read_text()),
        """\
# Sharding plan: tiny on 2x4 (batch, model)

| plan | value |
|---|---|
| model | tiny -- 2 blocks, 64 tokens per forward |
| mesh | 2x4 = 8 devices; axes batch (2) x model (4) |
| hardware | wh-loudbox: Wormhole LoudBox/T3000: 2x4 mesh of 4 n300s, 1 link per direction (H, I, J) |
| solver | OPTIMAL in <t> s, gap 0.00%, objective 0.602 ms, 488 variables, 211 constraints |
| predicted per forward | 0.602 ms = compute 0.369 ms (61 %) + comm 0.233 ms (39 %), no overlap assumed |
| roofline | 2.35 MFLOP per device per forward; at 128 TFLOP/s x 40% that is 0.0459 us, so compute is 8046.7x its FLOP bound (memory-bound ops and launch floors make up the rest) |
| memory per device | 0.000241 GB of 12 GB (0.0 %): weights + 3x the largest live activation set |
| weight sets | 1 resident per device (the memory budget holds 1x the weights) |
| parallelism | SP: tokens over model (4); TP: attention heads over batch (2) |
| collectives per block | 5.50 big + 2 small (3.50 all-gather on model, 2 all-reduce on batch; small: 2 all-reduce on batch) |
| parameters | 71 (24 sharded); 50 activation constraints |

## Decisions

| where | chosen | plan with it, ms/forward | best rejected | best plan without it | delta |
|---|---|---|---|---|---|
| blocks.*.attn1 (x2) | **head-TP(batch)+SP(model)** | 0.602 | head-TP(batch)+SP(model)+FSDP | 0.622 | +0.020 ms |
| blocks.*.attn2 (x2) | **SP(model)** (+FSDP on block 1) | 0.602 | SP(model)+FSDP | 0.611 | +0.009 ms |
| blocks.*.ffn (x2) | **Megatron(batch)+SP(model)** | 0.602 | SP(model) | 0.611 | +0.009 ms |
| condition_embedder.time_embedder | **replicated** | 0.602 | Megatron(batch) | 0.617 | +0.015 ms |
| condition_embedder.text_embedder | **replicated** | 0.602 | Megatron(batch) | 0.617 | +0.016 ms |

## One block, op by op (`blocks.*`, x2)

State = global shape and layout, one placement per mesh axis (batch, model): `S(d)` split on dim d, `R` replicated, `P(sum)` partial sums (`[d: a>b]`: dim d split over a then b, against the mesh order). us = predicted compute + collectives of the op, per block.

| op | weights | state in | state out | constraint | collective | bytes | us |
|---|---|---|---|---|---|---|---|
| `blocks.*.norm1:layer_norm#0` | -- | 1 x 64 x 64 (R, S(1)) | 1 x 64 x 64 (R, S(1)) | -- | -- | -- | 2.3 |
| `blocks.*.attn1:flatten#2` | -- | 4 x 48 x 64 (S(0), R) | 192 x 64 (S(0), R) | `(S(0), R)` | -- | -- | 0.0 |
| `blocks.*.attn1:flatten#5` | -- | 4 x 48 (S(0), R) | 192 (S(0), R) | `(S(0), R)` | -- | -- | 0.0 |
| `blocks.*.attn1:linear#0` | -- | 1 x 64 x 64 (R, S(1))<br>192 x 64 (S(0), R)<br>192 (S(0), R) | 1 x 64 x 192 (S(2), S(1)) | `(S(2), S(1))` | -- | -- | 2.4 |
| `blocks.*.attn1.norm_q:rms_norm#0` | -- | 1 x 64 x 64 (S(2), S(1))<br>64 (R, R) | 1 x 64 x 64 (S(2), S(1)) | -- | all-reduce on batch | 64 B | 17.2 |
| `blocks.*.attn1.norm_k:rms_norm#0` | -- | 1 x 64 x 64 (S(2), S(1))<br>64 (R, R) | 1 x 64 x 64 (S(2), S(1)) | -- | all-reduce on batch | 64 B | 17.2 |
| `blocks.*.attn1:transpose#5` | -- | 1 x 64 x 1 x 8 (R, R) | 1 x 1 x 64 x 8 (R, R) | `(R, R)` | -- | -- | 0.0 |
| `blocks.*.attn1:transpose#6` | -- | 1 x 64 x 1 x 8 (R, R) | 1 x 1 x 64 x 8 (R, R) | `(R, R)` | -- | -- | 0.0 |
| `blocks.*.attn1:cat#2` | -- | 1 x 1 x 64 x 8 (R, R) | 1 x 1 x 64 x 16 (R, R) | `(R, R)` | -- | -- | 0.0 |
| `blocks.*.attn1:cat#3` | -- | 1 x 1 x 64 x 8 (R, R) | 1 x 1 x 64 x 16 (R, R) | `(R, R)` | -- | -- | 0.0 |
| `blocks.*.attn1:transpose#9` | -- | 1 x 64 x 1 x 8 (R, R) | 1 x 1 x 64 x 8 (R, R) | `(R, R)` | -- | -- | 0.0 |
| `blocks.*.attn1:transpose#10` | -- | 1 x 64 x 1 x 8 (R, R) | 1 x 1 x 64 x 8 (R, R) | `(R, R)` | -- | -- | 0.0 |
| `blocks.*.attn1:cat#5` | -- | 1 x 1 x 64 x 8 (R, R) | 1 x 1 x 64 x 16 (R, R) | `(R, R)` | -- | -- | 0.0 |
| `blocks.*.attn1:cat#6` | -- | 1 x 1 x 64 x 8 (R, R) | 1 x 1 x 64 x 16 (R, R) | `(R, R)` | -- | -- | 0.0 |
| `blocks.*.attn1:getitem#8` | -- | 1 x 4 x 64 x 16 (S(1), S(2)) | 1 x 4 x 48 x 16 (S(1), R) | `(S(1), R)` | all-gather on model | 4.0 KiB | 12.9 |
| `blocks.*.attn1:getitem#9` | -- | 1 x 4 x 64 x 16 (S(1), S(2)) | 1 x 4 x 48 x 16 (S(1), R) | `(S(1), R)` | all-gather on model | 4.0 KiB | 12.9 |
| `blocks.*.attn1:scaled_dot_product_attention#0` | -- | 1 x 4 x 64 x 16 (S(1), S(2))<br>1 x 4 x 48 x 16 (S(1), R) | 1 x 4 x 64 x 16 (S(1), S(2)) | -- | -- | -- | 2.3 |
| `blocks.*.attn1.to_out.0:linear#0` | weight (S(1), R); bias (R, R) | 1 x 64 x 64 (S(2), S(1)) | 1 x 64 x 64 (R, S(1)) | `(R, S(1))` | all-reduce on batch | 2.0 KiB | 19.1 |
| `blocks.*.norm2:layer_norm#0` | -- | 1 x 64 x 64 (R, S(1))<br>64 (R, R) | 1 x 64 x 64 (R, S(1)) | -- | -- | -- | 2.3 |
| `blocks.*.attn2.to_q:linear#0` | weight (R, R); bias (R, R) | 1 x 64 x 64 (R, S(1)) | 1 x 64 x 64 (R, S(1)) | -- | -- | -- | 2.3 |
| `blocks.*.attn2:flatten#0` | -- | 4 x 32 x 64 (R, R) | 128 x 64 (R, R) | `(R, R)` | -- | -- | 0.0 |
| `blocks.*.attn2:flatten#1` | -- | 4 x 32 (R, R) | 128 (R, R) | `(R, R)` | -- | -- | 0.0 |
| `blocks.*.attn2:linear#0` | -- | 1 x 7 x 64 (R, R)<br>128 x 64 (R, R)<br>128 (R, R) | 1 x 7 x 128 (R, R) | -- | -- | -- | 2.4 |
| `blocks.*.attn2.norm_q:rms_norm#0` | weight (R, R) | 1 x 64 x 64 (R, S(1)) | 1 x 64 x 64 (R, S(1)) | -- | -- | -- | 2.2 |
| `blocks.*.attn2.norm_k:rms_norm#0` | weight (R, R) | 1 x 7 x 64 (R, R) | 1 x 7 x 64 (R, R) | -- | -- | -- | 2.2 |
| `blocks.*.attn2:scaled_dot_product_attention#0` | -- | 1 x 4 x 64 x 16 (R, S(2))<br>1 x 4 x 7 x 16 (R, R) | 1 x 4 x 64 x 16 (R, S(2)) | -- | -- | -- | 2.3 |
| `blocks.*.attn2.to_out.0:linear#0` | weight (R, R); bias (R, R) | 1 x 64 x 64 (R, S(1)) | 1 x 64 x 64 (R, S(1)) | -- | -- | -- | 2.3 |
| `blocks.*.norm3:layer_norm#0` | -- | 1 x 64 x 64 (R, S(1)) | 1 x 64 x 64 (R, S(1)) | -- | -- | -- | 2.3 |
| `blocks.*.ffn.net.0.proj:linear#0` | weight (S(0), R); bias (S(0), R) | 1 x 64 x 64 (R, S(1)) | 1 x 64 x 96 (S(2), S(1)) | `(S(2), S(1))` | -- | -- | 2.3 |
| `blocks.*.ffn.net.2:linear#0` | weight (S(1), R); bias (R, R) | 1 x 64 x 96 (S(2), S(1)) | 1 x 64 x 64 (R, S(1)) | `(R, S(1))` | all-reduce on batch | 2.0 KiB | 19.1 |

Block total: 233.5 us (compute 144.3 us + comm 89.3 us) x 2 blocks = 0.467 ms per forward.

**Collective bill per block: 5.50 big + 2 small**

| collective | axes | bytes per call | per block | size | where |
|---|---|---|---|---|---|
| all-reduce | batch | 64 B | 1 | small | blocks.*.attn1.norm_k:rms_norm#0 |
| all-reduce | batch | 64 B | 1 | small | blocks.*.attn1.norm_q:rms_norm#0 |
| all-reduce | batch | 2.0 KiB | 1 | big | blocks.*.attn1.to_out.0:linear#0 |
| all-gather | model | 4.0 KiB | 1 | big | blocks.*.attn1:getitem#8 |
| all-gather | model | 4.0 KiB | 1 | big | blocks.*.attn1:getitem#9 |
| all-gather | model | 8.0 KiB | 0.5 | big | blocks.*.attn2.to_out.0:linear#0 |
| all-gather | model | 8.0 KiB | 0.5 | big | blocks.*.attn2.to_q:linear#0 |
| all-gather | model | 1.8 KiB | 0.5 | big | blocks.*.attn2:linear#0 |
| all-reduce | batch | 2.0 KiB | 1 | big | blocks.*.ffn.net.2:linear#0 |

## Once per forward (before and after the block stack)

| op | weights | state in | state out | constraint | collective | bytes | us |
|---|---|---|---|---|---|---|---|
| `rope:reshape#0` | -- | 3 x 4 x 4 x 16 (R, R) | 1 x 48 x 1 x 16 (R, R) | `(R, R)` | -- | -- | 0.0 |
| `rope:pad#0` | -- | 1 x 48 x 1 x 16 (R, R) | 1 x 64 x 1 x 16 (R, R) | `(R, R)` | -- | -- | 2.2 |
| `rope:reshape#1` | -- | 3 x 4 x 4 x 16 (R, R) | 1 x 48 x 1 x 16 (R, R) | `(R, R)` | -- | -- | 0.0 |
| `rope:pad#1` | -- | 1 x 48 x 1 x 16 (R, R) | 1 x 64 x 1 x 16 (R, R) | `(R, R)` | -- | -- | 2.2 |
| `:contiguous#0` | -- | 1 x 48 x 64 (R, R) | 1 x 48 x 64 (R, R) | `(R, R)` | -- | -- | 2.3 |
| `:pad#0` | -- | 1 x 48 x 64 (R, R) | 1 x 64 x 64 (R, S(1)) | `(R, S(1))` | -- | -- | 2.3 |
| `condition_embedder:type_as#0` | -- | 1 x 64 (R, R)<br>1 x 7 x 32 (R, R) | 1 x 64 (R, R) | `(R, R)` | -- | -- | 2.2 |
| `condition_embedder.text_embedder.linear_2:linear#0` | weight (R, R); bias (R, R) | 1 x 7 x 64 (R, R) | 1 x 7 x 64 (R, R) | `(R, R)` | -- | -- | 2.3 |
| `:unflatten#0` | -- | 1 x 384 (R, R) | 1 x 6 x 64 (R, R) | `(R, R)` | -- | -- | 0.0 |
| `proj_out:linear#0` | weight (R, R); bias (R, R) | 1 x 64 x 64 (R, S(1)) | 1 x 64 x 16 (R, R) | `(R, R)` | all-gather on model | 2.0 KiB | 13.8 |
| `proj_out:getitem#0` | -- | 1 x 64 x 16 (R, R) | 1 x 48 x 16 (R, R) | `(R, R)` | -- | -- | 0.0 |

Prologue 51.7 us, epilogue 40.7 us (compute + comm).

## Predicted collectives per forward

| collective | axes | bytes per call | calls | us per call | where |
|---|---|---|---|---|---|
| all-reduce | batch | 64 B | 2 | 15.0 | blocks.*.attn1.norm_k:rms_norm#0 |
| all-reduce | batch | 64 B | 2 | 15.0 | blocks.*.attn1.norm_q:rms_norm#0 |
| all-reduce | batch | 2.0 KiB | 2 | 16.8 | blocks.*.attn1.to_out.0:linear#0 |
| all-gather | model | 4.0 KiB | 2 | 12.9 | blocks.*.attn1:getitem#8 |
| all-gather | model | 4.0 KiB | 2 | 12.9 | blocks.*.attn1:getitem#9 |
| all-gather | model | 8.0 KiB | 1 | 15.5 | blocks.*.attn2.to_out.0:linear#0 |
| all-gather | model | 8.0 KiB | 1 | 15.5 | blocks.*.attn2.to_q:linear#0 |
| all-gather | model | 1.8 KiB | 1 | 11.4 | blocks.*.attn2:linear#0 |
| all-reduce | batch | 2.0 KiB | 2 | 16.8 | blocks.*.ffn.net.2:linear#0 |
| all-gather | model | 2.0 KiB | 1 | 11.5 | proj_out:linear#0 |

## Why

### blocks.*.attn1 (x2): head-TP(batch)+SP(model)

- **chosen** `head-TP(batch)+SP(model)` (stream `(R, S(1))`, STATE A): the best plan with it costs 0.602 ms per forward; 0.00 GB weights/device
- **best rejected** `head-TP(batch)+SP(model)+FSDP`: the best plan with it instead costs 0.622 ms per forward (+0.020 ms)
- other options priced: `replicated` 0.198 ms, `SP(batch)+KV-gather` 0.239 ms, `Ulysses(batch)` 0.263 ms, `SP(model)+KV-gather` 0.263 ms, `SP(batch)+KV-gather+FSDP` 0.293 ms, `Ulysses(model)` 0.298 ms, `head-TP(batch)` 0.301 ms, `SP(batchxmodel)+KV-gather` 0.304 ms, `head-TP(batch)+seq(batch)` 0.325 ms, `SP(model)+KV-gather+FSDP` 0.347 ms, `head-TP(model)` 0.378 ms, `head-TP(batch)+SP(model)+seq(batch)` 0.380 ms, `head-TP(model)+SP(batch)` 0.398 ms, `head-TP(batch)+hidden(batch)` 0.402 ms, `Ulysses(batch+model)+pad(4->8)` 0.414 ms, `head-TP(model)+seq(model)` 0.416 ms, `SP(batchxmodel)+KV-gather+FSDP` 0.425 ms, `head-TP(model)+SP(batch)+FSDP` 0.430 ms, `head-TP(batch)+SP(model)+FSDP+seq(batch)` 0.442 ms, `head-TP(batch)+SP(model)+hidden(batch)` 0.446 ms, `head-TP(model)+SP(batch)+seq(model)` 0.463 ms, `head-TP(model)+SP(batch)+FSDP+seq(model)` 0.496 ms, `head-TP(batch)+SP(model)+FSDP+hidden(batch)` 0.509 ms, `head-TP(batchxmodel)+pad(4->8)` 0.539 ms, `head-TP(model)+hidden(model)` 0.560 ms, `head-TP(model)+SP(batch)+hidden(model)` 0.581 ms, `head-TP(batchxmodel)+seq(batchxmodel)+pad(4->8)` 0.601 ms, `head-TP(model)+SP(batch)+FSDP+hidden(model)` 0.613 ms, `Ulysses(batch+model)+pad(4->8)` 0.745 ms, `Ulysses(batch+model)+seq(batch)+pad(4->8)` 0.779 ms, `Ulysses(batch+model)+hidden(batch)+pad(4->8)` 0.846 ms, `Ulysses(model+batch)+pad(4->8)` 0.872 ms, `head-TP(batchxmodel)+hidden(batchxmodel)+pad(4->8)` 0.885 ms, `Ulysses(model+batch)+seq(model)+pad(4->8)` 0.938 ms, `Ulysses(model+batch)+hidden(model)+pad(4->8)` 1.055 ms
- excluded: head-TP over batchxmodel (8): 4 heads do not divide into 8; Ulysses over modelxbatch (8): 4 heads do not divide; Ulysses over batchxmodel (8): 4 heads do not divide
- ring attention `head-TP(batch)+SP(model)+ring` 0.377 ms per forward vs 0.345 ms chosen: it would cost 0.032 ms (4 steps of 0.6 us attention and 14.5 us K/V transfer, replacing 25.7 us of K/V all-gathers per call); not offered: no ring SDPA lowering in tt-mlir (tt-mlir #7598)
- plan total 0.602 ms per forward (head-TP(batch)+SP(model): 0.345 ms of it, x2)
- next best: head-TP(batch)+SP(model)+FSDP, plan total 0.622 ms (+0.020 ms: this macro +0.062 ms, stream-layout edges +0.000 ms, other macros -0.042 ms)
- replicated is cheaper on its own (0.198 ms) but no plan with it fits the memory budget
- collectives it implies (per call): all-reduce on batch 64 B at `blocks.*.attn1.norm_q:rms_norm#0`, all-reduce on batch 64 B at `blocks.*.attn1.norm_k:rms_norm#0`, all-gather on model 4.0 KiB at `blocks.*.attn1:getitem#8`, all-gather on model 4.0 KiB at `blocks.*.attn1:getitem#9`, all-reduce on batch 2.0 KiB at `blocks.*.attn1.to_out.0:linear#0`

### blocks.*.attn2 (x2): SP(model)

- **chosen** `SP(model)` (stream `(R, S(1))`, STATE A): the best plan with it costs 0.602 ms per forward; 0.00 GB weights/device (weights sharded for memory)
- **FSDP block range**: block 1 runs `SP(model)+FSDP` (weights also split over the SP axes, gathered per use: only as many blocks as memory needs), block 0 `SP(model)`
- **best rejected** `SP(model)+FSDP`: the best plan with it instead costs 0.611 ms per forward (+0.009 ms)
- other options priced: `SP(batchxmodel)` 0.085 ms, `SP(batch)` 0.088 ms, `replicated` 0.091 ms, `SP(batch)+FSDP` 0.142 ms, `head-TP(batch)+SP(model)` 0.179 ms, `head-TP(batch)` 0.195 ms, `head-TP(batch)+SP(model)+seq(batch)` 0.206 ms, `head-TP(batch)+seq(batch)` 0.213 ms, `head-TP(batch)+SP(model)+hidden(batch)` 0.235 ms, `head-TP(batch)+hidden(batch)` 0.250 ms, `head-TP(model)+SP(batch)` 0.258 ms, `head-TP(model)` 0.273 ms, `head-TP(batch)+SP(model)+FSDP` 0.286 ms, `SP(batchxmodel)+FSDP` 0.287 ms, `head-TP(model)+seq(model)` 0.300 ms, `head-TP(model)+SP(batch)+seq(model)` 0.312 ms, `head-TP(batch)+SP(model)+FSDP+seq(batch)` 0.313 ms, `head-TP(model)+SP(batch)+FSDP` 0.318 ms, `head-TP(batch)+SP(model)+FSDP+hidden(batch)` 0.342 ms, `head-TP(model)+SP(batch)+hidden(model)` 0.360 ms, `head-TP(model)+SP(batch)+FSDP+seq(model)` 0.371 ms, `head-TP(model)+hidden(model)` 0.373 ms, `head-TP(model)+SP(batch)+FSDP+hidden(model)` 0.420 ms, `head-TP(batchxmodel)+pad(4->8)` 0.434 ms, `head-TP(batchxmodel)+seq(batchxmodel)+pad(4->8)` 0.478 ms, `head-TP(batchxmodel)+hidden(batchxmodel)+pad(4->8)` 0.627 ms
- excluded: head-TP over batchxmodel (8): 4 heads do not divide into 8
- plan total 0.602 ms per forward (SP(model): 0.086 ms of it, x2)
- next best: SP(model)+FSDP, plan total 0.611 ms (+0.009 ms: this macro +0.042 ms, stream-layout edges +0.000 ms, other macros -0.033 ms (ffn -> SP(model)))
- SP(batchxmodel) is cheaper on its own (0.085 ms) but its best plan totals 0.713 ms: this macro -0.043 ms, stream-layout edges +0.000 ms, other macros +0.154 ms (attn1 -> head-TP(model)+SP(batch)+seq(model), ffn -> SP(batchxmodel), condition_embedder.text_embedder -> Megatron(batch) to fit the memory budget)

### blocks.*.ffn (x2): Megatron(batch)+SP(model)

- **chosen** `Megatron(batch)+SP(model)` (stream `(R, S(1))`, STATE A): the best plan with it costs 0.602 ms per forward; 0.00 GB weights/device
- **best rejected** `SP(model)`: the best plan with it instead costs 0.611 ms per forward (+0.009 ms)
- other options priced: `SP(batchxmodel)` 0.081 ms, `SP(batch)` 0.084 ms, `replicated` 0.088 ms, `SP(batch)+FSDP` 0.131 ms, `Megatron(batch)` 0.133 ms, `Megatron(batch)+SP(model)+seq(batch)` 0.145 ms, `Megatron(model)+SP(batch)` 0.148 ms, `Megatron(batch)+seq(batch)` 0.149 ms, `SP(model)+FSDP` 0.155 ms, `Megatron(model)` 0.163 ms, `Megatron(batch)+SP(model)+hidden(batch)` 0.171 ms, `Megatron(batch)+SP(model)+FSDP` 0.172 ms, `Megatron(model)+SP(batch)+FSDP` 0.179 ms, `Megatron(batch)+hidden(batch)` 0.186 ms, `Megatron(model)+seq(model)` 0.189 ms, `SP(batchxmodel)+FSDP` 0.190 ms, `Megatron(batch)+SP(model)+FSDP+seq(batch)` 0.201 ms, `Megatron(model)+SP(batch)+seq(model)` 0.212 ms, `Megatron(batchxmodel)` 0.213 ms, `Megatron(batch)+SP(model)+FSDP+hidden(batch)` 0.228 ms, `Megatron(model)+SP(batch)+FSDP+seq(model)` 0.243 ms, `Megatron(model)+SP(batch)+hidden(model)` 0.249 ms, `Megatron(batchxmodel)+seq(batchxmodel)` 0.256 ms, `Megatron(model)+hidden(model)` 0.262 ms, `Megatron(model)+SP(batch)+FSDP+hidden(model)` 0.280 ms, `Megatron(batchxmodel)+hidden(batchxmodel)` 0.405 ms
- plan total 0.602 ms per forward (Megatron(batch)+SP(model): 0.115 ms of it, x2)
- next best: SP(model), plan total 0.611 ms (+0.009 ms: this macro -0.033 ms, stream-layout edges +0.000 ms, other macros +0.042 ms (attn2 -> SP(model)+FSDP to fit the memory budget))
- SP(batchxmodel) is cheaper on its own (0.081 ms) but its best plan totals 0.713 ms: this macro +0.020 ms, stream-layout edges +0.000 ms, other macros +0.091 ms (attn1 -> head-TP(model)+SP(batch)+seq(model), attn2 -> SP(batchxmodel), condition_embedder.text_embedder -> Megatron(batch))
- collectives it implies (per call): all-reduce on batch 2.0 KiB at `blocks.*.ffn.net.2:linear#0`

### condition_embedder.time_embedder: replicated

- **chosen** `replicated`: the best plan with it costs 0.602 ms per forward; 0.00 GB weights/device
- **best rejected** `Megatron(batch)`: the best plan with it instead costs 0.617 ms per forward (+0.015 ms)
- other options priced: `Megatron(model)` 0.033 ms, `Megatron(batchxmodel)` 0.057 ms
- plan total 0.602 ms per forward (replicated: 0.007 ms of it)
- next best: Megatron(batch), plan total 0.617 ms (+0.015 ms: this macro +0.015 ms, stream-layout edges +0.000 ms, other macros +0.000 ms)

### condition_embedder.text_embedder: replicated

- **chosen** `replicated`: the best plan with it costs 0.602 ms per forward; 0.00 GB weights/device
- **best rejected** `Megatron(batch)`: the best plan with it instead costs 0.617 ms per forward (+0.016 ms)
- other options priced: `Megatron(model)` 0.034 ms, `Megatron(batchxmodel)` 0.058 ms
- plan total 0.602 ms per forward (replicated: 0.007 ms of it)
- next best: Megatron(batch), plan total 0.617 ms (+0.016 ms: this macro +0.016 ms, stream-layout edges +0.000 ms, other macros +0.000 ms)

## Notes

- guard: `64 % 128 == 0 (32-token tiles per device; otherwise pad)`
- rewrite `qkv`: 4 site(s)
- rewrite `patch_embed`: 1 site(s)
- rewrite `rope`: 4 site(s)
- rewrite `sp_pad`: 2 site(s)
- planned from 2 captured block(s); block decisions shared by all 2 blocks and expanded by name (but for the FSDP block ranges)
- predicted time = compute + comm, no overlap assumed; 1 weight set(s) resident
- memory forces weight sharding: attn2 SP(model)+FSDP on block 1
""",
    )


def test_the_bill_counted_from_the_trace_matches_the_plans_prediction(hand_dir, auto_dir):
    from wancompile.report import Report

    for d in (hand_dir, auto_dir):
        rep = Report.load(d)
        n = rep.num_blocks
        # the trace is block 0's; an FSDP block range is the last blocks, so block 0 runs each macro's own
        # strategy: the range's twin gathers (k of n blocks) are the plan's only entries not on every block
        ranges = {f"blocks.*.{x.macro}": x.fsdp_blocks for x in rep.decisions() if x.fsdp_blocks}
        # the trace prices op by op, so an all-reduce whose readers keep only their slice (a copy split on
        # the reduced axis) reads as the all-reduce; the plan, seeing both ops, says reduce-scatter
        traced = {(e.axes, e.bytes, e.where) for e in rep.trace_bill().entries if e.kind == "all-reduce"}
        on_block0 = []
        for e in rep.bill().entries:
            if e.per_block != 1:
                span = next(r for scope, r in ranges.items() if e.where.startswith(scope))
                assert e.per_block * n == span[1] - span[0], e
                continue
            kind = "all-reduce" if e.kind == "reduce-scatter" and (e.axes, e.bytes, e.where) in traced else e.kind
            on_block0.append((kind, e.axes, e.bytes, e.per_block))
        trace_bill = sorted((e.kind, e.axes, e.bytes, e.per_block) for e in rep.trace_bill().entries)
        assert sorted(on_block0) == trace_bill
        if not ranges:
            assert rep.bill().headline() == rep.trace_bill().headline()


# --- schema -------------------------------------------------------------------------------------------


def test_every_dump_validates_against_the_published_schema(hand_dir, auto_dir):
    import jsonschema

    from wancompile.report.schema import errors, plan_schema

    jsonschema.Draft202012Validator.check_schema(plan_schema())
    for d in (hand_dir, auto_dir):
        data = json.loads((d / "plan.json").read_text())
        assert errors(data) == []
        jsonschema.validate(data, plan_schema())
        assert data["report"]["ops"], "the dump carries the per-op trace"


@pytest.mark.parametrize(
    "break_it, message",
    [
        (lambda d: d.pop("mesh"), r"\$: missing required field 'mesh'"),
        (lambda d: d.update(schema_version=1), r"\$\.schema_version: expected 2, got 1"),
        (
            lambda d: d["params"].update({"proj_out.weight": [None, 3]}),
            r"\$\.params\['proj_out\.weight'\]\[1\]: 3 matches none",
        ),
        (
            lambda d: d["collectives"].append({"kind": "all-sum", "axes": [], "bytes": 1, "count": 1, "where": ""}),
            r"'all-sum' is not one of",
        ),
        (
            lambda d: d["activations"][0].update(node="blocks.0.attn1.linear"),
            r"\$\.activations\[0\]\.node: .* does not match",
        ),
        (lambda d: d["report"]["ops"][0].update(segment="middle"), r"segment: 'middle' is not one of"),
        (lambda d: d.update(extra=1), r"unexpected field 'extra'"),
    ],
)
def test_broken_plans_fail_validation_with_a_path(hand_dir, break_it, message):
    import jsonschema

    from wancompile.report.schema import SchemaError, plan_schema, validate

    data = json.loads((hand_dir / "plan.json").read_text())
    break_it(data)
    with pytest.raises(SchemaError, match=message):
        validate(data)
    with pytest.raises(jsonschema.ValidationError):  # the reference implementation agrees
        jsonschema.validate(data, plan_schema())


# --- html ---------------------------------------------------------------------------------------------


class Structure(HTMLParser):
    VOID = {"meta", "br", "path", "line", "rect", "stop", "img", "link", "input", "hr"}

    def __init__(self):
        super().__init__()
        self.stack, self.tags, self.attrs, self.text, self.errors = [], [], [], [], []
        self.decl = None

    def handle_decl(self, decl):
        self.decl = decl

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += [(tag, k, v or "") for k, v in attrs]
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += [(tag, k, v or "") for k, v in attrs]

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else None}>")
        else:
            self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def parse(text: str) -> Structure:
    s = Structure()
    s.feed(text)
    s.close()
    return s


@pytest.mark.parametrize("which", ["hand", "auto"])
def test_plan_html_is_self_contained_well_formed_and_holds_the_figures_and_tables(which, hand_dir, auto_dir):
    from wancompile.report import Report

    d = hand_dir if which == "hand" else auto_dir
    page = (d / "plan.html").read_text()
    s = parse(page)
    assert s.decl == "DOCTYPE html" and s.errors == [] and s.stack == [], (s.errors, s.stack)
    assert s.tags[:4] == ["html", "head", "meta", "title"]
    # nothing is fetched: no scripts, stylesheets, images, frames, or URLs anywhere
    assert not {"script", "link", "img", "iframe", "object", "embed"} & set(s.tags)
    assert not re.search(r"(https?:|ftp:|//[a-z0-9])", page, re.I)
    assert all(v.startswith("#") or v.startswith("url(#") for t, k, v in s.attrs if k in ("href", "src", "marker-end"))
    rep = Report.load(d)
    md = (d / "plan.md").read_text()
    # the tables of plan.md, and one row per table row
    assert s.tags.count("table") == md.count("\n|---") + 1  # + the collapsed per-op trace
    rows_md = sum(1 for line in md.splitlines() if line.startswith("| "))
    assert s.tags.count("tr") == rows_md + len(rep.rows("block")) + 1  # + the trace: a header and one row per op
    # two figures: the block's dataflow (one box per table row, one badge per collective) and the bars
    assert s.tags.count("svg") == 2
    rows = rep.table_rows("block")
    text = " ".join(s.text)
    boxes = sum(1 for t, k, v in s.attrs if t == "rect" and k == "rx" and v == "5")
    assert boxes == len(rows)
    badges = sum(1 for t, k, v in s.attrs if t == "rect" and k == "rx" and v == "10")
    assert badges == sum(len(r["collectives"]) for r in rows) > 0
    for r in rows:
        assert r["loc"].removeprefix("blocks.*").removeprefix(".").replace(":", " : ") in text  # as labelled
    assert "= the stream between macros (block entry)" in text
    assert f"block ×{rep.num_blocks}" in text and "one block, per sub-layer" in text


@pytest.mark.slow
def test_backend_dump_dir_writes_the_three_dumps(spmd, tmp_path, tiny_model, tiny_inputs):
    import torch

    from planner.plan import load_plan
    from wancompile.report.schema import errors

    torch._dynamo.reset()
    compiled = torch.compile(
        tiny_model, backend="wan_autoshard", options={"mesh": "2x4", "dump_dir": str(tmp_path)}, fullgraph=True
    )
    with torch.no_grad():
        compiled(**tiny_inputs, return_dict=False)
    data = json.loads((tmp_path / "plan.json").read_text())
    assert errors(data) == [] and data["report"]["ops"]
    assert load_plan(tmp_path / "plan.json").model == data["model"]  # still a plan the `plan` option reads
    md = (tmp_path / "plan.md").read_text()
    assert md.startswith("# Sharding plan: wan-dit on 2x4 (batch, model)") and "## One block, op by op" in md
    assert parse((tmp_path / "plan.html").read_text()).errors == []


def test_the_published_schema_is_generated_from_the_plan_records():
    """wancompile/schema/plan.schema.json is what `python -m wancompile.report.schema --write` writes
    from planner/plan.py's records: change a record, regenerate, commit both."""
    from wancompile.report.schema import SCHEMA_PATH, render

    assert SCHEMA_PATH.read_text() == render(), "regenerate: python -m wancompile.report.schema --write"
