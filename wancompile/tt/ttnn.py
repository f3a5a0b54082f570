"""Reading the program tt-mlir compiled: collectives in the final TTNN IR.

The last IR stage tt-mlir writes (``irs/ttnn_<model>_g<k>_<t>.mlir``, before ``ttnn_runtime``) names every
collective as one op with the mesh axis it runs over:

    %93 = "ttnn.all_gather"(%92) <{all_gather_dim = 1 : si32, cluster_axis = 0 : ui32}> : (tensor<1x6x64xf32, ...>) -> tensor<1x12x64xf32, ...>
    %76 = "ttnn.all_reduce"(%75) <{cluster_axis = 0 : ui32, reduce_type = ...}> : (...) -> ...
    %117 = "ttnn.reduce_scatter"(%116) <{cluster_axis = 0 : ui32, ..., scatter_dim = 3 : si32}> : ...
    %255 = "ttnn.point_to_point"(%252, %253) <{receiver_coord = array<i64: 1, 0>, sender_coord = array<i64: 0, 0>}> : ...

Each becomes the planner's `Collective` (count 1), so predicted and compiled compare as one type
(`wancompile.verify.compare_collectives`): ``cluster_axis`` k is the mesh's axis k; a point-to-point
transfer is a ``collective-permute`` along the axes in which its sender and receiver coordinates differ
(DESIGN.md §4: within one row or column). ``ttnn.mesh_partition`` is a local slice (no transfer) and is
counted apart (`local_slices`). Bytes are per device and call, in TTNN's types (tt-mlir may have
turned f32 into bf16 and folded dims into 4-D tiles): the result for all-gather, the operand otherwise.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from planner.collective import Collective
from planner.mesh import MeshSpec

_KIND = {
    "all_gather": "all-gather",
    "all_reduce": "all-reduce",
    "reduce_scatter": "reduce-scatter",
    "point_to_point": "collective-permute",
    "all_to_all": "all-to-all",
}
_OP = re.compile(r'^\s*(?P<name>%[\w.]+)(?::\d+)? = "ttnn\.(?P<op>\w+)"\((?P<operands>[^)]*)\)(?P<rest>.*)$')
_TENSOR = re.compile(r"tensor<(?P<dims>(?:\d+x)*)(?P<dtype>[a-z]+\d*)")
_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "si32": 4, "ui32": 4, "i32": 4, "bfp_bf8": 1, "u8": 1, "ui8": 1}


def _tensors(text: str) -> list[int]:
    out = []
    for m in _TENSOR.finditer(text):
        dims = [int(d) for d in m.group("dims").split("x") if d]
        out.append(math.prod(dims) * _BYTES.get(m.group("dtype"), 4))
    return out


def _coord(rest: str, key: str) -> tuple[int, ...]:
    m = re.search(key + r" = array<i64: ([\d, ]+)>", rest)
    return tuple(int(x) for x in m.group(1).split(",")) if m else ()


def parse_collectives(ttnn_text: str, mesh: MeshSpec) -> list[Collective]:
    """Every collective of a TTNN IR module's ``@main``, in program order: what runs every call. One in a
    const-eval function (computed once, ``ttcore.load_cached``) is not among them, so a per-call collective
    of the plan that tt-mlir hoisted there reads as missing."""
    out: list[Collective] = []
    for line in main_body(ttnn_text):
        m = _OP.match(line)
        if not m or m.group("op") not in _KIND:
            continue
        op, rest = m.group("op"), m.group("rest")
        sig = rest.rsplit(" : ", 1)[-1]
        ins, _, res = sig.partition(") -> ")
        in_bytes, res_bytes = _tensors(ins), _tensors(res)
        if op == "point_to_point":
            a, b = _coord(rest, "sender_coord"), _coord(rest, "receiver_coord")
            axes = tuple(name for name, x, y in zip(mesh.axis_names, a, b) if x != y)
        else:
            axis = re.search(r"cluster_axis = (\d+)", rest)
            axes = (mesh.axis_names[int(axis.group(1))],) if axis else tuple(mesh.axis_names)
        nbytes = (res_bytes or [0])[0] if op == "all_gather" else (in_bytes or [0])[0]
        out.append(Collective(_KIND[op], axes, nbytes, where=m.group("name"), shape=sig.strip()))
    return out


def local_slices(ttnn_text: str) -> int:
    """``ttnn.mesh_partition`` ops: each chip keeps its slice of a replicated value, no transfer."""
    return sum(1 for line in ttnn_text.splitlines() if '"ttnn.mesh_partition"' in line)


def op_counts(ttnn_text: str) -> Counter:
    """TTNN ops by name (``ttnn.matmul``: 12, ...), the program's shape in one table."""
    return Counter(m.group(1) for m in re.finditer(r'"(ttnn\.\w+)"\(', ttnn_text))


