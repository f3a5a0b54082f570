"""Reading the partitioned program: collectives in XLA's optimized HLO text.

``XLA_FLAGS=--xla_dump_to=DIR`` makes XLA write ``*after_optimizations.txt`` per compiled module:
the SPMD-partitioned HLO, where every all-reduce, all-gather, reduce-scatter, all-to-all and
collective-permute appears with its per-device shape and its replica groups (explicit
``{{0,1},{2,3}}`` or iota form ``[4,2]<=[2,4]T(1,0)``). This module parses those lines and maps the
groups back to mesh axes: the axes along which the devices of a group differ.

Bytes are per device and per call: the result shape for all-gather, the operand (= result) for
all-reduce, all-to-all and collective-permute, the operand for reduce-scatter. An all-reduce whose
users only keep this device's slice is read as the reduce-scatter it is (`scattered_all_reduces`).
Each instruction is read into the planner's own `planner.collective.Collective` (count 1, ``where`` =
the instruction's name, with the HLO ``shape`` text and replica ``groups``), so predicted and
compiled collectives are one type.

`parse_matmuls` reads the other half of a program's bill from the same text: every ``dot`` and
``convolution`` with its FLOPs per device (2 × result elements × contracted elements), counted once
per execution of the computation that holds it (fusions and calls included; a ``while`` loop is
refused, its trip count is not in the text).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

import numpy as np

from planner.collective import KINDS, Collective
from planner.graph import DTYPE_BYTES
from planner.mesh import MeshSpec

_HLO_DTYPE = {
    "f32": "float32",
    "bf16": "bfloat16",
    "f16": "float16",
    "f64": "float64",
    "s32": "int32",
    "s64": "int64",
    "u8": "uint8",
    "s8": "int8",
    "pred": "bool",
    "u32": "int32",
}

_INSTR = re.compile(
    r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<shape>.+?)\s+(?P<kind>"
    + "|".join(KINDS)
    + r")(?:-start)?\((?P<operands>[^)]*)\)(?P<rest>.*)$"
)
_ARRAY = re.compile(r"(?P<dtype>[a-z]+\d*)\[(?P<dims>[\d,]*)\]")


def _shape_bytes(shape: str) -> int:
    total = 0
    for m in _ARRAY.finditer(shape):
        dims = [int(d) for d in m.group("dims").split(",") if d]
        total += math.prod(dims) * DTYPE_BYTES.get(_HLO_DTYPE.get(m.group("dtype"), ""), 4)
    return total


def parse_replica_groups(text: str) -> Optional[tuple[tuple[int, ...], ...]]:
    """``{{0,1},{2,3}}`` or ``[2,2]<=[4]`` / ``[4,2]<=[2,4]T(1,0)`` -> tuple of device-id groups."""
    m = re.search(r"replica_groups=\{((?:\{[\d,]*\},?)*)\}", text)
    if m:
        return tuple(tuple(int(x) for x in g.split(",") if x) for g in re.findall(r"\{([\d,]*)\}", m.group(1)))
    m = re.search(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", text)
    if m:
        out_shape = [int(x) for x in m.group(1).split(",")]
        iota_shape = [int(x) for x in m.group(2).split(",")]
        ids = np.arange(math.prod(iota_shape)).reshape(iota_shape)
        if m.group(3):
            ids = ids.transpose([int(x) for x in m.group(3).split(",")])
        ids = ids.reshape(out_shape[0], -1)
        return tuple(tuple(int(x) for x in row) for row in ids)
    m = re.search(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}", text)
    if m:
        return tuple(tuple(int(x) for x in p.split(",")) for p in re.findall(r"\{(\d+,\d+)\}", m.group(1)))
    return None


def group_axes(groups: Sequence[Sequence[int]], mesh: MeshSpec) -> tuple[str, ...]:
    """Mesh axes along which the devices of the groups vary (all groups together)."""
    varying: set[int] = set()
    for g in groups:
        coords = [mesh.coords(d) for d in g]
        for axis in range(len(mesh.shape)):
            if len({c[axis] for c in coords}) > 1:
                varying.add(axis)
    return tuple(mesh.axis_names[a] for a in sorted(varying))


_CALLED = re.compile(
    r"\b(?:calls|to_apply|body|condition)=%?([\w.\-]+)|\b(?:branch_computations|called_computations)=\{([^}]*)\}"
)
_DEF = re.compile(r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<shape>.+?)\s+(?P<op>[\w\-]+)\((?P<operands>[^)]*)\)")


def _callees(line: str) -> set[str]:
    """Computations an instruction line calls (fusion calls=, call/reduce to_apply=, while, conditional)."""
    out = set()
    for single, many in _CALLED.findall(line):
        out.update([single] if single else re.findall(r"%?([\w.\-]+)", many))
    return out


def _numel(shape: str) -> int:
    return sum(math.prod(int(d) for d in m.group("dims").split(",") if d) for m in _ARRAY.finditer(shape))


def _kept_slice(kept: int, group: int, whole: int) -> bool:
    """A user's result is at most one group member's share of the all-reduce (it may slice further,
    e.g. onto the next macro's finer token split, in the same fusion)."""
    return 0 < kept * group <= whole and whole % (kept * group) == 0


def scattered_all_reduces(hlo_text: str, group_size: dict[str, int]) -> set[str]:
    """All-reduces whose every user keeps only this device's slice of the result: each user is a
    dynamic-slice, or calls a computation holding one, and either its result is at most
    1/group-size of the all-reduce's size or the dynamic-slice cuts a value of the all-reduce's size
    down to that (XLA fuses the slice into the next ops, e.g. a LayerNorm's reductions or a
    projection of the kept rows). That pair is a reduce-scatter that the XLA CPU pipeline leaves
    unfused (XLA's GPU ``ReduceScatterCreator`` and tt-mlir's Shardy CCL canonicalisation fuse it),
    so it is read as one."""
    users: dict[str, list[tuple[str, str]]] = {name: [] for name in group_size}
    sizes: dict[str, int] = {}
    bodies: dict[str, list[str]] = {}
    cuts: dict[str, set[tuple[int, int]]] = {}  # computation -> (operand, result) sizes of its dynamic-slices
    current: list[str] = []
    computation, local = "", {}
    for line in hlo_text.splitlines():
        head = re.match(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
        if head:
            computation, local = head.group(1), {}
            current = bodies.setdefault(computation, [])
        current.append(line)
        m = _DEF.match(line)
        if not m:
            continue
        sizes[m.group("name")] = local[m.group("name")] = _numel(m.group("shape"))
        if m.group("op") == "dynamic-slice":
            operand = re.findall(r"%([\w.\-]+)", m.group("operands"))[:1]
            cut = (local.get(operand[0], 0) if operand else 0, local[m.group("name")])
            cuts.setdefault(computation, set()).add(cut)
        for o in re.findall(r"%([\w.\-]+)", m.group("operands")):
            if o in users:
                users[o].append((m.group("shape"), line))
    # Computations holding a dynamic-slice, directly or through the computations they call: XLA CPU
    # wraps large fusions in a `call` of an outlined parallel computation (to_apply=) around them.
    calls = {name: {c for b in body for c in _callees(b)} for name, body in bodies.items()}
    grew = True
    while grew:
        grew = False
        for name, callees in calls.items():
            more = set().union(*(cuts.get(c, set()) for c in callees)) - cuts.setdefault(name, set())
            if more:
                cuts[name] |= more
                grew = True

    def slicing(name: str, shape: str, line: str) -> bool:
        group, whole = group_size[name], sizes.get(name, 0)
        if " dynamic-slice(" in line:
            return _kept_slice(_numel(shape), group, whole)
        held = set().union(*(cuts.get(c, set()) for c in _callees(line)))
        return bool(held) and (
            _kept_slice(_numel(shape), group, whole)
            or any(src == whole and _kept_slice(k, group, whole) for src, k in held)
        )

    return {name for name, uses in users.items() if uses and all(slicing(name, shape, line) for shape, line in uses)}


def parse_collectives(hlo_text: str, mesh: MeshSpec) -> list[Collective]:
    """Every collective instruction of one HLO module, in program order."""
    found = []
    for line in hlo_text.splitlines():
        m = _INSTR.match(line)
        if m:
            found.append((m, parse_replica_groups(m.group("rest")) or ()))
    scattered = scattered_all_reduces(
        hlo_text,
        {m.group("name"): len(g[0]) for m, g in found if m.group("kind") == "all-reduce" and g and len(g[0]) > 1},
    )
    out = []
    for m, groups in found:
        kind = "reduce-scatter" if m.group("name") in scattered else m.group("kind")
        if kind != "reduce-scatter" or m.group("kind") == "all-reduce":
            nbytes = _shape_bytes(m.group("shape"))
        else:  # reduce-scatter: bytes of the (un-scattered) operand
            nbytes = _shape_bytes(m.group("shape")) * (len(groups[0]) if groups else 1)
        axes = group_axes(groups, mesh) if groups else tuple(mesh.axis_names)
        out.append(
            Collective(
                kind,
                axes,
                nbytes,
                where=m.group("name"),
                shape=m.group("shape").strip(),
                groups=tuple(map(tuple, groups)),
            )
        )
    return out


def dumped_modules(dump_dir: str | Path) -> list[Path]:
    """The partitioned-HLO text files in a dump directory, oldest module first."""
    return sorted(Path(dump_dir).glob("*after_optimizations.txt"), key=lambda p: p.name)


def dump_state(dump_dir: str | Path) -> dict[Path, tuple[int, int]]:
    """(mtime, size) of every partitioned-HLO file: XLA restarts its module numbering in each
    process, so a file name alone does not say whether this process wrote it."""
    out = {}
    for p in dumped_modules(dump_dir):
        st = p.stat()
        out[p] = (st.st_mtime_ns, st.st_size)
    return out


def new_modules(dump_dir: str | Path, before: dict[Path, tuple[int, int]]) -> list[Path]:
    """Files written (or rewritten) since `before` was taken."""
    return [p for p, sig in dump_state(dump_dir).items() if before.get(p) != sig]


def main_module(paths: Iterable[Path]) -> Path:
    """The largest module among `paths`: the model's program, not a transfer or a small helper."""
    paths = list(paths)
    if not paths:
        raise FileNotFoundError("no *after_optimizations.txt files were dumped; is XLA_FLAGS=--xla_dump_to set?")
    return max(paths, key=lambda p: p.stat().st_size)


# --- matmul FLOPs -------------------------------------------------------------------------------------

_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?(?P<name>[\w.\-]+)\s+\(.*\{\s*$")


@dataclass(frozen=True)
class HloMatmul:
    """One dot or convolution: FLOPs per device per execution, and how often it runs per call."""

    kind: str  # dot | convolution
    name: str
    shape: str
    flops: int
    count: int = 1


def _dims(shape: str) -> list[int]:
    m = _ARRAY.search(shape)
    if m is None:
        raise ValueError(f"not an array shape: {shape!r}")
    return [int(d) for d in m.group("dims").split(",") if d]


def _operand_names(operands: str) -> list[str]:
    return re.findall(r"%([\w.\-]+)", re.sub(r"/\*.*?\*/", "", operands))


def _int_list(rest: str, key: str) -> list[int]:
    m = re.search(rf"\b{key}=\{{([\d,]*)\}}", rest)
    return [int(x) for x in m.group(1).split(",") if x] if m else []


def _matmul_flops(op: str, shape: str, operand_shapes: list[str], rest: str) -> int:
    out = math.prod(_dims(shape))
    if op == "dot":
        lhs = _dims(operand_shapes[0])
        return 2 * out * math.prod(lhs[d] for d in _int_list(rest, "lhs_contracting_dims"))
    m = re.search(r"dim_labels=\w+_(\w+)->", rest)
    if m is None:
        raise ValueError(f"convolution without dim_labels: {rest[:120]!r}")
    rhs = _dims(operand_shapes[1])
    return 2 * out * math.prod(rhs) // rhs[m.group(1).index("o")]  # per output: kernel window × input features


@dataclass(frozen=True)
class HloInstr:
    name: str
    shape: str
    op: str
    operands: tuple[str, ...]
    rest: str  # the text after the operand list: attributes, calls=, to_apply=, ...


def parse_computations(hlo_text: str) -> tuple[str, dict[str, list[HloInstr]]]:
    """(entry computation name, computation name -> its instructions in order) of one HLO module."""
    computations: dict[str, list[HloInstr]] = {}
    entry, current = None, None
    for line in hlo_text.splitlines():
        head = _COMPUTATION.match(line)
        if head and "=" not in line.split("(")[0]:
            current = head.group("name")
            computations[current] = []
            if line.startswith("ENTRY"):
                entry = current
            continue
        m = _DEF.match(line)
        if m and current is not None:
            operands = tuple(_operand_names(m.group("operands")))
            computations[current].append(
                HloInstr(m.group("name"), m.group("shape"), m.group("op"), operands, line[m.end() :])
            )
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    return entry, computations


def parse_matmuls(hlo_text: str) -> list[HloMatmul]:
    """Every dot and convolution of an HLO module with its FLOPs per device, ``count`` = executions
    per call of the entry computation. Raises ValueError on a ``while`` loop (unknown trip count)."""
    entry, computations = parse_computations(hlo_text)
    runs: dict[str, int] = {}

    def visit(name: str, times: int) -> None:
        runs[name] = runs.get(name, 0) + times
        for instr in computations.get(name, []):
            if instr.op == "while":
                raise ValueError(f"{instr.name}: a while loop; its trip count is not in the HLO text")
            for callee in _callees(instr.rest):
                visit(callee, times)

    visit(entry, 1)
    out = []
    for comp, instrs in computations.items():
        if not runs.get(comp):
            continue
        shapes = {i.name: i.shape for i in instrs}
        for i in instrs:
            if i.op in ("dot", "convolution"):
                flops = _matmul_flops(i.op, i.shape, [shapes[n] for n in i.operands], i.rest)
                out.append(HloMatmul(i.op, i.name, i.shape.strip(), flops, runs[comp]))
    return out
