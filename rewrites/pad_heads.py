"""Head padding: an attention with H heads computed as one with H' > H, the extra heads exactly zero.

Heads that a mesh axis does not divide (Wan 2.1's 12 on 8 devices) cannot be split for head-TP or
Ulysses. Padded to a multiple of the split (12 -> 16, as TensorRT does for Wan's context
parallelism) they can. Run only where the plan chose it (the planner prices the padded option on the
graph this pass produces; ``planner.autoplan``); it is not one of the normalising `PASSES` (not
registered). A hand matcher: what it changes is shape-dependent (every op that carries the head count
between the projections and ``to_out``, however many), not a fixed subgraph.

Per attention module ``P`` named in ``pads`` (block-generic, ``blocks.*.attn1``, or exact), with
``r`` rows per head in a projection weight (``d``, or ``3d`` for the ``qkv`` rewrite's
head-interleaved packing) and ``E = H' - H``::

    w_p = F.pad(w_p, (0, 0, 0, E * r)); b_p = F.pad(b_p, (0, E * r))   # each q/k/v projection
    rms_norm(x, (H'd,), F.pad(g * sqrt(H / H'), (0, E d)), eps * H / H')  # norm_q / norm_k across heads
    unflatten(x, dim, (H, ...)) -> unflatten(x, dim, (H', ...))           # the head split(s)
    w_o = F.pad(w_o, (0, E d))                                            # to_out's input columns

An attention with several SDPAs (I2V's cross-attention: the text tokens' and the image tokens'
``add_k_proj``/``add_v_proj``, one query, their sum into one to_out) is padded as one: every
projection any of them reads, every head split and across-heads norm (``norm_added_k`` too).

Why it is exact: heads are the major factor of every projection's rows (separate or
head-interleaved), so the appended zero rows are whole extra heads whose q, k and v are 0. Their
scores are all 0, their softmax a uniform average of their zero values: output 0, which meets
to_out's zero columns. ``rms_norm_across_heads`` takes its mean square over all H'd features of
which only Hd are real: ``mean' = mean * H / H'``. With ``eps' = eps H / H'`` it computes
``x rsqrt(mean' + eps') = sqrt(H'/H) x rsqrt(mean + eps)``, and the gamma scaled by ``sqrt(H/H')``
cancels the factor — the real features are the unpadded model's up to fp32 rounding, no op added
per call. Every new op reads parameters only (the pads, the gamma scale), so the lowering folds them
(wancompile/fold.py): padded weights are made once per weight version, like the ``qkv`` packing.

Preconditions, checked per attention before it is touched (one that fails is reported in
``skipped`` and left as it was; only an op that rejects the padded example values is found after
the weights were padded, and then the graph must not be used — callers pass a copy and refuse):
each SDPA operand traces back to a linear inside ``P``, SDPA's output reaches one linear through
single-user ops, the ops between read the heads only through ``unflatten`` (no explicit
``view``/``reshape`` sizes) and ``rms_norm``, and every op accepts the padded example values.
"""

from __future__ import annotations

import fnmatch
import math
from typing import Mapping

import torch
import torch.fx as fx

from ._core import (
    LINEAR,
    RMS_NORM,
    SDPA,
    Emitter,
    RewriteReport,
    Skip,
    calls,
    calls_method,
    evaluate,
    fake_mode_of,
    finish,
    linear_args,
    module_path,
    note,
    report,
    shape,
    value,
)

NAME = "pad_heads"
_PAD = torch.nn.functional.pad


def pad_heads(gm: fx.GraphModule, pads: Mapping[str, int]) -> RewriteReport:
    """Pad the heads of every attention whose module path matches a key of `pads` (``*`` matches
    a block index) to that many; returns where it did and why it left a matching one alone."""
    where, skipped = [], []
    by_module: dict[str, list[fx.Node]] = {}  # an I2V cross-attention has two SDPAs (text, image)
    for sdpa in [n for n in gm.graph.nodes if calls(n, SDPA)]:
        by_module.setdefault(module_path(sdpa), []).append(sdpa)
    for path, sdpas in by_module.items():
        target = next((h for p, h in pads.items() if fnmatch.fnmatchcase(path, p)), None)
        if target is None:
            continue
        try:
            _pad(gm.graph, sdpas, path, int(target))
            where.append(path)
        except Skip as why:
            skipped.append(note(path, why))
    finish(gm)
    return report(NAME, where, skipped)


def _operand(node: fx.Node, i: int, key: str):
    return node.args[i] if len(node.args) > i else node.kwargs.get(key)