def final_ir(export_dir: Path) -> Path:
    """The final TTNN IR stage tt-mlir wrote under ``export_dir/irs`` (not the runtime-annotated copy)."""
    found = sorted(p for p in (Path(export_dir) / "irs").glob("ttnn_*.mlir") if not p.name.startswith("ttnn_runtime"))
    if not found:
        raise FileNotFoundError(f"no TTNN IR under {export_dir}/irs: the compile stopped before TTNN")
    return found[-1]


# --- memory: what the program holds in each chip's DRAM ------------------------------------------------

_LAYOUT_DEF = re.compile(
    r"^(#ttnn_layout\d*) = #ttnn\.ttnn_layout<.*memref<(?P<memref>[^>]*(?:>[^>]*)?)>, (?P<rest>.*)$"
)
_MEMREF = re.compile(
    r"^(?P<dims>(?:\d+x)*)(?:!ttcore\.tile<(?P<th>\d+)x(?P<tw>\d+), (?P<tdt>\w+)>|(?P<dt>\w+)), #(?P<space>\w+)"
)
_TYPED = re.compile(r"tensor<(?P<dims>(?:\d+x)*)(?P<dtype>[a-z]+\d*), (?P<layout>#ttnn_layout\d*)>")
_RESULT = re.compile(r"^\s*(?P<name>%[\w.]+)(?::(?P<n>\d+))? = ")
_DEALLOC = re.compile(r'"ttnn\.deallocate"\((?P<name>%[\w.]+)(?:#(?P<k>\d+))?\)')


@dataclass(frozen=True)
class Layout:
    """One ``#ttnn_layout``: bytes per chip as allocated (whole 32x32 tiles, or rows), and where."""

    bytes: int
    space: str  # dram | l1 | system_memory
    tiled: bool


@dataclass(frozen=True)
class Memory:
    """A TTNN program's memory per chip, walked op by op (`memory`): every result is allocated where its
    layout says until its ``ttnn.deallocate`` (or the end); arguments (weights and inputs) and cached
    constants (``ttcore.load_cached``) are held from the start. Views count as copies (an upper bound:
    tt-metal may alias a tile-aligned reshape)."""

    peak_bytes: int  # DRAM at the peak
    peak_logical_bytes: int  # the same tensors' data without TTNN's tile padding
    arguments_bytes: int  # weights and inputs (DRAM, allocated)
    constants_bytes: int  # const-eval results the program keeps (DRAM, allocated)
    peak_op: str  # the op whose result makes the peak
    # (value, allocated, logical, type such as "1x20x8190x32760xf32") of the largest live at the peak
    largest: tuple[tuple[str, int, int, str], ...] = ()
    l1_peak_bytes: int = 0

    @property
    def tile_padding(self) -> float:
        """Allocated / logical bytes at the peak (1.0: no padding)."""
        return self.peak_bytes / self.peak_logical_bytes if self.peak_logical_bytes else 1.0


