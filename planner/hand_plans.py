"""The tt-xla hand plan for the Wan DiT (seed 000), as a `Plan` generator for any config and mesh.

This is the baseline every planner result is compared with, expressed as data so it goes through
the same lowering and verification as an auto plan:

- TP on the ``model`` axis (the last mesh axis): Megatron col->row pairs on attn1/attn2
  (to_q/k/v column-parallel, to_out row-parallel), ffn (net.0.proj column, net.2 row), and the
  time/text embedder MLPs; norm_q/norm_k weights sharded like the activation they scale (their
  mean-square then needs a small stats all-reduce). Whole heads per device: heads % TP == 0.
- Replicated: patch_embedding, time_proj, proj_out, scale_shift_tables, norm2, rope buffers.
- SP on the ``batch`` axis (the first axis of a 2-D mesh): the flattened tokens at the block-stack
  entry and the rope tables are sharded on L; proj_out's output is gathered back before unpatchify.
- K/V of self-attention are gathered on SP by propagation; no constraint is needed once LayerNorm is
  legalized (wancompile.legalize). ``kv_gather=True`` adds explicit constraints at the SDPA's K/V
  inputs (the same collectives result; kept to test the partitioner's choice against a stated one).

The seed's back-to-back "replicate, then shard" constraint pair works around a tt-mlir reshape bug;
GSPMD does not need it, so the plan holds one constraint per location.
"""

from __future__ import annotations

import re
from typing import Optional

from planner.graph import Graph, Node
from planner.mesh import MeshSpec, PartitionSpec
from planner.plan import ActivationConstraint, Collective, Plan, PlanError, SolverInfo, model_geometry
from planner.strategies import StructureError, block_stack_entry

_COL = ("to_q", "to_k", "to_v", "add_k_proj", "add_v_proj", "net.0.proj", "linear_1")
_ROW = ("to_out.0", "net.2", "linear_2")
_MEGATRON_SCOPE = re.compile(r"(^|\.)(attn1|attn2|ffn)(\.|$)|^condition_embedder\.(time|text)_embedder\.")


def tp_sp_axes(mesh: MeshSpec) -> tuple[str, Optional[str]]:
    """TP on the last mesh axis, SP on the first of a 2-D mesh (tt-xla's convention)."""
    tp = mesh.axis_names[-1]
    sp = mesh.axis_names[0] if len(mesh.shape) >= 2 else None
    return tp, sp


def _param_spec(name: str, ndim: int, tp: str) -> PartitionSpec:
    module, _, leaf = name.rpartition(".")
    if not _MEGATRON_SCOPE.search(module):
        return (None,) * ndim
    if re.search(r"(^|\.)norm_(q|k|added_k)$", module):
        return (tp,)  # gamma matches the TP-sharded activation it scales
    if any(module.endswith(s) for s in _COL):
        return (tp, None) if leaf == "weight" else (tp,)
    if any(module.endswith(s) for s in _ROW):
        return (None, tp) if leaf == "weight" else (None,)  # bias added once, after the all-reduce
    return (None,) * ndim


def _sdpa_inputs(graph: Graph, sdpa: Node) -> tuple[Node, Node, Node]:
    args = sdpa.attrs.get("args", [])
    kwargs = sdpa.attrs.get("kwargs", {})
    names = []
    for i, key in enumerate(("query", "key", "value")):
        ref = kwargs.get(key, args[i] if i < len(args) else None)
        if not isinstance(ref, dict) or "node" not in ref:
            raise PlanError(f"cannot read the {key} input of {sdpa.location}")
        names.append(ref["node"])
    return tuple(graph[n] for n in names)  # type: ignore[return-value]


def _find(graph: Graph, module: str, op: str) -> list[Node]:
    return [n for n in graph if n.module == module and n.op == op]


