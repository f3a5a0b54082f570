"""Reading a TTNN program by the model's parts: which block each op computes, the attention score matrices
it writes, and what a plan's pins cost it.

- `labelled_ops` / `by_part`: every op of ``@main`` labelled with the part of the model it computes
  (``prologue``, ``blocks.0`` ..., ``epilogue``), from the parameters it reads (the export names each
  module argument: `wancompile.tt.export.argument_names`); `from_parameters`: the values computed from
  parameters alone;
- `score_matrices`: the L_q x L_k tensors of a decomposed attention (`ScoreMatrix`), the memory fused
  attention never spends; `lq_lk_tensors`: those and every other op result of an attention's L_q x L_k (its
  mask as TTNN holds it, e.g. a key mask ``ttnn.repeat``ed to each chip's queries, and the ops between scores);
- `pin_costs`: per part, the pinned program's fused kernels and data movement against the same module
  compiled with its plan taken out (`PinCost`), and which of the differences the plan's reshards explain.

Why one module over 400 lines: the three readings walk the same labelled dataflow of ``@main`` (`_dataflow`,
`labelled_ops`), and an attention's tensors are found by following it from the attention's ops, as the parts are.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional

from wancompile.tt.ttnn import _BYTES, _KIND, _OP, _TENSOR, main_body

_ANY_OP = re.compile(
    r'^\s*(?:(?P<name>%[\w.]+)(?::\d+)? = )?(?:"(?P<op>ttnn\.\w+)"|(?P<core>ttcore\.load_cached))\((?P<operands>[^)]*)\)'
)
_VALUE = re.compile(r"%[\w.]+")
_PART = re.compile(r"^([A-Za-z_]\w*\.\d+)\.")  # blocks.3.attn1.to_q.weight -> blocks.3
PROLOGUE, EPILOGUE = "prologue", "epilogue"


def part_of(parameter: str) -> str:
    """The repeated module a parameter belongs to (``blocks.3``), else its top-level module (``proj_out``)."""
    m = _PART.match(parameter)
    return m.group(1) if m else parameter.split(".")[0]


def _dataflow(ttnn_text: str, argument_names: Optional[list[list[str]]] = None) -> tuple[list[str], list[tuple]]:
    """``@main``'s arguments and its ops in order, each (result or None, op name, operand values)."""
    body = main_body(ttnn_text)
    args = [m.group(1) for m in re.finditer(r"(%arg\d+): tensor<", body[0])]
    if argument_names is not None and len(args) != len(argument_names):
        raise ValueError(f"@main has {len(args)} arguments, the export named {len(argument_names)}")
    ops = []
    for line in body[1:]:
        m = _ANY_OP.match(line)
        if m:
            operands = [v.split("#")[0] for v in _VALUE.findall(m.group("operands"))]
            ops.append((m.group("name"), m.group("op") or m.group("core"), operands))
    return args, ops


def from_parameters(ttnn_text: str, argument_names: list[list[str]]) -> set[str]:
    """The values of ``@main`` computed from parameters alone (weights, folded weights, constants): what an
    attention's scores never are."""
    args, ops = _dataflow(ttnn_text, argument_names)
    out = {a for a, names in zip(args, argument_names) if names}
    inputs = set(args) - out
    for name, _, operands in ops:
        if name is not None and not any(v in inputs or (v.startswith("%") and v not in out) for v in operands):
            out.add(name)
    return out


def by_part(ttnn_text: str, argument_names: list[list[str]]) -> tuple[tuple[str, Counter], ...]:
    """The TTNN ops of ``@main`` by the part of the model they compute (`labelled_ops`), in program order:
    ``prologue``, each block (``blocks.0``, ...), ``epilogue``."""
    counts: dict[str, Counter] = {}
    for part, _, op, _ in labelled_ops(ttnn_text, argument_names):
        counts.setdefault(part, Counter())[op] += 1
    return tuple(counts.items())


