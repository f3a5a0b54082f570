"""One-op modules for tt-mlir: what Shardy and TTNN make of one reshard, measured in isolation.

`reshard_module` writes a Shardy-form module whose argument is split as one layout, constrained to each
of `steps` in turn (``sdy.sharding_constraint``), doubled and returned in the last; `probe_reshard`
compiles it for a system (compile-only) and returns whether tt-mlir lowered it and the final TTNN IR's
collectives per kind and mesh axes. How the planner's tt-mlir reshard model was measured
(`planner.reshard.permutes`, tests/data/tt_reshards_2x4.json) and how a test checks it again.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from planner.mesh import MeshSpec
from planner.placements import Layout
from wancompile.tt import env, ttnn


@dataclass(frozen=True)
class Probe:
    lowered: bool
    error: str = ""
    ttnn: dict[str, int] = field(default_factory=dict)  # "kind:axis+axis" -> count in the final TTNN IR


def _spec(layout: Layout) -> str:
    return "[" + ", ".join("{" + ", ".join(f'"{a}"' for a in axes) + "}" for axes in layout.dims) + "]"


def reshard_module(shape: Sequence[int], mesh: MeshSpec, src: Layout, steps: Sequence[Layout]) -> str:
    """The Shardy-form module: ``x`` split as `src`, constrained to each of `steps`, ``x + x`` returned."""
    t = "tensor<" + "x".join(map(str, shape)) + "xf32>"
    axes = ", ".join(f'"{n}"={s}' for n, s in zip(mesh.axis_names, mesh.shape))
    last = _spec(steps[-1])
    lines = [
        f"module @probe attributes {{mhlo.num_partitions = {mesh.size} : i32, mhlo.num_replicas = 1 : i32}} {{",
        f"  sdy.mesh @mesh = <[{axes}]>",
        f"  func.func @main(%arg0: {t} {{sdy.sharding = #sdy.sharding<@mesh, {_spec(src)}>}})"
        f" -> ({t} {{sdy.sharding = #sdy.sharding<@mesh, {last}>}}) {{",
    ]
    cur = "%arg0"
    for i, step in enumerate(steps):
        lines.append(f"    %c{i} = sdy.sharding_constraint {cur} <@mesh, {_spec(step)}> : {t}")
        cur = f"%c{i}"
    lines += [
        f"    %r = stablehlo.add {cur}, {cur} : {t}",
        f"    %o = sdy.sharding_constraint %r <@mesh, {last}> : {t}",
        f"    return %o : {t}",
        "  }",
        "}",
    ]
    return "\n".join(lines)


def probe_reshard(shape: Sequence[int], mesh: MeshSpec, src: Layout, steps: Sequence[Layout], system: str) -> Probe:
    """Compile `reshard_module` for `system` (compile-only) and read its TTNN collectives."""
    env.require()
    with tempfile.TemporaryDirectory(prefix="wancompile-probe-") as tmp:
        work = Path(tmp)
        (work / "m.mlir").write_text(reshard_module(shape, mesh, src, steps))
        res = env.run_worker(["compile", str(work / "m.mlir"), str(env.system_path(system)), str(work / "out")])
        line = next((x for x in res.stdout.splitlines() if x.startswith("TT-CHECK ")), None)
        if line is None:
            return Probe(False, f"the compiler process failed: {(res.stderr or '').strip().splitlines()[-1:]}")
        r = json.loads(line[len("TT-CHECK ") :])
        if not r["ok"]:
            return Probe(False, r["error"])
        text = Path(r["ttnn"]).read_text()
    found = Counter((c.kind, c.axes) for c in ttnn.parse_collectives(text, mesh))
    return Probe(True, ttnn={f"{k}:{'+'.join(a)}": n for (k, a), n in found.items()})
