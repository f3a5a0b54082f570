"""The per-op trace of a plan: what every op of one block sees and costs under the plan.

`plan.json` says *what* is sharded (parameter specs, activation constraints) and what the plan
predicts in total; the reports also show *where* the state of the token stream changes, which op
pays which collective, and how long each op takes. That needs the captured graph, so the trace is
computed when the graph is at hand (``wancompile plan``, the backend's ``dump_dir``) and saved in
plan.json under ``"report"`` (an optional section; `planner.plan.Plan` ignores it), so that
``plan.md``, ``plan.html`` and ``wancompile explain`` can be produced later from the file alone.

How: the planner's own propagation engine (`planner.propagate.evaluate`) runs once per op, in graph
order, with the plan's parameter specs as boundary layouts and its activation constraints forced
after their ops — exactly how `planner.autoplan.price_plan` prices a plan, kept per op. Rows hold
data, not renderings: a tensor state is its global shape, its per-dim partition spec (plan.json's
convention) and the axes of unreduced partial sums; the views print it in the one layout notation
(`planner.placements`). Collectives are `planner.collective.Collective` records::

    {"loc": "blocks.*.attn1.to_k:linear#0", "segment": "block", "group": "attn1", "op": "linear",
     "weights": [{"param": "blocks.0.attn1.to_k.weight", "spec": ["model", null]}, ...],
     "in": [{"shape": [1, 48, 64], "spec": [null, "batch", null], "partial": []}],
     "out": {"shape": [1, 48, 64], "spec": [null, "batch", "model"], "partial": []},
     "constraint": [null, "batch", "model"], "collectives": [...], "compute_s": 1.2e-05}
"""

from __future__ import annotations

from typing import Any, Optional

from planner.cfg import plan_profile
from planner.graph import Graph, Node, TensorMeta
from planner.hardware import HardwareProfile
from planner.placements import Layout
from planner.plan import Plan, spec_to_json
from planner.propagate import evaluate
from planner.request import PlanRequest
from planner.strategies import dit_graph, family_of, find_structure

TRACE_VERSION = 2

# Ops a reader looks for in the block table even when they move no data (the seed's rows).
KERNELS = frozenset(
    {
        "linear",
        "scaled_dot_product_attention",
        "layer_norm",
        "rms_norm",
        "conv3d",
        "conv2d",
        "matmul",
        "bmm",
        "baddbmm",
        "group_norm",
        "native_layer_norm",
    }
)


def state(meta: TensorMeta, layout: Optional[Layout]) -> dict[str, Any]:
    """A tensor's state as data: global shape, per-dim spec, partial-sum axes."""
    if layout is None:
        layout = Layout.replicated(len(meta.shape))
    return {
        "shape": [_dim(d) for d in meta.shape],
        "spec": spec_to_json(layout.to_spec()),
        "partial": list(layout.partial),
    }