def labelled_ops(ttnn_text: str, argument_names: list[list[str]]) -> list[tuple[str, Optional[str], str, list[str]]]:
    """Every op of ``@main`` as (part, result or None, op name, operand values), in program order, parts
    ordered prologue, blocks, epilogue. `argument_names`: per argument of ``@main``, the parameters it holds
    (`wancompile.tt.export.argument_names`).

    An op belongs to the latest block whose parameters it reads, directly or through its operands (blocks
    ranked by where the program first reads them), except a value computed from parameters alone of several
    blocks (tt-mlir joins the blocks' text K/V projections into one concat and one linear): it belongs to
    the prologue, and what is computed from it to the block its other operands say. An op that reads no
    block belongs to the prologue; one that reads a top-level module's parameters first read after the last
    block's last parameter (``proj_out``) to the epilogue (not after its first: with one block, the text
    embedding read after the block's first modulation would take the block's cross-attention with it). A ``deallocate`` belongs where its value does. An op that reads
    only the residual stream (a block's first LayerNorm, without weights) therefore counts in the block
    before it."""
    args, ops = _dataflow(ttnn_text, argument_names)
    parts_of = {a: {part_of(n) for n in names} for a, names in zip(args, argument_names)}
    # where the forward first reads each part: its first op that meets a parameter of it (or a value computed
    # from its parameters alone, e.g. a const-eval result, ``ttcore.load_cached``) with an activation or input
    derived = {a: ps for a, ps in parts_of.items() if ps}  # value -> the parts its parameters come from
    activations = {a for a, ps in parts_of.items() if not ps}  # inputs, and what is computed from them
    first: dict[str, int] = {}
    last: dict[str, int] = {}  # and where it last reads them
    for k, (name, _, operands) in enumerate(ops):
        if not any(v in activations for v in operands):
            if name is not None:
                derived[name] = set().union(*(derived.get(v, set()) for v in operands))
            continue
        if name is not None:
            activations.add(name)
        for v in operands:
            for p in derived.get(v, ()):
                first.setdefault(p, k)
                last[p] = k
    blocks = sorted((p for p in first if _PART.match(p + ".")), key=first.get)
    last_block = max((last[p] for p in blocks), default=-1)
    rank = {
        p: (1 + blocks.index(p)) if p in blocks else (len(blocks) + 1 if first[p] > last_block else 0) for p in first
    }
    rank.update({p: 0 for ps in parts_of.values() for p in ps if p not in rank})  # read by no forward op
    label = [PROLOGUE, *blocks, EPILOGUE]
    # value -> (rank, computed from parameters alone, the blocks it was computed from if so)
    state: dict[str, tuple[int, bool, frozenset]] = {}
    for a, ps in parts_of.items():
        own = frozenset(p for p in ps if p in blocks)
        state[a] = (0 if len(own) > 1 else max((rank[p] for p in ps), default=0), bool(ps), own)
    out = []
    for name, op, operands in ops:
        ins = [state[v] for v in operands if v in state]
        params_only = all(x[1] for x in ins)
        own = frozenset().union(*(x[2] for x in ins)) if params_only else frozenset()
        r = 0 if len(own) > 1 else max((x[0] for x in ins), default=0)
        if name is not None:
            state[name] = (r, params_only, own)
        out.append((r, name, op, operands))
    return [(label[r], name, op, operands) for r, name, op, operands in sorted(out, key=lambda x: x[0])]


@dataclass(frozen=True)
class ScoreMatrix:
    """A tensor of a compiled attention's L_q x L_k scores (each chip's part of them) in the TTNN program."""

    value: str  # the SSA value, e.g. "%412"
    op: str  # the op that makes it (ttnn.matmul, ttnn.softmax, ...)
    type: str  # "1x4x48x48xbf16"
    bytes: int  # per chip, as the type says (without tile padding)
    lq: int  # the attention's query and key lengths (whole, as the model has them)
    lk: int
    # "scores": QK^T, its softmax and what is computed from them at their size; "mask": an L_q x L_k tensor no
    # scores flow into (an attention mask as TTNN holds it: a fused attention's mask operand, a key mask repeated
    # to every query, the mask a decomposed attention adds), `lq_lk_tensors`
    kind: str = "scores"


def _contracted(line: str, rest: str) -> Optional[int]:
    """The contracted dim of a ``ttnn.matmul`` line (its first operand's last dim, or second-last if transposed)."""
    operands = [
        [int(d) for d in m.group("dims").split("x") if d]
        for m in _TENSOR.finditer(rest.rsplit(" : ", 1)[-1].split(") -> ")[0])
    ]
    if not operands or len(operands[0]) < 2:
        return None
    return operands[0][-2] if "transpose_a = true" in line else operands[0][-1]


