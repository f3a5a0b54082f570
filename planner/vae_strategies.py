"""The options of a VAE macro (`macro_strategies`), each priced by the op rules, and the presets.

- ``spatial(H:a,W:b)``: activations (B, C, T, H, W) split on H over mesh axes a and W over b,
  weights replicated; every conv output is pinned to that layout (the lowering's in-graph
  constraints). The conv rule charges the halo collective-permutes (tt-metal's plan), or, for a target
  whose partitioner exchanges no halo (tt-mlir), the all-gathered edge rows of the halo the lowering
  writes into the program (`wancompile.halo`). A macro whose stream arrives in another layout reads it
  through a constraint to its own (a local slice, or the all-gather the edge is priced with).
- ``channel(t)`` (resblocks): the seed's channel Megatron: conv1 C_out-split (column), conv2
  C_in-split (row) with an all-reduce of its output, norm2 with a statistics all-reduce.
- ``gather(H:a,W:b)`` (attention): the stream stays spatial, the normalised input is gathered and
  the attention runs replicated; the output is sliced back (free). ``frames(t)``: B*T split over t
  (only where the frame count divides).
- ``replicated``.

`PRESETS`: per macro name or kind (``*`` for the rest), the regular expression a strategy's name
must match (``ALL``: every mesh axis of size > 1, joined by ``+``), applied by `planner.macros.restrict`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Optional

from planner.graph import Graph, Node
from planner.macros import Macro
from planner.mesh import MeshSpec
from planner.placements import Layout, shard_count
from planner.plan import Exclusion
from planner.targets import Target
from planner.vae_macros import conv_layout, key_name, spatial_keys, stream_layout


@dataclass(frozen=True)
class VaeStrategy:
    name: str
    key: tuple  # stream layout it reads and writes: ("rep",) or ("hw", h_axes, w_axes)
    params: dict  # placeholder node name -> Layout
    forced: dict  # node name -> Layout


def _activations(graph: Graph, m: Macro) -> list[Node]:
    return [graph[x] for x in m.nodes if graph[x].outputs and len(graph[x].out.shape) in (4, 5)]


def _spatial_fits(graph: Graph, m: Macro, key: tuple, mesh: MeshSpec, crossing: list[str]) -> Optional[Exclusion]:
    nh, nw = shard_count(mesh, key[1]), shard_count(mesh, key[2])
    for node in _activations(graph, m) + [graph[x] for x in crossing]:
        if node.op in ("pad",):
            continue
        shape = node.out.shape
        if len(shape) not in (4, 5):
            continue
        h, w = shape[-2], shape[-1]
        if (nh > 1 and (not isinstance(h, int) or h % nh)) or (nw > 1 and (not isinstance(w, int) or w % nw)):
            return Exclusion(
                f"spatial({key_name(key)})",
                f"{node.location} has H x W = {h} x {w}, which does not split evenly into {nh} x {nw} "
                "(GSPMD gathers uneven conv halos instead of exchanging them)",
            )
    return None


NO_HALO = (
    "target tt-mlir exchanges no halo for a spatially split convolution (Shardy treats its spatial dims as "
    "pass-through, tt-mlir #8216), and {conv} (kernel {kernel}, stride {stride}, padding {padding}, dilation "
    "{dilation}) is no same-size stride-1 window whose halo the program can carry (wancompile.halo)"
)


def _no_explicit_halo(graph: Graph, conv: Node) -> Optional[str]:
    """Why `conv`'s halo cannot be written into the program (None: it can), for a target without halos."""
    from planner.rules.conv import explicit_halo_ok, window

    nsp = len(conv.out.shape) - 2
    kernel = tuple(graph[conv.inputs[1]].out.shape[2:])
    stride, padding, dilation = window(conv.attrs.get("args", []), dict(conv.attrs.get("kwargs", {})), nsp)
    for s in range(nsp - 2, nsp):  # H and W
        if not explicit_halo_ok(kernel[s], stride[s], padding[s], dilation[s]):
            return NO_HALO.format(
                conv=conv.location, kernel=kernel[s], stride=stride[s], padding=padding[s], dilation=dilation[s]
            )
    return None


_TRANSPOSED = (
    "target {target} refuses a program result split on one dim over mesh axes out of mesh order "
    '("Fail to determine shardDims"), and the decoded frames would be one'
)


