"""Pins: a plan that leaves the partitioner no choice.

A plan decides parameter specs and a few activation constraints; every other layout follows from the
op rules (`planner.propagate`), which model GSPMD's propagation. Shardy — the partitioner inside
tt-mlir — propagates differently (DESIGN.md §4: it filled the layouts our plans left open with other
collectives), so for the prediction to hold on both partitioners the plan must pin every layout it
decides. `pin_layouts` propagates the plan over the whole graph and adds activation constraints:

- **where the op computes**: every op output gets its layout pinned — the layout the op rules give
  it. Where the plan constrains the output to another layout (a reshard after the op, priced as such),
  the op's own layout is pinned first and the plan's constraint follows it: Shardy otherwise takes a
  constraint on an op's result as the op's result sharding and propagates it into the op (a reshape
  split on a dim its operand cannot carry is then refused by tt-mlir, a matmul gathers other operands);
  two constraints keep "compute in A, then reshard A → B" exactly as the plan priced it.
- not pinned: the values from a reduction to the op that slices its result, where the op rules price the
  pair as one reduce-scatter (`Evaluation.scattered`): pinned whole, they would force the all-reduce;
  unreduced partial sums (neither partitioner has an annotation for them; the reduction
  is forced by the pinned reader, as the plan prices it); buffer writes (``setitem``'s value is the
  buffer torch_xla re-creates per write, ``empty_like`` is only read through those writes); values
  made from literals alone (host constants of the trace, not partitioned values); identities the
  lowering drops (a device-only ``.to``); values of rank > 5, which torch_xla cannot annotate.

The output k of a tuple-valued op is pinned at that op with ``output=k`` (how the lowering and the
export address it). Pins repeat what the op rules predict, so on GSPMD they are meant to cost nothing;
the fidelity tests compile pinned plans and compare with the partitioned HLO.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from planner.collective import Collective
from planner.graph import Graph, Node
from planner.hardware import HardwareProfile
from planner.packing import packed_operand
from planner.placements import Layout
from planner.plan import ActivationConstraint, Plan
from planner.pricing import collectives
from planner.propagate import evaluate
from planner.request import PlanRequest
from planner.reshard import route

PIN_REASON = "pinned: the layout the plan decides, so the partitioner has no choice (planner.pins)"
OP_PIN_REASON = "pinned: the layout the op computes in, before the plan's constraint reshards it (planner.pins)"
READ_PIN_REASON = (
    "pinned: the layout the op reads this weight in, so the partitioner reshards the weight as planned (planner.pins)"
)
ROUTE_PIN_REASON = (
    "pinned: the layout the op reads this value in, reached through layouts the target lowers "
    "(tt-mlir lowers no collective-permute, tt-mlir #3370; planner.reshard.route)"
)
PIN_REASONS = (PIN_REASON, OP_PIN_REASON, READ_PIN_REASON, ROUTE_PIN_REASON)

# torch_xla refuses annotations whose tile assignment has more than 5 dims ("tile_assignment ranks > 5"):
# a rank-6 value (the VAE's temporal-upsample reshape) keeps its layout from its pinned neighbours.
MAX_PINNED_RANK = 5
_RESHAPES = ("view", "reshape", "flatten", "unflatten", "squeeze")
_NOT_PINNED = ("setitem", "empty_like", "empty", "copy_")  # buffer writes and the buffers they fill


Request = PlanRequest | str | HardwareProfile | None  # the plan's request, else its hardware (`_request`)


def _request(plan: Plan, request: Request) -> PlanRequest:
    """`request`, or the one `plan` records (`PlanRequest.for_plan`) with `request` as its hardware."""
    return request if isinstance(request, PlanRequest) else PlanRequest.for_plan(plan, request)


def pin_layouts(graph: Graph, plan: Plan, request: Request = None) -> Plan:
    """`plan` with every layout it decides pinned (see the module docstring). A plan already pinned
    comes back unchanged. `request`: the plan's (`planner.request`), or the hardware it is priced on."""
    if any(a.reason in PIN_REASONS for a in plan.activations):
        return plan
    req = _request(plan, request)
    hw, target = req.hw, req.target
    forced, copies = plan.constraint_layouts(graph)
    boundary = {p.name: (Layout.from_spec(plan.params[p.param]),) for p in graph.params() if p.param in plan.params}
    boundary.update({name: (lay,) for name, lay in forced.items() if graph[name].op == "placeholder"})
    halo = target.spatial_halo
    ev = evaluate(graph, list(graph), plan.mesh, hw, boundary=boundary, forced=forced, forced_inputs=copies, halo=halo)
    before: list[ActivationConstraint] = []  # the op's own layout, ahead of the plan's constraint on it
    pins: list[ActivationConstraint] = []
    fed: set[str] = set()  # nodes computed from a graph input
    for node in graph:
        if node.op == "placeholder" or any(i in fed for i in node.inputs):
            fed.add(node.name)
        if not _pinnable(graph, node, fed):
            continue
        if node.name in ev.scattered and node.name not in forced:
            continue  # between a reduction and the op slicing it: left open, so the pair stays one reduce-scatter
        if node.name in forced:
            own = None if node.name in ev.scattered else ev.unforced.get(node.name)
            if own is not None and not own.partial:
                before.append(_pin(graph, node, own, OP_PIN_REASON))
            continue
        lays = ev.layouts.get(node.name)
        if lays and lays[0] is not None and not lays[0].partial:
            pins.append(_pin(graph, node, lays[0], PIN_REASON))
    # a weight read in another layout than it is stored in: read through a copy in that layout (Shardy
    # would otherwise choose which operand of the op to reshard: measured, it gathered the tokens and
    # moved the product's split with an all-to-all where the plan gathers the FSDP weight)
    reads = [
        ActivationConstraint(
            graph[name].location, want.to_spec(), graph[graph[name].inputs[i]].out.shape, 0, READ_PIN_REASON, i
        )
        for (name, i), want in ev.required.items()
        if _weight(graph, graph[name].inputs[i]) and not want.partial and (name, i) not in copies
    ]
    acts = tuple(before) + plan.activations + tuple(pins) + tuple(reads)
    if "collective-permute" in target.unlowerable:
        acts = _routed(graph, acts, ev, plan.mesh, target)
    return plan.with_(activations=acts)


