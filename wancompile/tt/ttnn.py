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

import math
import re
from collections import Counter
from pathlib import Path

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
    """Every collective of a TTNN IR module, in program order."""
    out: list[Collective] = []
    for line in ttnn_text.splitlines():
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
