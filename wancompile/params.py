"""The program's arguments on the device: parameters sharded once and cached, inputs placed per call.

A captured graph's placeholders are the module's parameters and buffers (a ``planner.graph.Node``
with a ``param`` name) followed by its inputs. `ProgramArguments` turns one call's values into what
the lowered program reads: a host tensor is copied to the XLA device and given the plan's sharding,
an XLA tensor without a sharding is given it. Parameters go through `ParamCache`, so a parameter is
copied and sharded once per tensor version and every later call is a dict lookup per parameter.
"""

from __future__ import annotations

import operator
import weakref
from typing import Any, Callable, Optional, Sequence

import torch

from planner.mesh import PartitionSpec


class ParamCache:
    """Parameters as the program reads them, prepared once per tensor version: an XLA copy of a host
    parameter (made and sharded on first use), or an XLA parameter checked to carry a sharding. Keyed
    by identity and ``_version``, so a per-call hit is a dict lookup (a 40-block DiT has ~1,000)."""

    def __init__(self) -> None:
        # id -> (weak ref to the caller's tensor, its version, the XLA copy or None for "use it as is")
        self._copies: dict[int, tuple[weakref.ref, int, Optional[torch.Tensor]]] = {}

    def get(self, t: torch.Tensor, prepare: Callable[[torch.Tensor], Optional[torch.Tensor]]) -> torch.Tensor:
        hit = self._copies.get(id(t))
        if hit is not None and hit[0]() is t and hit[1] == t._version:
            return t if hit[2] is None else hit[2]
        x = prepare(t)
        self._copies[id(t)] = (weakref.ref(t), t._version, None if x is t else x)
        return x

    def holds(self, t: torch.Tensor) -> bool:
        """Has this cache prepared `t` (the tensor itself, alive)?"""
        hit = self._copies.get(id(t))
        return hit is not None and hit[0]() is t


_VERSION = operator.attrgetter("_version")


class ProgramArguments:
    """Per placeholder of a graph: its parameter name (None for an input) and the layout it is read in."""

    def __init__(self, params: Sequence[Optional[str]], specs: Sequence[Optional[PartitionSpec]], mesh: Any, device):
        self.params, self.specs, self.mesh, self.device = list(params), list(specs), mesh, device
        self.cache = ParamCache()
        self._preparers = [self._preparer(spec) for spec in self.specs]
        self.inputs = [i for i, param in enumerate(self.params) if param is None]  # positions of the inputs
        positions = [i for i, param in enumerate(self.params) if param is not None]
        self._take_params = operator.itemgetter(*positions) if len(positions) > 1 else None
        self._last: Optional[tuple] = None  # (the parameters, their ids, their versions) of the last call

    def to_device(self, args: Sequence[Any], needed: Optional[Sequence[bool]] = None) -> list[Any]:
        """The arguments on the device, parameters sharded and cached; where `needed` is False the
        argument is left as it is (a parameter only the fold program reads is not kept on device)."""
        out = list(args)
        for i, a in enumerate(args):
            if not isinstance(a, torch.Tensor) or (needed is not None and not needed[i]):
                continue
            out[i] = self.cache.get(a, self._preparers[i]) if self.params[i] is not None else self._preparers[i](a)
        return out

    def placeholders(self, args: Sequence[Any], real: Sequence[bool]) -> list[Any]:
        """The arguments for a program that is traced, never run (`ShardedProgram.trace_only`): a
        replicated parameter becomes a placeholder of its shape and dtype, which holds no buffer (its
        value is never read; on a 32-device mesh a replicated copy per device would take 32 times its
        bytes of host memory), marked replicated in the exported program (`wancompile.tt.export`). Where
        `real` is True (what a program that does run reads, e.g. the fold program) the argument is put
        on the device as `to_device` does."""
        from torch_xla.core.xla_builder import create_placeholder_tensor

        out = self.to_device(args, [r or param is None for r, param in zip(real, self.params)])
        for i, (a, param, spec, r) in enumerate(zip(args, self.params, self.specs, real)):
            if param is not None and not r and isinstance(a, torch.Tensor):
                out[i] = (
                    create_placeholder_tensor(tuple(a.shape), a.dtype)
                    if spec is None or all(e is None for e in spec)
                    else self._preparers[i](a)
                )
        return out

    def same_parameters(self, args: Sequence[Any]) -> bool:
        """Are the parameters in `args` the last call's tensors at the same versions? (C-level maps, no
        Python loop: ~1,000 parameters cost microseconds. The tensors are held, so an id is not reused.)"""
        if self._take_params is None:
            return False
        params = self._take_params(args)
        ids, versions = list(map(id, params)), list(map(_VERSION, params))
        last, self._last = self._last, (params, ids, versions)
        return last is not None and last[1] == ids and last[2] == versions

    def inputs_to_device(self, args: Sequence[Any], out: list) -> list:
        """`out` (the last call's program arguments) with this call's inputs put in place."""
        for i in self.inputs:
            a = args[i]
            out[i] = self._preparers[i](a) if isinstance(a, torch.Tensor) else a
        return out

    def uncached(self, args: Sequence[Any], i: int) -> torch.Tensor:
        """Argument `i` on the device and sharded, not kept in the cache (read by the fold program only)."""
        return self._preparers[i](args[i])

    def holds(self, t: torch.Tensor) -> bool:
        """Is `t` one of the parameters this program has on the device?"""
        return self.cache.holds(t)

    def _preparer(self, spec: Optional[PartitionSpec]) -> Callable[[torch.Tensor], torch.Tensor]:
        """Argument -> the XLA tensor the program reads: a host tensor copied and sharded as `spec`
        says, an XLA tensor given the sharding when it has none."""
        import torch_xla
        import torch_xla.distributed.spmd as xs

        split = spec is not None and any(e is not None for e in spec)

        def prepare(a: torch.Tensor) -> torch.Tensor:
            if a.device.type == "xla":
                if split and not torch_xla._XLAC._get_xla_sharding_spec(a):
                    xs.mark_sharding(a, self.mesh, spec)
                return a
            # Split on the host and send each device its shard, not a full copy each then resharded (32
            # copies of every weight on a 32-device mesh). torch_xla 2.9 cannot split some layouts this
            # way ("too many indices for tensor of dimension N": a tensor that stays replicated on a mesh
            # axis, when it has 1 dim, or on a CFG split's 3-D mesh): those take the copy-then-reshard path,
            # to the same layout.
            if split:
                sharding = xs.ShardingSpec(self.mesh, tuple(spec)).xla_spec(a)
                try:
                    return torch_xla._XLAC._xla_tensors_from_aten([a.detach()], [str(self.device)], [sharding])[0]
                except IndexError:
                    pass
            x = a.detach().to(self.device)
            if split:
                xs.mark_sharding(x, self.mesh, spec)
            return x

        return prepare