def _routed(graph: Graph, acts: tuple[ActivationConstraint, ...], ev, mesh, target) -> tuple[ActivationConstraint, ...]:
    """`acts` with every reshard the target cannot lower directly routed (`planner.reshard.route`, the
    layouts `redistribute` prices for it): a constraint whose value arrives in a layout Shardy would
    permute into its spec gets the route as ``via``; an op that reads an activation in such a layout
    (the op rule's required layout), or a reshape that reads one in another layout, reads it through a
    (routed) copy."""
    by_location = graph.by_location()
    last: dict[tuple, Layout] = {}  # (location, output) -> the layout its in-place constraints reached
    out: list[ActivationConstraint] = []
    copied = {(c.location, c.input) for c in acts if c.input is not None}

    def routed(c: ActivationConstraint, node, have) -> ActivationConstraint:
        want = Layout.from_spec(c.spec)
        if have is None or have.partial or have.ndim != want.ndim:
            return c
        vias = route(node.out, have, want, mesh, target)
        return replace(c, via=tuple(v.to_spec() for v in vias)) if vias else c

    for c in acts:
        node = by_location.get(c.location)
        if node is None or not node.outputs:
            out.append(c)
            continue
        if c.input is not None:
            src = graph[node.inputs[c.input]]
            lays = ev.layouts.get(src.name)
            out.append(routed(c, src, lays[0] if lays else None))
            continue
        key = (c.location, c.output)
        if c.output == 0 and len(node.outputs) == 1:
            have = last.get(key, ev.unforced.get(node.name))
            c = routed(c, node, have)
        last[key] = Layout.from_spec(c.spec)
        out.append(c)
    for (name, i), want in ev.required.items():
        node, src = graph[name], graph[graph[name].inputs[i]]
        lays = ev.layouts.get(src.name)
        if src.is_param or (node.location, i) in copied or not lays or lays[0] is None or lays[0].partial:
            continue
        if want.partial:
            continue
        vias = route(src.out, lays[0], want, mesh, target)
        # a reshape that reads its input in another layout reads it through a copy in that layout: left to
        # Shardy, it reshapes the split value itself and tt-mlir refuses the result ("number of output
        # elements (7680) doesn't match expected number of elements (3840)": Animate's face adapter,
        # tokens split 2 ways viewed as 3 frames x 16)
        # and so does sp_pad's cut of K or V back to the real tokens (`Target.padded_keys` "slice"): left to GSPMD, the
        # slice of a token-split value is partitioned by itself (padded to the split, a collective-permute, then a
        # gather of the cut), where the plan, as Shardy, gathers first and slices locally
        cut = node.op == "getitem" and all(u.op == "scaled_dot_product_attention" for u in graph.users(name))
        if vias or ((node.op in _RESHAPES or cut) and want != lays[0]):
            out.append(
                ActivationConstraint(
                    node.location,
                    want.to_spec(),
                    src.out.shape,
                    0,
                    ROUTE_PIN_REASON,
                    i,
                    tuple(v.to_spec() for v in vias),
                )
            )
    return tuple(out)