def _layouts(text: str) -> dict[str, Layout]:
    out = {}
    for line in text.splitlines():
        m = _LAYOUT_DEF.match(line)
        if not m:
            continue
        r = _MEMREF.match(m.group("memref"))
        if not r:
            continue
        n = math.prod(int(d) for d in r.group("dims").split("x") if d)
        if r.group("th"):
            nbytes = n * int(r.group("th")) * int(r.group("tw")) * _BYTES.get(r.group("tdt"), 4)
        else:
            nbytes = n * _BYTES.get(r.group("dt"), 4)
        out[m.group(1)] = Layout(nbytes, r.group("space"), bool(r.group("th")))
    return out


def _logical(m: re.Match) -> int:
    return math.prod(int(d) for d in m.group("dims").split("x") if d) * _BYTES.get(m.group("dtype"), 4)


def main_body(text: str) -> list[str]:
    lines = text.splitlines()
    start = next((i for i, x in enumerate(lines) if re.search(r"func\.func @main\(", x)), None)
    if start is None:
        raise ValueError("no @main function in the TTNN IR")
    depth, out = 0, []
    for line in lines[start:]:
        out.append(line)
        depth += line.count("{") - line.count("}")
        if depth <= 0 and len(out) > 1:
            break
    return out


def memory(ttnn_text: str, top: int = 5) -> Memory:
    """The per-chip memory of the final TTNN IR's ``@main`` (`Memory`)."""
    layouts = _layouts(ttnn_text)
    body = main_body(ttnn_text)
    live: dict[str, tuple[int, int, str, str]] = {}  # value -> (allocated, logical, space, type)
    space_total = Counter()
    logical_dram = 0

    def hold(name: str, m: re.Match) -> None:
        nonlocal logical_dram
        lay = layouts.get(m.group("layout"))
        if lay is None:
            return
        live[name] = (lay.bytes, _logical(m), lay.space, m.group("dims") + m.group("dtype"))
        space_total[lay.space] += lay.bytes
        if lay.space == "dram":
            logical_dram += _logical(m)

    def free(name: str) -> None:
        nonlocal logical_dram
        if name in live:
            nbytes, logical, space, _ = live.pop(name)
            space_total[space] -= nbytes
            if space == "dram":
                logical_dram -= logical

    signature = body[0]
    for m in re.finditer(r"(%arg\d+): " + _TYPED.pattern, signature):
        hold(m.group(1), m)
    arguments = space_total["dram"]
    constants = 0
    peak = (space_total["dram"], logical_dram, "arguments", dict(live))
    l1_peak = space_total["l1"]
    for line in body[1:]:
        d = _DEALLOC.search(line)
        if d:
            free(d.group("name") + (f"#{d.group('k')}" if d.group("k") else ""))
            continue
        r = _RESULT.match(line)
        if not r or " -> " not in line:
            continue
        results = line.rsplit(" -> ", 1)[1]
        typed = list(_TYPED.finditer(results))
        names = [r.group("name")] if len(typed) == 1 else [f"{r.group('name')}#{k}" for k in range(len(typed))]
        before = space_total["dram"]
        for name, m in zip(names, typed):
            hold(name, m)
        op = re.search(r'"(ttnn\.\w+)"|(ttcore\.load_cached)', line)
        if op and op.group(2):
            constants += space_total["dram"] - before
        l1_peak = max(l1_peak, space_total["l1"])
        if space_total["dram"] > peak[0]:
            peak = (space_total["dram"], logical_dram, (op.group(1) or op.group(2)) if op else "?", dict(live))
    largest = sorted(((k, v[0], v[1], v[3]) for k, v in peak[3].items() if v[2] == "dram"), key=lambda x: -x[1])[:top]
    return Memory(peak[0], peak[1], arguments, constants, peak[2], tuple(largest), l1_peak)


def perf_metrics(path: Optional[str]) -> dict[str, float]:
    """TTNN's perf metrics file (``ttnn_perf_metrics_enabled``): FLOPs per chip, ops, the share spilled to DRAM."""
    if not path:
        return {}
    data = json.loads(Path(path).read_text())
    summary = data.get("summary", {})
    return {
        "total_flops": float(data.get("flops", {}).get("total_flops", 0)),
        "total_ops": float(summary.get("total_ops", 0)),
        "spilled_percentage": float(summary.get("spilled_percentage", 0)),
    }