def trace_plan(
    graph: Graph, plan: Plan, hardware: str | HardwareProfile | None = None, *, num_blocks: Optional[int] = None
) -> dict[str, Any]:
    """The ``"report"`` section of plan.json for `plan` on `graph` (see the module docstring)."""
    hw = PlanRequest.for_plan(plan, hardware).hardware  # the profile's own figures
    hw = plan_profile(plan, hw)  # a CFG-split plan: the links of its split mesh (planner.cfg)
    graph = dit_graph(graph)  # as the planner read it: stacks that are not transformer blocks, op by op
    st = find_structure(graph)
    n_blocks = num_blocks or plan.layers or st.captured_blocks
    mesh = plan.mesh
    forced, copies = plan.constraint_layouts(graph)
    constraint_spec = {name: lay.to_spec() for name, lay in forced.items()}
    layouts: dict[str, tuple[Layout, ...]] = {
        p.name: (Layout.from_spec(plan.params[p.param]),) for p in graph.params() if p.param in plan.params
    }
    layouts.update({name: (lay,) for name, lay in forced.items() if graph[name].op == "placeholder"})  # split inputs
    main = family_of(st.root)
    first = {f.prefix: f.indices[0] for f in graph.families if f.indices}
    block_root = {prefix: f"{prefix}.{k}" for prefix, k in first.items()}
    macro_of = {x: m.name for m in st.block_macros for x in m.nodes}
    macro_of.update({x: m.name.rsplit(".", 1)[-1] for f in st.families for m in f.macros for x in m.nodes})
    root_macro_of = {x: m.name for m in st.root_macros for x in m.nodes}
    rows: list[dict[str, Any]] = []
    for node in graph:
        if node.op in ("placeholder", "output"):
            continue
        ev = evaluate(graph, [node], mesh, hw, boundary=layouts, forced=forced, forced_inputs=copies)
        layouts[node.name] = ev.layouts.get(node.name, tuple(Layout.replicated(len(m.shape)) for m in node.outputs))
        if node.block is not None and node.block != first.get(node.family):
            continue  # blocks share their decisions: each family's first block stands for all
        if node.block is not None:
            segment = "block" if node.family == main else "family"
        else:
            segment = "prologue" if node.name in set(st.prologue) else "epilogue"
        rows.append(
            _row(
                graph,
                node,
                layouts,
                ev,
                segment,
                block_root.get(node.family, ""),
                macro_of,
                root_macro_of,
                constraint_spec,
                plan,
            )
        )
    return {
        "version": TRACE_VERSION,
        "hardware": hw.name,
        "blocks": n_blocks,
        "captured_blocks": st.captured_blocks,
        "tokens": str(st.tokens),
        "block_module": st.root,
        # further block stacks (VACE's control blocks): their rows are segment "family", one block each
        "families": [
            {"prefix": f.prefix, "blocks": f.blocks, "block_module": block_root[f.prefix]} for f in st.families
        ],
        "params": {
            p.param: {"shape": [_dim(d) for d in p.out.shape], "dtype": p.out.dtype, "block": p.block}
            for p in graph.params()
            if p.block is None or p.block == first.get(p.family)
        },
        "ops": rows,
    }


def _row(
    graph: Graph,
    node: Node,
    layouts,
    ev,
    segment: str,
    root: str,
    macro_of: dict,
    root_macro_of: dict,
    constraint_spec: dict,
    plan: Plan,
) -> dict[str, Any]:
    weights, ins = [], []
    for i in node.inputs:
        src = graph[i]
        if not src.outputs:
            continue
        lay = layouts.get(i, (None,))[0] if layouts.get(i) else None
        if src.is_param:
            spec = plan.params.get(src.param, (None,) * len(src.out.shape))
            weights.append({"param": src.param, "spec": spec_to_json(spec)})
        else:
            ins.append(state(src.out, lay))
    out_lay = layouts[node.name][0] if layouts.get(node.name) else None
    module = node.module
    in_block = segment in ("block", "family")
    rel = module[len(root) + 1 :] if in_block and module.startswith(root + ".") else ("" if in_block else module)
    group = macro_of.get(node.name) or root_macro_of.get(node.name) or (rel.split(".")[0] if rel else "") or segment
    return {
        "loc": str(graph.block_location(node, "*")),
        "segment": segment,
        "family": node.family,
        "group": group,
        "module": graph.in_block(node, module, "*"),
        "op": node.op,
        "kernel": node.op in KERNELS,
        "weights": weights,
        "in": ins,
        "out": state(node.out, out_lay) if node.outputs else None,
        "constraint": spec_to_json(constraint_spec[node.name]) if node.name in constraint_spec else None,
        "module_output": _is_module_output(graph, node),
        "collectives": [e.to_json() for e in ev.events],
        "compute_s": ev.compute_seconds,
        "flops": ev.flops,
    }


def _is_module_output(graph: Graph, node: Node) -> bool:
    """True when the op's value is what its module returns (the last op of that module, used
    outside it): a forward hook on the module sees exactly this tensor."""
    if not node.module:
        return False
    same = [n for n in graph if n.module == node.module and n.op not in ("placeholder", "output")]
    if not same or same[-1].name != node.name:
        return False
    return all(u.module != node.module for u in graph.users(node.name))


def _dim(d: Any) -> Any:
    return d if isinstance(d, int) else str(d)
