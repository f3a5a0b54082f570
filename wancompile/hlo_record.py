"""Which partitioned HLO module each compiled program is, recorded from XLA's dump directory.

XLA writes a program's optimized HLO to ``--xla_dump_to`` when it compiles it; a program XLA serves
from its compile cache (same code, plan and shapes compiled earlier in this process) writes nothing.
So each `HloRecord` watches one program's first run (`start` / `finish`): the module that appeared
meanwhile is that program's, and is remembered under a key naming what the HLO depends on
(`program_key`, `fold_key`), so a later program with the same key finds its HLO though no new module
was written. The key -> module table is this module's own and is read nowhere else.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
import torch.fx as fx

from planner.plan import Plan

_BY_KEY: dict[str, Path] = {}  # program key -> its partitioned HLO, for this process


class HloRecord:
    """The partitioned HLO of one program, once it has run with a dump directory set."""

    def __init__(self) -> None:
        self.path: Optional[Path] = None

    def start(self) -> Optional[tuple[Path, dict]]:
        """Before a run that may compile: the dump directory and its state, or None (nothing to record)."""
        from wancompile import hlo, runtime

        dump = runtime.current_dump_dir() if self.path is None else None
        return (dump, hlo.dump_state(dump)) if dump else None

    def finish(self, started: Optional[tuple[Path, dict]], key: str) -> None:
        """After that run: the module it wrote is this program's (none written: XLA reused the one of `key`)."""
        from wancompile import hlo

        if started is None:
            return
        new = hlo.new_modules(*started)
        if new:
            _BY_KEY[key] = hlo.main_module(new)
        self.path = _BY_KEY.get(key)


def program_key(gm: fx.GraphModule, plan: Plan, args: Sequence[Any]) -> str:
    """What a main program's HLO depends on: its code, the plan's layouts and mesh, its arguments' shapes."""
    shapes = [(tuple(a.shape), str(a.dtype)) if isinstance(a, torch.Tensor) else repr(a) for a in args]
    record = plan.to_json()
    layouts = json.dumps(
        {"params": record["params"], "acts": record["activations"], "mesh": plan.mesh.to_json()}, sort_keys=True
    )
    return hashlib.sha1((gm.code + layouts + repr(shapes)).encode()).hexdigest()


def fold_key(gm: fx.GraphModule, inputs: Sequence[tuple], plan: Plan) -> str:
    """What a fold program's HLO depends on: its ops (constraints included, node names not), its inputs'
    specs and shapes — not the rest of the plan, or a second plan with the same packing (served by XLA's
    compile cache, so no new dump) would find no HLO."""
    return hashlib.sha1((_structure(gm) + repr(list(inputs)) + json.dumps(plan.mesh.to_json())).encode()).hexdigest()


def _structure(gm: fx.GraphModule) -> str:
    """The ops of `gm` and how they connect, without node names (equal for equal programs)."""
    index = {n: i for i, n in enumerate(gm.graph.nodes)}
    return repr(
        [
            (n.op, getattr(n.target, "__qualname__", str(n.target)), fx.node.map_arg((n.args, n.kwargs), index.get))
            for n in gm.graph.nodes
        ]
    )