def tt_xla_plan(graph: Graph, mesh: MeshSpec, *, kv_gather: bool = False, model: str = "") -> Plan:
    """The seed's hand plan for a captured Wan DiT graph on `mesh`."""
    tp, sp = tp_sp_axes(mesh)
    ntp = mesh.axis_size(tp)
    heads = _num_heads(graph)
    if heads % ntp:
        raise PlanError(
            f"the tt-xla plan keeps whole heads per device, but {heads} heads do not divide over the '{tp}' axis of size {ntp}; "
            f"use a mesh whose last axis divides {heads}"
        )
    params = {n.param: _param_spec(n.param, len(n.out.shape), tp) for n in graph.params()}
    if ntp == 1:
        params = {k: (None,) * len(v) for k, v in params.items()}

    acts: list[ActivationConstraint] = []
    if sp is not None and mesh.axis_size(sp) > 1:
        try:
            entry = block_stack_entry(graph)
        except StructureError as e:
            raise PlanError(str(e)) from None
        tokens, nsp = entry.out.shape[1], mesh.axis_size(sp)
        if isinstance(tokens, int) and tokens % nsp:
            raise PlanError(
                f"the tt-xla plan splits the sequence of {tokens} tokens (latent frames x height/2 x width/2) over the "
                f"'{sp}' axis of size {nsp}, which does not divide {tokens}; add the sp_pad rewrite "
                f"(rewrites=['sp_pad']: pads the tokens to a multiple of {nsp} and masks the padding), or use a mesh "
                f"whose '{sp}' axis divides {tokens}, or a resolution / frame count whose token count {nsp} divides"
            )
        acts.append(
            ActivationConstraint(
                entry.location, (None, sp, None), entry.out.shape, reason="SP: tokens sharded at the block-stack entry"
            )
        )
        if entry.op == "pad":  # sp_pad: split after the padding, not before it (see planner.autoplan)
            src = graph[entry.inputs[0]]
            acts.insert(0, ActivationConstraint.whole(src, "tokens whole before SP padding"))
        for table in _rope_tables(graph):
            acts.append(
                ActivationConstraint(
                    table.location,
                    (None, sp, None, None),
                    table.out.shape,
                    reason="SP: rope table sharded like the tokens",
                )
            )
            if table.op == "pad":
                acts.append(ActivationConstraint.whole(graph[table.inputs[0]], "rope table whole before SP padding"))
        exit_ = _find(graph, "proj_out", "linear")[-1]
        acts.append(ActivationConstraint.whole(exit_, "gather tokens before unpatchify"))
        if kv_gather:
            for sdpa in graph:
                if sdpa.op == "scaled_dot_product_attention" and sdpa.module.endswith("attn1"):
                    _, k, v = _sdpa_inputs(graph, sdpa)
                    for t in (k, v):
                        spec = (None, tp if ntp > 1 else None, None, None)
                        acts.append(
                            ActivationConstraint(
                                t.location, spec, t.out.shape, reason="SP: all-gather K/V on tokens before SDPA"
                            )
                        )

    plan = Plan(
        model=model or graph.model,
        mesh=mesh,
        params=params,
        activations=tuple(acts),
        solver=SolverInfo(status="hand-written"),
        geometry=model_geometry(graph),
        notes=(
            "tt-xla hand plan (seed 000): TP on heads as Megatron pairs, SP on tokens"
            + ("" if kv_gather else ", no K/V constraint"),
        ),
    )
    return plan.with_(collectives=tuple(predicted_block_bill(graph, plan)))


def _num_heads(graph: Graph) -> int:
    for n in graph:
        if n.op == "unflatten" and n.module.endswith("attn1"):
            sizes = n.attrs["args"][2]
            if isinstance(sizes, list) and isinstance(sizes[0], int) and sizes[0] > 0:
                return sizes[0]
    raise PlanError("cannot find the attention head count (no unflatten in attn1); is this a Wan DiT graph?")


def _rope_tables(graph: Graph) -> list[Node]:
    """The rope module's outputs (cos and sin tables, (1, L, 1, d)), after any padding."""
    return [
        n
        for n in graph
        if n.module == "rope"
        and n.outputs
        and len(n.out.shape) == 4
        and any(u.module != "rope" for u in graph.users(n.name))
    ]


def predicted_block_bill(graph: Graph, plan: Plan) -> list[Collective]:
    """The seed's per-block collective bill for this plan, summed over blocks (bytes per call)."""
    tp, sp = tp_sp_axes(plan.mesh)
    ntp = plan.mesh.axis_size(tp)
    nsp = plan.mesh.axis_size(sp) if sp else 1
    nblocks = len(graph.blocks())
    out: list[Collective] = []
    if ntp > 1:
        for name in ("attn1.to_out.0", "attn2.to_out.0", "ffn.net.2"):
            n = next(x for x in graph if x.block == 0 and x.module.endswith(name) and x.op == "linear")
            out.append(
                Collective(
                    "all-reduce",
                    (tp,),
                    _bytes(n.out.shape, n.out.itemsize, nsp),
                    nblocks,
                    f"blocks.*.{name} (row-parallel)",
                )
            )
        for attn in ("attn1", "attn2"):
            for norm in ("norm_q", "norm_k"):
                n = next(
                    x for x in graph if x.block == 0 and x.module.endswith(f"{attn}.{norm}") and x.op == "rms_norm"
                )
                shape = tuple(n.out.shape[:-1]) + (1,)
                per = nsp if (attn == "attn1" or norm == "norm_q") else 1
                out.append(
                    Collective(
                        "all-reduce",
                        (tp,),
                        _bytes(shape, 4, per),
                        nblocks,
                        f"blocks.*.{attn}.{norm} (mean-square stats)",
                    )
                )
    if nsp > 1:
        sdpa = next(
            x for x in graph if x.block == 0 and x.op == "scaled_dot_product_attention" and x.module.endswith("attn1")
        )
        for t in _sdpa_inputs(graph, sdpa)[1:]:
            out.append(
                Collective(
                    "all-gather",
                    (sp,),
                    _bytes(t.out.shape, t.out.itemsize, ntp),
                    nblocks,
                    f"blocks.*.attn1 {t.name.split('_')[0]} on tokens",
                )
            )
        exit_ = _find(graph, "proj_out", "linear")[-1]
        out.append(
            Collective(
                "all-gather",
                (sp,),
                _bytes(exit_.out.shape, exit_.out.itemsize, 1),
                1,
                "proj_out output on tokens (exit)",
            )
        )
    if ntp > 1:
        for emb in ("time_embedder", "text_embedder"):
            n = next(x for x in graph if x.module == f"condition_embedder.{emb}.linear_2" and x.op == "linear")
            out.append(
                Collective(
                    "all-reduce",
                    (tp,),
                    _bytes(n.out.shape, n.out.itemsize, 1),
                    1,
                    f"condition_embedder.{emb} (row-parallel)",
                )
            )
    return out


def _bytes(shape, itemsize: int, divisor: int) -> int:
    n = itemsize
    for d in shape:
        n *= int(d)
    return n // divisor
