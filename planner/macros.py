"""The one `Macro` of every model family, and what the engine does with macros whatever the family.

A macro is a unit of work the ILP decides once: its ops (with the glue assigned to it) and the
parameters they read. A family finds its macros (`planner.structure.find_structure` for the DiT,
`planner.vae_macros.find_macros` for the VAE) and lists their options; the pieces written here
are the same for both:

- `crossing`: the values a macro reads from outside it (not parameters): the stream it reads,
  priced in the option's stream layout, and the ILP edges' tensors;
- `stream_edges`: the ILP's stream-layout edges from the values crossing between groups, each
  (key, key) pair priced by the family;
- `restrict`: a preset's or ``only=``'s regular expressions applied to a macro's options (the kept
  ones, and an `Exclusion` with the reason for each other).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Hashable, Iterable, Mapping, Optional, Sequence

from planner.graph import Graph, Node
from planner.ilp import Edge
from planner.plan import Exclusion


@dataclass(frozen=True)
class Macro:
    """A macro: ``name`` (block-relative for the DiT's block macros, ``attn1``; a module path or
    ``head``/``tail`` elsewhere), its ``kind`` and ops; the fields after ``params`` are one family's."""

    name: str
    kind: str  # DiT: attention | mlp; VAE: resblock | attention | upsample | shortcut | head | tail
    nodes: tuple[str, ...]  # its ops plus the glue assigned to it, graph order
    params: tuple[str, ...] = ()  # placeholder node names it reads
    # VAE: its ops and shapes; macros with equal signatures price alike and share one ILP group
    signature: tuple = ()
    # DiT (`planner.structure`)
    module: str = ""  # module path in the captured graph
    in_block: bool = False
    linears: tuple[str, ...] = ()  # linear node names, graph order
    width: int = 0  # heads (attention) or hidden features (mlp)
    self_attention: bool = False
    sdpa: Optional[str] = None
    qkv: tuple[str, ...] = ()  # the linear producing each of SDPA's q, k, v (one linear twice when fused)
    kv: tuple[str, ...] = ()  # the linears producing the K and V of every SDPA (I2V: text and image)
    packed: tuple = ()  # `planner.packing.Packed`: weights/biases its linears read packed from parameters
    family: str = ""  # a further block family's prefix (``vace_blocks``): the macro spans its blocks
    parts: tuple["Macro", ...] = ()  # that family's per-block macros, one per captured block


def crossing(graph: Graph, m: Macro, keep: Optional[Callable[[Node], bool]] = None) -> list[str]:
    """The values `m`'s ops read from outside it, in the order they are read, once each: neither its
    own nor parameters nor values without a tensor; with `keep`, only those it accepts."""
    inside = set(m.nodes)
    out: list[str] = []
    for x in m.nodes:
        for i in graph[x].inputs:
            src = graph[i]
            if i in inside or src.is_param or not src.outputs or i in out:
                continue
            if keep is None or keep(src):
                out.append(i)
    return out


Price = Callable[[Sequence[str], Hashable, Hashable], int]


def stream_edges(
    crossings: Mapping[tuple[str, str], Sequence[str]],
    keys: Mapping[str, Iterable[Hashable]],
    price: Price,
    count: int = 1,
) -> list[Edge]:
    """The ILP's edges: per (producing group, reading group) of `crossings`, the integer cost
    ``price(tensors, k, l)`` of the values crossing there with the producer in stream key k and the
    reader in key l, for every pair of the groups' `keys`; each edge runs `count` times per forward."""
    return [
        Edge(a, b, count, {(k, l): price(tensors, k, l) for k in keys[a] for l in keys[b]})
        for (a, b), tensors in crossings.items()
    ]


def restrict(
    options: Sequence, patterns: Iterable[Optional[str]], reason: str, name: Callable = lambda s: s.name
) -> tuple[list, list[Exclusion]]:
    """(the options whose name every pattern of `patterns` matches (``re.search``; None matches
    all), an `Exclusion` for reason `reason` of each other)."""
    wanted = [p for p in patterns if p is not None]
    kept = [s for s in options if all(re.search(p, name(s)) for p in wanted)]
    return kept, [Exclusion(name(s), reason) for s in options if s not in kept]