def _transposed(key: tuple, mesh: MeshSpec) -> bool:
    """Whether a spatial key splits H or W over several axes out of mesh order."""
    order = {a: i for i, a in enumerate(mesh.axis_names)}
    return any(list(axes) != sorted(axes, key=order.__getitem__) for axes in key[1:])


def spans_space(graph: Graph, conv: Node) -> bool:
    """Whether a convolution's window covers more than one pixel in H or W (it needs its neighbours' rows)."""
    if conv.op == "linear" or len(conv.inputs) < 2 or not graph[conv.inputs[1]].outputs:
        return False
    return any(k != 1 for k in graph[conv.inputs[1]].out.shape[-2:])


def macro_strategies(
    graph: Graph, m: Macro, mesh: MeshSpec, crossing: list[str], target: Optional[Target] = None
) -> tuple[list[VaeStrategy], list[Exclusion]]:
    """Legal strategies of a macro and the reasons the others were excluded, for `target`'s partitioner
    (default GSPMD): whether it exchanges halos for spatially split convolutions
    (`planner.targets.Target.spatial_halo`), and which result layouts it accepts."""
    halo = target is None or target.spatial_halo
    why: list[Exclusion] = []
    out: list[VaeStrategy] = []
    rep = {p: Layout.replicated(len(graph[p].out.shape)) for p in m.params}
    convs = [graph[x] for x in m.nodes if graph[x].op in ("conv3d", "conv2d")]
    convs += [graph[x] for x in m.nodes if graph[x].op == "linear" and len(graph[x].out.shape) == 5]  # 1x1x1, rewritten
    out.append(VaeStrategy("replicated", ("rep",), rep, {c.name: Layout.replicated(len(c.out.shape)) for c in convs}))
    axes = [a for a in mesh.axis_names if mesh.axis_size(a) > 1]
    for key in spatial_keys(mesh):
        bad = _spatial_fits(graph, m, key, mesh, crossing)
        if bad:
            why.append(bad)
            continue
        if target is not None and target.results_in_mesh_order and m.kind == "tail" and _transposed(key, mesh):
            why.append(Exclusion(f"spatial({key_name(key)})", _TRANSPOSED.format(target=target.name)))
            continue
        if not halo and m.kind != "attention":
            bad = next((r for c in convs if spans_space(graph, c) and (r := _no_explicit_halo(graph, c))), None)
            if bad:
                why.append(Exclusion(f"spatial({key_name(key)})", bad))
                continue
        if m.kind == "attention":
            forced = _attention_gather(graph, m, key)
            out.append(VaeStrategy(f"gather({key_name(key)})", key, rep, forced))
            frames = _attention_frames(graph, m, key, mesh, why)
            out.extend(frames)
            continue
        forced = {c.name: conv_layout(key, c) for c in convs}
        for c in convs:
            if c.op == "linear" and key[1] and key[2]:
                # its rows are gathered (planner.rules.matmul): W first, then H, as GSPMD does (2x2)
                forced[c.inputs[0]] = conv_layout(("hw", key[1], ()), c)
        out.append(VaeStrategy(f"spatial({key_name(key)})", key, rep, forced))
    if m.kind == "resblock":
        conv1 = next((c for c in convs if c.module.endswith(".conv1")), None)
        conv2 = next((c for c in convs if c.module.endswith(".conv2")), None)
        if conv1 is not None and conv2 is not None:
            for r in range(1, len(axes) + 1):
                for t in itertools.combinations(axes, r):
                    n = shard_count(mesh, t)
                    width = conv1.out.shape[1]
                    if width % n:
                        why.append(Exclusion(f"channel({'+'.join(t)})", f"{width} channels do not divide into {n}"))
                        continue
                    params = dict(rep)
                    w1, b1 = conv1.inputs[1], (conv1.inputs[2] if len(conv1.inputs) > 2 else None)
                    w2 = conv2.inputs[1]
                    params[w1] = Layout((t,) + ((),) * (len(graph[w1].out.shape) - 1))
                    if b1:
                        params[b1] = Layout((t,))
                    params[w2] = Layout(((), t) + ((),) * (len(graph[w2].out.shape) - 2))
                    c_split = Layout(((), t) + ((),) * (len(conv1.out.shape) - 2))
                    forced = {c.name: Layout.replicated(len(c.out.shape)) for c in convs}
                    forced[conv1.name] = c_split
                    out.append(VaeStrategy(f"channel({'+'.join(t)})", ("rep",), params, forced))
    return out, why