def score_matrices(
    ttnn_text: str,
    attentions: Iterable[tuple[int, int, int]],
    splits: Iterable[int],
    weights: frozenset = frozenset(),
) -> list[ScoreMatrix]:
    """The score matrices of ``@main``: results of a softmax, or of a matmul contracting an attention's head
    dim, whose last two dims are the attention's query tokens, whole or split `splits`-ways (a chip's part
    under SP), and all its key tokens (SP gathers K/V; Ulysses holds every token of its heads): what fused
    attention never writes. `attentions`: (L_q, L_k, head dim) of each attention call; `weights`: values
    computed from parameters alone (`from_parameters`): a matmul reading one is a projection, whatever its
    shape (a tiny DiT's 64-wide stream and 64 tokens look alike)."""
    pairs: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
    for lq, lk, d in attentions:
        for s in sorted(set(splits) | {1}):
            if lq % s == 0:
                pairs.setdefault((lq // s, lk), []).append((lq, lk, d))
    out = []
    for line in main_body(ttnn_text)[1:]:
        m = _OP.match(line)
        if not m or m.group("op") not in ("matmul", "softmax"):
            continue
        result = _TENSOR.search(m.group("rest").rsplit(" -> ", 1)[-1])
        dims = [int(d) for d in result.group("dims").split("x") if d] if result else []
        if len(dims) < 2 or tuple(dims[-2:]) not in pairs:
            continue
        if m.group("op") == "matmul" and any(v.split("#")[0] in weights for v in _VALUE.findall(m.group("operands"))):
            continue
        k = _contracted(line, m.group("rest")) if m.group("op") == "matmul" else None
        match = [a for a in pairs[tuple(dims[-2:])] if k is None or k == a[2]]
        if match:
            lq, lk, _ = match[0]
            nbytes = math.prod(dims) * _BYTES.get(result.group("dtype"), 4)
            out.append(ScoreMatrix(m.group("name"), f"ttnn.{m.group('op')}", result.group(0)[7:], nbytes, lq, lk))
    return out


_SEGMENTS = re.compile(r"operandSegmentSizes = array<i32: ([\d, ]+)>")


def _mask_operand(line: str, operands: list[str]) -> Optional[str]:
    """A ``ttnn.scaled_dot_product_attention`` line's mask operand (its fourth operand segment), or None."""
    m = _SEGMENTS.search(line)
    sizes = [int(x) for x in m.group(1).split(",")] if m else [1, 1, 1, max(0, len(operands) - 3)]
    if len(sizes) < 4 or sizes[3] != 1:
        return None
    return operands[sum(sizes[:3])]


def lq_lk_tensors(
    ttnn_text: str,
    attentions: Iterable[tuple[int, int, int]],
    splits: Iterable[int],
    weights: frozenset = frozenset(),
) -> list[ScoreMatrix]:
    """Every op result of ``@main`` that holds an attention's L_q x L_k (`ScoreMatrix`, by ``kind``): the score
    matrices (`score_matrices`), a fused attention's mask operand, and every value connected to one of those
    through ops whose results keep the same last two dims (queries whole or split `splits`-ways, all keys):
    ``scores`` downstream of a score matrix (the scale, the mask add, the softmax, their casts), ``mask`` upstream
    of a fused attention's mask operand or of what an op on the scores reads beside them (a key mask
    ``ttnn.repeat``ed up to L_q x L_k). Connected, not merely shaped alike: a tiny DiT's stream can have the
    tokens' shape too (64 tokens, 64 features)."""
    attentions = list(attentions)
    scores = score_matrices(ttnn_text, attentions, splits, weights)
    pairs: dict[tuple[int, int], tuple[int, int]] = {}
    for lq, lk, _ in attentions:
        for s in sorted(set(splits) | {1}):
            if lq % s == 0:
                pairs.setdefault((lq // s, lk), (lq, lk))
    made: dict[str, tuple[str, list[str], list[int], str]] = {}  # value -> (op, operands, dims, dtype)
    readers: dict[str, list[str]] = {}
    masks: list[str] = []
    for line in main_body(ttnn_text)[1:]:
        m = _ANY_OP.match(line)
        if not m:
            continue
        operands = [v.split("#")[0] for v in _VALUE.findall(m.group("operands"))]
        op = m.group("op") or m.group("core")
        if op == "ttnn.scaled_dot_product_attention":
            mask = _mask_operand(line, operands)
            if mask is not None:
                masks.append(mask)
        name = m.group("name")
        result = _TENSOR.search(line.rsplit(" -> ", 1)[-1]) if name else None
        if result is None:
            continue
        dims = [int(d) for d in result.group("dims").split("x") if d]
        made[name] = (op, operands, dims, result.group("dtype"))
        for v in operands:
            readers.setdefault(v, []).append(name)

    def pair(v: str) -> Optional[tuple[int, int]]:
        dims = made[v][2] if v in made else []
        return tuple(dims[-2:]) if len(dims) >= 2 and tuple(dims[-2:]) in pairs else None

    # down from each score matrix through its readers at its size (scale, mask add, softmax, their casts): scores;
    # up from each fused attention's mask operand, and from what an op on the scores reads beside them at their
    # size (the mask a decomposed attention adds), through the producers at that size (a repeat): masks
    found: dict[str, tuple[str, tuple[int, int]]] = {}  # value -> (kind, its (L_q part, L_k))
    todo = [x.value for x in scores]
    while todo:
        v = todo.pop()
        if v in found or pair(v) is None:
            continue
        found[v] = ("scores", pair(v))
        todo.extend(u for u in readers.get(v, []) if pair(u) == pair(v))
    todo = [v for v in masks if pair(v)]
    todo += [u for v, (_, p) in found.items() for u in made[v][1] if u not in found and pair(u) == p]
    while todo:
        v = todo.pop()
        if v in found or pair(v) is None:
            continue
        found[v] = ("mask", pair(v))
        todo.extend(u for u in made[v][1] if pair(u) == pair(v))
    by_value = {x.value: x for x in scores}
    out = []
    for v, (kind, at) in found.items():
        if v in by_value:
            out.append(by_value[v])
            continue
        op, _, dims, dtype = made[v]
        lq, lk = pairs[at]
        out.append(
            ScoreMatrix(
                v, op, "x".join(map(str, dims)) + "x" + dtype, math.prod(dims) * _BYTES.get(dtype, 4), lq, lk, kind
            )
        )
    order = {v: i for i, v in enumerate(made)}
    return sorted(out, key=lambda x: order.get(x.value, -1))


# --- what the pins cost: the pinned program against the same program unannotated ----------------------

COLLECTIVE_OPS = frozenset({f"ttnn.{k}" for k in _KIND} | {"ttnn.mesh_partition"})
MOVES = ("ttnn.reshape", "ttnn.permute", "ttnn.to_layout")
# the kernels tt-mlir's patterns make of several ops (a linear: matmul + bias, its activation too)
FUSED_KERNELS = (
    "ttnn.scaled_dot_product_attention",
    "ttnn.layer_norm",
    "ttnn.rms_norm",
    "ttnn.gelu",
    "ttnn.rotary_embedding",
    "ttnn.linear",
)
_THROUGH = frozenset(MOVES) | {"ttnn.typecast"}  # what a collective's operand passes through on its way
_REDUCTIONS = frozenset({"ttnn.all_reduce", "ttnn.reduce_scatter"})
_REDUCING = frozenset({"ttnn.sum", "ttnn.mean", "ttnn.max", "ttnn.min"})  # a statistic, dims reduced away
_POINTWISE = frozenset({"ttnn.multiply", "ttnn.add", "ttnn.subtract", "ttnn.divide", "ttnn.typecast", "ttnn.rsqrt"})


@dataclass(frozen=True)
class PinCost:
    """One part of the model (`labelled_ops`) compiled pinned and unannotated (`wancompile.tt.worker`
    ``unannotated``): its fused kernels and data movement in each, (pinned, unannotated) by op, and which of
    the pinned program's extra ones the plan's reshards explain: a move in a chain of moves into or out of a
    collective (TTNN's collectives take 4-D tiled tensors), a matmul whose bias cannot join it because its
    result is reduced across chips first (a row-parallel linear: the bias is added after the all-reduce), and
    the reshape that gives a statistic the plan split back its reduced dims (the unannotated program's ``mean``
    keeps them; the split one sums without them, all-reduces and scales, then restores them: a reshape that
    only inserts unit dims, past the scaling)."""

    part: str
    kernels: Mapping[str, tuple[int, int]]
    moves: Mapping[str, tuple[int, int]]
    moves_at_reshards: Mapping[str, int]
    matmuls_before_reductions: int

    @property
    def unexplained(self) -> dict[str, int]:
        """By op: fusions lost, and ("moves") reshapes, permutes and layout copies added, that no reshard of the
        plan explains (empty: the pins cost nothing but what the plan's collectives need)."""
        out = {}
        for op, (pinned, bare) in self.kernels.items():
            lost = bare - pinned - (self.matmuls_before_reductions if op == "ttnn.linear" else 0)
            if lost > 0:
                out[op] = lost
        # moves counted together: a permute that moves a size-1 dim (one head per chip) is compiled as a reshape
        added = sum(p - b for p, b in self.moves.values()) - sum(self.moves_at_reshards.values())
        if added > 0:
            out["moves"] = added
        return out


def _result_dims(ttnn_text: str) -> dict[str, tuple[int, ...]]:
    """Each ``@main`` value's dims, as its op's result type says."""
    out = {}
    for line in main_body(ttnn_text)[1:]:
        m = _ANY_OP.match(line)
        t = _TENSOR.search(line.rsplit(" -> ", 1)[-1]) if m and m.group("name") else None
        if t:
            out[m.group("name")] = tuple(int(d) for d in t.group("dims").split("x") if d)
    return out


def _unit_dims_inserted(before: tuple[int, ...], after: tuple[int, ...]) -> bool:
    return len(after) > len(before) and [d for d in after if d != 1] == [d for d in before if d != 1]


def _at_reshards(ops: list[tuple], dims: Mapping[str, tuple[int, ...]]) -> tuple[set[str], set[str]]:
    """(moves in a chain of moves into or out of a collective, or restoring a split statistic's reduced dims;
    matmuls whose result such a chain reduces). `dims`: each value's dims (`_result_dims`)."""
    producer = {name: (op, operands) for _, name, op, operands in ops if name}
    readers: dict[str, list[tuple[Optional[str], str]]] = {}
    for _, name, op, operands in ops:
        for v in operands:
            readers.setdefault(v, []).append((name, op))
    moves, matmuls = set(), set()
    for _, name, op, operands in ops:
        if op not in COLLECTIVE_OPS:
            continue
        stack, statistic = list(operands), False
        while stack:  # up: what the collective's operand passed through
            v = stack.pop()
            made = producer.get(v)
            if made is None or v in moves:
                continue
            if made[0] in _THROUGH:
                moves.add(v)
                stack.extend(made[1])
            elif made[0] == "ttnn.matmul" and op in _REDUCTIONS:
                matmuls.add(v)
            statistic |= made[0] in _REDUCING and op in _REDUCTIONS
        stack = [(name, False)] if name else []
        while stack:  # down: what its result passes through (past: a statistic's scaling, same shape)
            v, past = stack.pop()
            for reader, rop in readers.get(v, ()):
                if not reader or reader in moves:
                    continue
                if rop in _THROUGH and not past:
                    moves.add(reader)
                    stack.append((reader, False))
                elif statistic and rop in _POINTWISE and dims.get(reader) == dims.get(v):
                    stack.append((reader, True))
                elif statistic and rop == "ttnn.reshape" and _unit_dims_inserted(dims.get(v, ()), dims.get(reader, ())):
                    moves.add(reader)
                    statistic = False  # one restored statistic per reduction
    return moves, matmuls


def pin_costs(pinned: str, unannotated: str, argument_names: list[list[str]]) -> tuple[PinCost, ...]:
    """Per part of the model, the pinned TTNN program's fused kernels and moves against the unannotated one's
    (`PinCost`); both TTNN IRs of one exported module (the same arguments)."""
    ops = labelled_ops(pinned, argument_names)
    moves, matmuls = _at_reshards(ops, _result_dims(pinned))
    bare = dict(by_part(unannotated, argument_names))
    out = []
    for part, counts in by_part(pinned, argument_names):
        other = bare.get(part, Counter())
        at = Counter(op for p, name, op, _ in ops if p == part and name in moves and op in MOVES)
        out.append(
            PinCost(
                part,
                {k: (counts[k], other[k]) for k in FUSED_KERNELS if counts[k] or other[k]},
                {k: (counts[k], other[k]) for k in MOVES if counts[k] or other[k]},
                dict(at),
                sum(1 for p, name, op, _ in ops if p == part and name in matmuls),
            )
        )
    return tuple(out)
