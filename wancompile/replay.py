"""Trace once, replay by graph hash: one compiled XLA program run on new arguments without re-tracing.

The first call for an input signature runs the FX graph on XLA tensors under lazy tracing in program
order (so diffusers' RoPE ``out[..., 0::2] = ...`` writes stay before their reads: docs/numerics.md),
compiles the traced graph and records its hash and where each of its inputs comes from (a call
argument, or a constant the trace made, such as a scalar). Every later call with that signature hands
the arguments straight to ``torch_xla._XLAC._run_cached_graph`` — the mechanism torch_xla's dynamo
bridge replays with — with no FX interpretation and no IR building. A graph that mutates an input,
draws random numbers, copies a device value to the host mid-program (its value would come back as a
constant frozen into the replay) or returns an input unchanged is not replayed; `Replay.trace` says why.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Optional, Sequence

import torch

_TENSOR = object()  # marks a tensor output leaf in `Replay.leaves`


def _host_reads() -> int:
    """Device-to-host transfers so far in this process (torch_xla's metric)."""
    import torch_xla.debug.metrics as met

    data = met.metric_data("TransferFromDeviceTime")
    return data[0] if data else 0


class Replay:
    """One traced and compiled program, replayed by graph hash.

    `trace` runs `fn` once on `args` (XLA tensors holding device data, or Python values), compiles
    the graph rooted at its tensor outputs and runs it; afterwards ``replay(args)`` runs the cached
    computation on new arguments of the same signature. ``sources[i]`` is the argument position of
    the computation's i-th input, or None for a constant of the trace (kept in ``constants``)."""

    def __init__(
        self,
        graph_hash: Any,
        sources: list[Optional[int]],
        constants: list[Optional[torch.Tensor]],
        leaves: list[Any],
        treespec: Any,
    ) -> None:
        self.graph_hash, self.sources, self.constants = graph_hash, sources, constants
        self.leaves, self.treespec = leaves, treespec  # output leaves, _TENSOR where a tensor goes
        self.runs = 0
        self._extra = [c for c in constants if c is not None]
        self._take: Optional[Callable] = None  # picks the computation's inputs from (args + constants), C-level

    @classmethod
    def trace(
        cls,
        fn: Callable,
        args: Sequence[Any],
        device: torch.device,
        refuse: str = "",
        sink: Optional[Callable[[list[torch.Tensor]], None]] = None,
    ) -> tuple[Optional["Replay"], Any, str, list[int]]:
        """(replay or None, this call's output, why not replayable or "", positions of the arguments
        the graph wrote into); `refuse`: a reason known beforehand not to replay; `sink`: handed the
        traced output tensors before anything is compiled (`wancompile.tt.export`)."""
        import torch.utils._pytree as pytree
        import torch_xla

        C = torch_xla._XLAC
        tensor_args = [(i, a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        if any(C._check_tensor_need_materialization([a for _, a in tensor_args])):
            C._xla_sync_multi([a for _, a in tensor_args], devices=[], wait=True, sync_xla_data=True)
        arg_of = {C._xla_get_tensor_id(a): i for i, a in tensor_args}
        host_reads = _host_reads()
        out = fn(*args)
        host_reads = _host_reads() - host_reads
        leaves, treespec = pytree.tree_flatten(out)
        outs = [t for t in leaves if isinstance(t, torch.Tensor)]
        if sink is not None:
            sink(outs)
        written = C._check_tensor_need_materialization([a for _, a in tensor_args])
        mutated = [i for (i, _), w in zip(tensor_args, written) if w]
        why = (
            refuse
            or (mutated and "the graph writes into one of its inputs")
            or (host_reads and "the graph copies a device value to the host mid-program (a replay would freeze it)")
            or (
                not all(C._check_tensor_need_materialization(outs))
                and "the graph returns an input (or a constant) unchanged"
            )
            or ""
        )
        if why:
            torch_xla.sync()
            return None, out, why, mutated
        ids, values = C._get_tensors_xla_device_data_node(outs)
        if C._get_seed_info_id() in ids:
            torch_xla.sync()
            return None, out, "the graph draws random numbers (its seed must advance per call)", []
        sources = [arg_of.get(i) for i in ids]
        constants = [None if src is not None else v for src, v in zip(sources, values)]
        graph_hash = C._get_graph_hash(outs)
        C._xla_warm_up_cache(outs, [])
        C._clear_pending_irs(str(device))
        replay = cls(
            graph_hash, sources, constants, [_TENSOR if isinstance(t, torch.Tensor) else t for t in leaves], treespec
        )
        return replay, replay(args), "", []

    def __call__(self, args: Sequence[Any]) -> Any:
        import torch.utils._pytree as pytree
        import torch_xla

        if self._take is None and self.sources:
            n, extra = len(args), iter(range(len(args), len(args) + len(self._extra)))
            index = [src if src is not None else next(extra) for src in self.sources]
            self._nargs = n
            self._take = (lambda xs: [xs[index[0]]]) if len(index) == 1 else operator.itemgetter(*index)
        if self.sources and len(args) != self._nargs:
            raise ValueError(f"replay of a {self._nargs}-argument program called with {len(args)} arguments")
        inputs = list(self._take(list(args) + self._extra)) if self.sources else []
        results = iter(torch_xla._XLAC._run_cached_graph(self.graph_hash, inputs))
        self.runs += 1
        return pytree.tree_unflatten(
            [next(results) if leaf is _TENSOR else leaf for leaf in self.leaves], self.treespec
        )
