"""Which partitioned HLO module each compiled program is, recorded from XLA's dump directory.

XLA writes a program's optimized HLO to ``--xla_dump_to`` when it compiles it; a program XLA serves
from its compile cache (the same traced graph compiled earlier in this process) writes nothing.
So each `HloRecord` watches one program's first run (`start` / `finish`): the module that appeared
meanwhile is that program's, and is remembered under the key XLA's cache itself uses, the traced
graph's hash (``torch_xla._XLAC._get_graph_hash`` of the tensors the run syncs), so a later program
served from the cache finds its HLO though no new module was written. Two programs that trace to one
graph from different FX code (node names, how an op was spelled) share the cache entry and so the
record; a key of our own making would miss them. A main program that is not replayed syncs through
``torch_xla.sync()`` (every live tensor), whose hash is not known beforehand: it is keyed on what its
HLO depends on instead (`program_key`). The key -> module table is this module's own and is read
nowhere else.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import torch
import torch.fx as fx

from planner.plan import Plan

_BY_KEY: dict[Union[bytes, str], Path] = {}  # program key -> its partitioned HLO, for this process


class HloRecord:
    """The partitioned HLO of one program, once it has run with a dump directory set."""

    def __init__(self) -> None:
        self.path: Optional[Path] = None

    def start(self) -> Optional[tuple[Path, dict]]:
        """Before a run that may compile: the dump directory and its state, or None (nothing to record)."""
        from wancompile import hlo, runtime

        dump = runtime.current_dump_dir() if self.path is None else None
        return (dump, hlo.dump_state(dump)) if dump else None

    def finish(self, started: Optional[tuple[Path, dict]], key: Union[bytes, str]) -> None:
        """After that run: the module it wrote is this program's (none written: XLA reused the one of
        `key`, the run's graph hash or `program_key`)."""
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