def _attention_gather(graph: Graph, m: Macro, key: tuple) -> dict:
    """Gather the normalised (N, C, H, W) input, attend replicated, slice the output back."""
    nodes = [graph[x] for x in m.nodes]
    qkv = next(n for n in nodes if n.op in _PROJECTIONS)
    normed = graph[qkv.inputs[0]]
    last = next(n for n in reversed(nodes) if n.outputs and len(n.out.shape) == 5)
    # every value between the gather and the slice-back pinned whole: with only the gather pinned,
    # GSPMD re-split the attention's internals on a 2-D (H, W) split (extra gathers, an all-reduce)
    inner = [n for n in nodes if n.op in _PROJECTIONS + ("scaled_dot_product_attention",)]
    forced = {n.name: Layout.replicated(len(n.out.shape)) for n in [normed, *inner]}
    forced[last.name] = stream_layout(key, last.out)
    norm = _norm_output(nodes)
    if key[1] and key[2] and norm is not None and norm.name != normed.name:
        # a 2-D split is gathered W first, then H (the order GSPMD chose, measured on 2x2)
        forced[norm.name] = Layout(((), (), key[1], ()))
    return forced


# The attention's q/k/v and output projections: 1x1 conv2ds, or linears after the conv1x1 rewrite
# (read channel-last through a movedim).
_PROJECTIONS = ("conv2d", "linear")


def _norm_output(nodes: list[Node]) -> Optional[Node]:
    """The attention norm's (N, C, H, W) output: the normalize itself, or after the rmsnorm rewrite
    the movedim that brings its channel-last ``rms_norm`` back to channels first."""
    at = next((i for i, n in enumerate(nodes) if n.op in ("normalize", "rms_norm")), None)
    frames = next((n for n in nodes if n.outputs and len(n.out.shape) == 4), None)
    if at is None or frames is None:
        return None
    return next((n for n in nodes[at:] if n.outputs and n.out.shape == frames.out.shape), None)


def _attention_frames(graph: Graph, m: Macro, key: tuple, mesh: MeshSpec, why: list[Exclusion]) -> list[VaeStrategy]:
    """Frames (B*T) split over the axes of the stream key: the attention needs no communication."""
    nodes = [graph[x] for x in m.nodes]
    qkv = next(n for n in nodes if n.op in _PROJECTIONS)
    normed = graph[qkv.inputs[0]]
    sdpa = next((n for n in nodes if n.op == "scaled_dot_product_attention"), None)
    last = next(n for n in reversed(nodes) if n.outputs and len(n.out.shape) == 5)
    t = tuple(a for a in mesh.axis_names if a in key[1] + key[2])
    n = shard_count(mesh, t)
    frames = normed.out.shape[0]
    if sdpa is None or frames % n:
        why.append(
            Exclusion(f"frames({'+'.join(t)}) at {key_name(key)}", f"{frames} frames (B*T) do not divide into {n}")
        )
        return []
    rep = {p: Layout.replicated(len(graph[p].out.shape)) for p in m.params}
    split = Layout(((t,) + ((),) * (len(normed.out.shape) - 1)))
    forced = {
        normed.name: split,
        sdpa.name: Layout((t,) + ((),) * (len(sdpa.out.shape) - 1)),
        last.name: stream_layout(key, last.out),
    }
    return [VaeStrategy(f"frames({'+'.join(t)}) at {key_name(key)}", key, rep, forced)]


PRESETS = {
    "auto": {},
    "spatial": {
        "resblock": r"^spatial",
        "head": r"^spatial",
        "tail": r"^spatial",
        "upsample": r"^spatial",
        "shortcut": r"^spatial",
        "attention": r"^(gather|frames)",
    },
    # the seed's hand plan (seed 001, docs/seeds.md): Megatron col->row on every residual block over the
    # whole mesh, everything else replicated
    "channel-megatron": {"resblock": r"^channel\(ALL\)$", "*": r"^replicated$"},
    "replicated": {"*": r"^replicated$"},
}
