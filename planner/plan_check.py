"""Whether a plan fits a captured graph (`check_fits`, what `Plan.check` runs) and the geometry it is checked by.

A plan names parameters, ops (by `Location`) and a DiT geometry (`model_geometry`: heads, head dim,
tokens); applied to a graph it must name exactly the graph's parameters, constrain ops the graph
has, divide every tensor it shards on its mesh, and have been made for the same geometry. Each
mismatch is a `PlanError` whose message says what differs and how to get a plan that fits
(re-plan, the plan for this resolution, the rewrites it was made with).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Protocol

from planner.decision import MAIN_STACK
from planner.errors import PlanError
from planner.graph import Graph
from planner.mesh import MeshError
from planner.placements import check_spec


class Fitted(Protocol):
    """What the check reads of a `planner.plan.Plan` (which calls it: the plan format depends on the check, not
    the other way round)."""

    params: Mapping[str, Any]
    activations: Any
    layers: Optional[int]
    mesh: Any
    model: str
    geometry: Any


def check_fits(plan: Fitted, graph: Graph, *, unpadded: Optional[Graph] = None) -> None:
    """Raise PlanError unless the graph has the geometry the plan was made for, the plan names
    exactly the graph's parameters, every spec divides its tensor on this mesh, and every
    activation location exists. A plan that pads heads (`Plan.head_padding`) names ops of the padded
    graph; its geometry is the model's: pass the graph before padding as `unpadded`."""
    _check_geometry(plan, unpadded if unpadded is not None else graph)
    shapes = {n.param: n.out.shape for n in graph.params()}
    unknown = sorted(set(plan.params) - set(shapes))
    missing = sorted(set(shapes) - set(plan.params))
    if unknown or missing:
        parts = []
        if unknown:
            parts.append(f"{len(unknown)} parameter(s) the model does not have (e.g. {', '.join(unknown[:3])})")
        if missing:
            parts.append(f"no spec for {len(missing)} of the model's parameter(s) (e.g. {', '.join(missing[:3])})")
        blocks = len(graph.blocks(MAIN_STACK))  # the stack `layers` counts
        if plan.layers and blocks and plan.layers != blocks:
            parts.append(f"it covers {plan.layers} layers, this model has {blocks}")
        raise PlanError(
            f"plan for model {plan.model!r} does not fit this model ({graph.model or 'captured graph'}): "
            + "; ".join(parts)
            + ". Was it saved for another config? Re-plan (drop the `plan` option) or regenerate it for this model."
        )
    for name, spec in plan.params.items():
        try:
            check_spec(spec, shapes[name], plan.mesh, f"plan parameter {name}")
        except MeshError as e:
            raise PlanError(str(e)) from None
    by_loc = graph.by_location()
    for c in plan.activations:
        node = by_loc.get(c.location)
        if node is None:
            raise PlanError(
                f"plan constrains {c.location}, but the captured graph has no such op. The plan was made for a "
                f"different model structure or rewrite set; re-plan, or keep the `rewrites` option it was made with."
            )
        if c.input is not None:
            if not 0 <= c.input < len(node.inputs) or not graph[node.inputs[c.input]].outputs:
                raise PlanError(
                    f"plan constrains input {c.input} of {c.location}, which has no such tensor input "
                    f"({len(node.inputs)} input(s)); re-plan for this model"
                )
            shape = graph[node.inputs[c.input]].out.shape
        elif c.output >= len(node.outputs):
            raise PlanError(
                f"plan constrains output {c.output} of {c.location}, which has {len(node.outputs)} output(s)"
            )
        else:
            shape = node.outputs[c.output].shape
        try:
            check_spec(c.spec, shape, plan.mesh, f"plan activation {c.location}")
        except MeshError as e:
            raise PlanError(str(e)) from None


def _check_geometry(plan: Fitted, graph: Graph) -> None:
    here = model_geometry(graph)
    if not plan.geometry or not here:
        return
    wrong = []
    for key, unit in (("heads", "attention heads"), ("head_dim", "head dim"), ("tokens", "tokens")):
        a, b = plan.geometry.get(key), here.get(key)
        if a is None or b is None or not isinstance(a, int) or not isinstance(b, int):
            continue  # a symbolic token count: its guards decide (planner.guards)
        if a != b:
            wrong.append(f"{unit} {a} (this model: {b})")
    if wrong:
        hint = (
            " — another resolution or frame count: save one plan per resolution, or compile with dynamic=True"
            if len(wrong) == 1 and wrong[0].startswith("tokens")
            else ""
        )
        raise PlanError(
            f"plan for model {plan.model!r} was made for "
            + ", ".join(wrong)
            + hint
            + ". Re-plan for this model (drop the `plan` option) or pass the plan made for it."
        )


def model_geometry(graph: Graph) -> dict[str, Any]:
    """Heads, head dim and token count of a Wan DiT graph, read from block 0's self-attention
    (SDPA output ``(B, heads, tokens, head_dim)``); {} for a graph without one (the VAE)."""
    sdpa = next((n for n in graph if n.block == 0 and n.op == "scaled_dot_product_attention"), None)
    if sdpa is None or len(sdpa.out.shape) != 4:
        return {}
    _, heads, tokens, head_dim = sdpa.out.shape
    return {
        "heads": int(heads),
        "head_dim": int(head_dim),
        "tokens": tokens if isinstance(tokens, int) else str(tokens),
    }