def graph_events(graph: Graph, plan: Plan, request: Request = None, target=None, generic: bool = True) -> Counter:
    """{(kind, axes, bytes, generic place): count} of the collectives of the whole of `graph` under `plan`
    (its parameter specs and activation pins), as `target`'s partitioner compiles its reshards (None:
    GSPMD's); `request` as `pin_layouts`'. `generic=False`: each at its own place (``blocks.3...``)."""
    req = _request(plan, request)
    forced, copies = plan.constraint_layouts(graph)
    boundary = {p.name: (Layout.from_spec(plan.params[p.param]),) for p in graph.params() if p.param in plan.params}
    boundary.update({name: (lay,) for name, lay in forced.items() if graph[name].op == "placeholder"})
    ev = evaluate(
        graph,
        list(graph),
        plan.mesh,
        req.hw,
        boundary=boundary,
        forced=forced,
        forced_inputs=copies,
        target=target,
        halo=req.target.spatial_halo,
    )
    return Counter((e.kind, e.axes, e.bytes, graph.generic(e.where) if generic else e.where) for e in ev.events)


def graph_collectives(graph: Graph, plan: Plan, request: Request = None) -> tuple[Collective, ...]:
    """The collectives of exactly `graph` under `plan`, as GSPMD compiles them: a plan made for more
    blocks than the graph holds (`Plan.first_blocks`) predicts those of the graph's blocks with these."""
    return collectives(graph_events(graph, plan, request), plan.mesh)


def target_collectives(graph: Graph, plan: Plan, request: Request = None) -> tuple[Collective, ...]:
    """`plan`'s predicted collectives as its target's compiled program holds them (`Target.lower`), with
    the reshards the target compiles differently from GSPMD (`planner.reshard.redistribute`'s
    ``target``): the plan's collectives, less what the whole-graph propagation under GSPMD has and the
    target's does not, plus what only the target's has."""
    req = _request(plan, request)
    target = req.target
    gspmd, own = graph_events(graph, plan, req), graph_events(graph, plan, req, target)
    gone, extra = gspmd - own, own - gspmd
    out: list[Collective] = []
    for c in plan.collectives:
        key = (c.kind, c.axes, c.bytes, c.where)
        drop = min(gone[key], c.count)
        gone[key] -= drop
        if c.count > drop:
            out.append(replace(c, count=c.count - drop))
    out += [
        Collective(kind, axes, nbytes, n, where, "the target's reshard")
        for (kind, axes, nbytes, where), n in extra.items()
    ]
    return target.lower(out, plan.mesh)


def _weight(graph: Graph, name: str) -> bool:
    """A parameter, or a value computed from parameters alone (`planner.packing`: the main program reads it as
    one, folded)."""
    return graph[name].is_param or packed_operand(graph, name) is not None


def _pinnable(graph: Graph, node: Node, fed: set[str]) -> bool:
    if node.op in ("placeholder", "output") or node.op in _NOT_PINNED or node.name not in fed:
        return False
    if len(node.outputs) != 1 or not node.out.shape or len(node.out.shape) > MAX_PINNED_RANK:
        return False
    return not (node.op == "to" and node.inputs and graph[node.inputs[0]].outputs == node.outputs)


def _pin(graph: Graph, node: Node, layout: Layout, reason: str) -> ActivationConstraint:
    k = graph.picks(node)
    if k is not None:  # output k of a tuple-valued op, addressed at that op
        return ActivationConstraint(graph[node.inputs[0]].location, layout.to_spec(), node.out.shape, k, reason)
    return ActivationConstraint(node.location, layout.to_spec(), node.out.shape, 0, reason)


def pin_count(plan: Plan) -> int:
    """How many of `plan`'s activation constraints are pins (`pin_layouts`), not planned constraints."""
    return sum(1 for a in plan.activations if a.reason in PIN_REASONS)
