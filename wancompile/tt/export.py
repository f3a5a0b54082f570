"""Each program a `ShardedProgram` traces, written in the form tt-mlir partitions.

`ShardyExport` is handed to a program as its ``stablehlo_sink``: when the program traces (the main
program, and its fold program of parameter-only values), the traced outputs come here before XLA
compiles them. For each program it writes, into its folder:

- ``<name>.mlirbc``: torch_xla's StableHLO of the program as a *portable artifact* (versioned VHLO
  bytecode), the exact program tt-xla would hand tt-mlir, readable by any later MLIR;
- ``<name>.gspmd.mlir``: the same program as torch_xla's text, GSPMD-annotated (for reading; its i1
  constants are bit-packed, which is why the conversion reads the artifact);
- ``<name>.shardings.json``: the plan's specs, keyed by the GSPMD annotation torch_xla writes for each
  (torch_xla itself makes the key, from a tensor marked with the spec), with the mesh's axis names and
  sizes: the worker's Shardy conversion looks every annotation up here, so the Shardy module says
  exactly what the plan says (and an argument torch_xla left unannotated, a placeholder, is replicated);
- ``<name>.arguments.json``: per argument of the module, in its order, the names of the parameters it
  holds (a folded value: those it was computed from; an input: none), which is how a reader of the
  compiled program tells which block an op belongs to (`wancompile.tt.ttnn.by_block`);
- ``<name>.tt.mlir``: the Shardy-form module (`wancompile.tt.worker` ``shardy``), its arguments that hold
  parameters marked ``parameter`` as tt-xla marks them (but those the plan gathers per use), when the
  worker's interpreter has jaxlib (`wancompile.tt.env`); otherwise the first two, and a log line how to get it.

Names: the model name (``wan-dit``, ``wan-vae``), ``.cfg2`` for a batch-2 CFG graph, ``.fold`` for the fold
program; a second program of the same name in one folder gets ``-2``, ``-3``, ....
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Iterable, Optional

from planner.placements import Layout
from planner.plan import Plan
from wancompile.tt.mesh import sdy_mesh

log = logging.getLogger("wancompile")


class ShardyExport:
    def __init__(
        self, directory: Path, name: str, plan: Plan, mesh: Any, convert: bool = True, specs: Iterable[tuple] = ()
    ) -> None:
        self.directory, self.name, self.plan, self.mesh, self.convert = Path(directory), name, plan, mesh, convert
        self.specs = frozenset(specs)  # layouts the program marks beyond the plan's (`ShardedProgram.specs`)
        self.written: dict[str, Path] = {}  # program ("main", "fold") -> its .tt.mlir (or .mlirbc if not converted)
        self.names: dict[str, str] = {}  # program -> file stem

    def __call__(self, program: str, outs: list, arguments: Iterable[tuple[Any, tuple[str, ...]]] = ()) -> None:
        """Write `program` (``main`` or ``fold``) traced to `outs`; `arguments`: its argument tensors, each
        with the parameter names it stands for (`ShardedProgram.named_arguments`)."""
        import torch_xla

        if program in self.written:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        stem = self._stem(self.name if program == "main" else f"{self.name}.{program}")
        device = str(torch_xla.device())
        artifact = self.directory / f"{stem}.mlirbc"
        artifact.write_bytes(torch_xla._XLAC._get_stablehlo(outs, device, [device], True))
        # the same program as text, GSPMD-annotated: what stock torch_xla emits (for reading and comparing)
        (self.directory / f"{stem}.gspmd.mlir").write_text(
            torch_xla._XLAC._get_stablehlo(outs, device, [device], False).decode()
        )
        named = self.directory / f"{stem}.arguments.json"
        named.write_text(json.dumps(argument_names(outs, arguments)))
        shardings = self.directory / f"{stem}.shardings.json"
        table = shardings_table(self.plan, self.mesh, self.specs)
        # under SPMD torch_xla annotates every argument it holds data for; one without an annotation is a
        # placeholder of a program traced, never run (`ShardedProgram.trace_only`): a replicated parameter
        table["unannotated_arguments"] = "replicated"
        shardings.write_text(json.dumps(table, indent=1))
        self.names[program] = stem
        self.written[program] = artifact
        if self.convert:
            out = convert(artifact, shardings, self.directory / f"{stem}.tt.mlir", named)
            if out is not None:
                self.written[program] = out

    def _stem(self, base: str) -> str:
        stem, k = base, 1
        while (self.directory / f"{stem}.mlirbc").exists():
            k += 1
            stem = f"{base}-{k}"
        return stem


def argument_names(outs: list, arguments: Iterable[tuple[Any, tuple[str, ...]]]) -> list[list[str]]:
    """Per parameter of the module torch_xla builds for `outs`, in its order (that of its device data, which
    the dynamo bridge relies on too), the names `arguments` gives its tensor; [] for one not among them."""
    import torch_xla

    names = {torch_xla._XLAC._xla_get_tensor_id(t): list(n) for t, n in arguments}
    ids, _ = torch_xla._XLAC._get_tensors_xla_device_data_node(outs)
    return [names.get(i, []) for i in ids]


def shardings_table(plan: Plan, mesh: Any, extra: Iterable[tuple] = ()) -> dict:
    """{"shape", "axis_names", "shardings": {GSPMD annotation text: per-dim mesh axes}} for every spec
    of `plan` (parameters and activations) and the `extra` ones the program marks, each annotation made
    by torch_xla from a tensor marked with that spec on `mesh` (the program's torch_xla Mesh)."""
    import torch
    import torch_xla
    import torch_xla.distributed.spmd as xs

    specs = {tuple(s) for s in plan.params.values()} | {tuple(a.spec) for a in plan.activations} | set(extra)
    specs |= {tuple(v) for a in plan.activations for v in a.via}
    table: dict[str, list[list[str]]] = {}
    for spec in sorted(specs, key=repr):
        probe = torch.zeros([plan.mesh.size] * len(spec), device=torch_xla.device())
        xs.mark_sharding(probe, mesh, spec)
        # a spec over size-1 axes only is the same annotation as a replicated one: either reads the same
        table.setdefault(torch_xla._XLAC._get_xla_sharding_spec(probe), [list(d) for d in Layout.from_spec(spec).dims])
    written = sdy_mesh(plan.mesh)  # the axes in an order tt-mlir accepts (wancompile.tt.mesh)
    return {"shape": list(written.shape), "axis_names": list(written.axis_names), "shardings": table}


def convert(artifact: Path, shardings: Path, dst: Path, arguments: Optional[Path] = None) -> Optional[Path]:
    """The Shardy-form module of `artifact` at `dst` (the worker's ``shardy`` verb; with `arguments`, the
    ``.arguments.json`` beside it, its parameter arguments marked as tt-xla marks them); None with a log
    line when the worker's interpreter has no jaxlib."""
    from wancompile.tt import env

    why = env.available(need_plugin=False)
    if why is not None:
        log.warning("wan_autoshard: %s.tt.mlir not written: %s", artifact.stem, why)
        return None
    res = env.run_worker(
        ["shardy", str(artifact), str(shardings), str(dst), *([str(arguments)] if arguments else [])], timeout=600
    )
    if res.returncode != 0:
        raise RuntimeError(
            f"Shardy conversion of {artifact} failed: {(res.stderr or res.stdout).strip().splitlines()[-1:]}"
        )
    return dst