def _pad(graph: fx.Graph, sdpas: list[fx.Node], path: str, target: int) -> None:
    """Pad the attention `path` whose SDPAs are `sdpas` (one; two for I2V's text and image
    attention, which share the query and to_out: all are padded together or none)."""
    heads, head_dim = shape(sdpas[0])[1], shape(sdpas[0])[-1]
    if any((shape(s)[1], shape(s)[-1]) != (heads, head_dim) for s in sdpas):
        raise Skip(f"its SDPAs differ in heads: {[tuple(shape(s)) for s in sdpas]}")
    if target <= heads:
        raise Skip(f"{heads} heads already; padding to {target} adds none")
    extra = target - heads
    inside = lambda n: module_path(n) == path or module_path(n).startswith(path + ".")  # noqa: E731
    projections: dict[fx.Node, None] = {}
    outs: dict[fx.Node, None] = {}
    for sdpa in sdpas:
        for i, key in enumerate(("query", "key", "value")):
            x = _operand(sdpa, i, key)
            while isinstance(x, fx.Node) and not calls(x, LINEAR):
                if not inside(x) or not x.all_input_nodes:
                    raise Skip(f"{sdpa.name}'s {key} does not trace back to a projection inside {path}")
                x = x.all_input_nodes[0]
            if not isinstance(x, fx.Node) or not inside(x):
                raise Skip(f"{sdpa.name}'s {key} does not trace back to a projection inside {path}")
            projections[x] = None
        out_proj = sdpa
        while not calls(out_proj, LINEAR):
            users = list(out_proj.users)
            if len(users) != 1 or not inside(users[0]):
                raise Skip(f"{sdpa.name}'s output does not reach to_out through single-user ops")
            out_proj = users[0]
        outs[out_proj] = None
    if len(outs) != 1:
        raise Skip(f"its SDPAs reach {len(outs)} output projections, not one to_out")
    (out_proj,) = outs

    # the ops between the projections and to_out: they see the heads
    between: dict[fx.Node, None] = {}
    todo = list(projections)
    while todo:
        for u in todo.pop().users:
            if u is out_proj or u in between:
                continue
            if not inside(u):
                raise Skip(f"{u.name} outside {path} reads the heads")
            between[u] = None
            todo.append(u)
    order = {n: i for i, n in enumerate(graph.nodes)}
    between_nodes = sorted(between, key=order.__getitem__)
    for n in between_nodes:
        if calls_method(n, "view") or calls_method(n, "reshape") or n.target in (torch.reshape,):
            raise Skip(f"{n.name}: an explicit {n.target} size between the projections and to_out")

    for lin in projections:
        rows = shape(linear_args(lin)[1])[0]
        if rows % heads:
            raise Skip(f"{lin.name}: {rows} rows do not split into {heads} heads")
    _, w_o, _ = linear_args(out_proj)
    if shape(w_o)[1] != heads * head_dim:
        raise Skip(f"to_out reads {shape(w_o)[1]} features, not {heads} x {head_dim}")

    # weights: the projections' rows, to_out's columns (parameter-only ops: folded once)
    for lin in projections:
        _, w, b = linear_args(lin)
        e = extra * (shape(w)[0] // heads)
        emit = Emitter(graph, lin, lin)
        _set_arg(lin, 1, "weight", emit.call(_PAD, w, (0, 0, 0, e), name=f"{w.name}_padded"))
        if b is not None:
            _set_arg(lin, 2, "bias", emit.call(_PAD, b, (0, e), name=f"{b.name}_padded"))
    emit = Emitter(graph, out_proj, out_proj)
    _set_arg(out_proj, 1, "weight", emit.call(_PAD, w_o, (0, extra * head_dim), name=f"{w_o.name}_padded"))

    # the head split(s) and the across-heads norms
    for n in between_nodes:
        if calls_method(n, "unflatten") or calls(n, torch.unflatten):
            sizes = tuple(n.args[2])
            if sizes and sizes[0] == heads:
                n.args = (n.args[0], n.args[1], (target,) + sizes[1:])
        elif calls(n, RMS_NORM):
            x, normalized, gamma = n.args[0], tuple(n.args[1]), n.args[2] if len(n.args) > 2 else None
            eps = n.args[3] if len(n.args) > 3 else n.kwargs.get("eps")
            if normalized[-1] != heads * head_dim:
                continue  # a per-head norm: zero heads stay zero
            if len(normalized) != 1 or eps is None:
                raise Skip(f"{n.name}: rms_norm over {normalized} without an explicit eps")
            if gamma is not None:
                emit = Emitter(graph, n, n)
                scaled = emit.call(torch.mul, gamma, math.sqrt(heads / target), name=f"{gamma.name}_scaled")
                gamma = emit.call(_PAD, scaled, (0, extra * head_dim), name=f"{gamma.name}_padded")
            n.args = (x, (target * head_dim,), gamma, eps * heads / target)
            n.kwargs = {k: v for k, v in n.kwargs.items() if k != "eps"}
    for n in sorted(projections, key=order.__getitem__) + between_nodes:
        try:
            n.meta["example_value"] = evaluate(n.op, n.target, n.args, n.kwargs, mode=fake_mode_of(value(sdpas[0])))
        except Exception as e:  # an op with a hard-coded head count
            raise Skip(f"{n.name} ({n.target}) rejects {target} heads: {type(e).__name__}: {e}") from None


def _set_arg(node: fx.Node, i: int, key: str, new: fx.Node) -> None:
    if key in node.kwargs:
        node.kwargs = {**node.kwargs, key: new}
    else:
        args = list(node.args)
        args[i] = new
        node.args = tuple(args)
