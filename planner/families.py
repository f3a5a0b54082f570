"""The one dispatcher: which model family a captured graph is, and its planner.

Each family registers its name (the model name its plans carry), a predicate that recognises its
graph from the graph's structure, and the function that plans such a graph under a
`planner.request.PlanRequest`. The backend (`wancompile.backend`) asks `family_of` what a graph is and
`plan_request` for its plan; nothing else decides. A graph no family recognises has no family (the
backend runs it replicated: `wancompile.planning.replicated_plan`).

Families are tried in registration order, so a more specific predicate registers first. A new family
is one module with its plan function and one `register` call at the bottom of this module
(docs/contributing.md).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Optional

from planner.graph import Graph
from planner.plan import Plan
from planner.request import PlanRequest


@dataclass(frozen=True)
class PlannedFamily:
    """A registered family: ``name`` (``wan-dit``, ``wan-vae``), ``recognises(graph)``, ``plan(graph, request)``."""

    name: str
    recognises: Callable[[Graph], bool]
    plan: Callable[[Graph, PlanRequest], Plan]


FAMILIES: list[PlannedFamily] = []


def register(name: str, recognises: Callable[[Graph], bool], plan: Callable[[Graph, PlanRequest], Plan]) -> None:
    """Add a family (tried after those registered before it)."""
    if any(f.name == name for f in FAMILIES):
        raise ValueError(f"a planner family named {name!r} is already registered")
    FAMILIES.append(PlannedFamily(name, recognises, plan))


def family_of(graph: Graph) -> Optional[PlannedFamily]:
    """The first registered family whose predicate recognises `graph`, else None."""
    return next((f for f in FAMILIES if f.recognises(graph)), None)


def plan_request(graph: Graph, request: PlanRequest) -> Optional[Plan]:
    """`graph`'s plan by its family's planner, or None where no family recognises it."""
    family = family_of(graph)
    return None if family is None else family.plan(graph, request)


def is_vae_graph(graph: Graph) -> bool:
    """A Wan VAE decode (full-T, or one chunk of a chunked-T decode): `planner.vae_macros.is_vae_graph`."""
    from planner.vae_macros import is_vae_graph as vae

    return vae(graph)


def is_dit_graph(graph: Graph) -> bool:
    """A Wan DiT forward: attention (SDPA) in repeated blocks."""
    return any(n.op == "scaled_dot_product_attention" for n in graph) and bool(graph.blocks())


def _plan_vae(graph: Graph, request: PlanRequest) -> Plan:
    from planner.vae_plan import plan_request as plan_vae

    if request.cfg_parallel == "on":
        logging.getLogger("wancompile").info(
            "wan_autoshard: cfg_parallel=on applies to DiT graphs; the VAE decode is planned without it"
        )
    return plan_vae(graph, request)


def _plan_dit(graph: Graph, request: PlanRequest) -> Plan:
    from planner.cfg import plan_request as plan_dit  # a batch-2 graph (the CFG pair) gets the costed CFG choice

    return plan_dit(graph, request)


register("wan-vae", is_vae_graph, _plan_vae)
register("wan-dit", is_dit_graph, _plan_dit)
