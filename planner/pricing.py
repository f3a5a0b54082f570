"""What an option costs, the half of planning the DiT and the VAE planners share.

A model family (`planner.autoplan` for the DiT, `planner.vae_plan` for the VAE) finds its macros and
lists their options; this module prices them the same way for both:

- `evaluate_option`: the op rules run over a macro's ops under one option (its parameter layouts,
  the layouts of the stream values it reads, the constraints it places); `MacroPricing`: it and
  `param_bytes` in a family's setting (graph, mesh, hardware, dim values), the families' mixin;
- `param_bytes`: per-device bytes of a macro's parameters under an option's layouts;
- `activation_bytes`: the memory model's activation estimate, ``ACTIVATION_FACTOR`` × the largest
  per-op live set of the option's ops (`planner.propagate.Evaluation.peak_bytes`; the factor is
  constraint (d) of `planner.ilp`);
- `option`: the ILP's `Option` of an evaluated option (integer nanoseconds; KiB rounded *up*, so
  constraint (d) never undercounts the plan's own memory prediction);
- `weight_bytes`: per-device parameter bytes of a whole DiT under a plan's parameter specs;
- `reshard_seconds`: the price of a stream value moving between two layouts (an ILP edge);
- `collectives`: the plan's collective list from counted events (one `Collective` per kind, axes,
  bytes and place; axes in mesh order, as the HLO's replica groups name them); `bill`: that list
  and its seconds (a plan's communication term).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Hashable, Iterable, Mapping, Optional

from planner.collective import Collective
from planner.cost_model import collective_seconds, to_ns
from planner.graph import Graph, TensorMeta
from planner.hardware import HardwareProfile
from planner.ilp import KIB, Option
from planner.mesh import MeshSpec
from planner.placements import Layout, as_number, local_shape, numel
from planner.propagate import Evaluation, evaluate
from planner.reshard import redistribute
from planner.targets import Target

# Live at once around the largest op: its inputs and output (the live set), the residual stream they
# came from, and one fused temporary. An estimate; tests/test_vae_budget.py checks it bounds the
# measured peak within 2.5x.
ACTIVATION_FACTOR = 3


def evaluate_option(
    graph: Graph,
    nodes: Iterable[str],
    mesh: MeshSpec,
    hw: HardwareProfile,
    *,
    params: Mapping[str, Layout],
    stream: Mapping[str, Layout],
    forced: Mapping[str, Layout],
    values: Mapping[str, int],
    base: Optional[Mapping] = None,
    halo: bool = True,
    target: Optional[Target] = None,
) -> Evaluation:
    """Run the rules over `nodes` with the option's parameter layouts, the stream values it reads in
    `stream`'s layouts, its constraints `forced`; any other outside value as in `base` (else whole);
    `halo` and `target` as `planner.propagate.evaluate`'s."""
    nodes = list(nodes)
    inside = set(nodes)
    boundary = {k: v for k, v in (base or {}).items() if k not in inside}
    boundary.update({p: (lay,) for p, lay in params.items()})
    boundary.update({x: (lay,) for x, lay in stream.items()})
    return evaluate(
        graph,
        [graph[x] for x in nodes],
        mesh,
        hw,
        boundary=boundary,
        forced=forced,
        values=values,
        halo=halo,
        target=target,
    )


class MacroPricing:
    """Pricing in a family's setting: a mixin of a model family holding its graph ``g``, ``mesh``,
    hardware ``hw`` and symbolic dim ``vals``."""

    def evaluate_macro(self, m, *, params: Mapping[str, Layout], stream: Mapping[str, Layout], **how) -> Evaluation:
        """`evaluate_option` of macro `m`'s ops (`how`: its ``forced``, ``base``, ``halo``, ``target``)."""
        return evaluate_option(
            self.g, m.nodes, self.mesh, self.hw, params=params, stream=stream, values=self.vals, **how
        )

    def macro_param_bytes(self, m, layouts: Mapping[str, Layout]) -> float:
        """`param_bytes` of macro `m`'s parameters under `layouts`."""
        return param_bytes(self.g, m.params, layouts, self.mesh, self.vals)


def local_bytes(meta: TensorMeta, layout: Optional[Layout], mesh: MeshSpec, values: Mapping[str, int]) -> float:
    return as_number(numel(local_shape(meta.shape, layout, mesh)), dict(values)) * meta.itemsize


def param_bytes(
    graph: Graph, params: Iterable[str], layouts: Mapping[str, Layout], mesh: MeshSpec, values: Mapping[str, int]
) -> float:
    """Per-device bytes of the parameter placeholders `params` laid out as `layouts` (absent: whole)."""
    return sum(local_bytes(graph[p].out, layouts.get(p), mesh, values) for p in params)


def activation_bytes(ev: Evaluation) -> float:
    return ACTIVATION_FACTOR * ev.peak_bytes


def option(name: str, key: Hashable, ev: Evaluation, weights: float, once_ns: int = 0) -> Option:
    """The ILP option of an evaluated macro option holding `weights` parameter bytes per device."""
    return Option(
        name, key, to_ns(ev.seconds), once_ns, math.ceil(weights / KIB), math.ceil(activation_bytes(ev) / KIB)
    )


def reshard_seconds(
    meta: TensorMeta,
    actual: Layout,
    required: Layout,
    mesh: MeshSpec,
    hw: HardwareProfile,
    values: Mapping[str, int],
    target: Optional[Target] = None,
) -> float:
    if actual == required:
        return 0.0
    return sum(
        collective_seconds(kind, as_number(numel(shape), dict(values)) * meta.itemsize, axes, mesh, hw)
        for kind, axes, shape in redistribute(meta, actual, required, mesh, target)
    )


def collectives(events: Counter, mesh: MeshSpec) -> tuple[Collective, ...]:
    """``{(kind, axes, bytes, where): count}`` -> the plan's collectives, sorted by place."""
    order = {a: i for i, a in enumerate(mesh.axis_names)}
    return tuple(
        Collective(kind, tuple(sorted(axes, key=order.get)), nbytes, count, where)
        for (kind, axes, nbytes, where), count in sorted(events.items(), key=lambda kv: kv[0][3])
    )


def bill(events: Counter, mesh: MeshSpec, hw: HardwareProfile) -> tuple[tuple[Collective, ...], float]:
    """A plan's collectives from its counted events (`collectives`) and their seconds per run: the
    communication term of its predicted time (no overlap)."""
    out = collectives(events, mesh)
    return out, sum(collective_seconds(c.kind, c.bytes, c.axes, mesh, hw) * c.count for c in out)


def weight_bytes(graph: Graph, st, specs: Mapping, mesh: MeshSpec, values, num_blocks: int, copies: int) -> float:
    """Per-device parameter bytes of the whole model under the partition specs `specs` (by parameter
    name): the captured graph's parameters outside the main stack, and the main stack's
    representative block's under each of the `num_blocks` blocks' own specs (an FSDP block range
    differs; a name the specs lack reads the representative's)."""

    def size(p, name: str) -> float:
        spec = specs.get(name, specs.get(p.param))
        return local_bytes(p.out, Layout.from_spec(spec) if spec is not None else None, mesh, values)

    outside = sum(size(p, p.param) for p in graph.params() if not st.in_main(graph, p))
    blocks = sum(
        size(p, graph.in_block(p, p.param, k)) for p in graph.params() if st.in_rep(graph, p) for k in range(num_blocks)
    )
    return (outside + blocks) * copies
