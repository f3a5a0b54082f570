"""`plan_vae`: a captured Wan VAE decode graph (full-T or one chunk) + mesh + hardware -> `Plan`.

The VAE's macros are its units of work, found by module path:

- ``resblock``: a ``WanResidualBlock`` (norm1, silu, conv1, norm2, silu, conv2, shortcut, the
  residual add);
- ``attention``: the mid-block ``WanAttentionBlock`` (per frame: batch B*T, sequence H*W);
- ``upsample``: a ``WanResample`` (``time_conv``, the 2x broadcast upsample, its conv2d, the frame
  interleave), ``avg_shortcut`` (Wan 2.2 ``DupUp3D``);
- ``head`` (``post_quant_conv``, ``conv_in``) and ``tail`` (``norm_out``, ``conv_out``, unpatchify,
  clamp).

Root-level glue (the full-T walk's frame bookkeeping) follows the macro that produced its input,
except after a residual block, where it joins the next macro (so every residual block of one shape
has the same ops and can share ILP variables).

Strategies per macro (all priced by the op rules, `planner.propagate.evaluate`):

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

ILP groups are macros of identical ops and shapes (identical residual blocks share one variable, the
cost multiplied by their count); edges carry the stream layout between consecutive macros.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping, Optional

from planner import engine, pricing
from planner.cost_model import collective_seconds, to_ns
from planner.graph import Graph, Node, TensorMeta
from planner.hardware import HardwareProfile, resolve_hardware
from planner.ilp import Edge, Group
from planner.mesh import MeshSpec
from planner.placements import Layout, as_number, numel, shard_count
from planner.plan import ActivationConstraint, Decision, Exclusion, Plan, PlanError, Predicted
from planner.propagate import Evaluation, redistribute
from planner.targets import Target, get_target

_DEC = r"(?:^|.*?\.)decoder\."
_PATTERNS = (
    ("resblock", re.compile(rf"^({_DEC}(?:mid_block|up_blocks\.\d+)\.resnets\.\d+)(?:\.|$)")),
    ("attention", re.compile(rf"^({_DEC}mid_block\.attentions\.\d+)(?:\.|$)")),
    ("upsample", re.compile(rf"^({_DEC}up_blocks\.\d+\.(?:upsamplers\.0|upsampler))(?:\.|$)")),
    ("shortcut", re.compile(rf"^({_DEC}up_blocks\.\d+\.avg_shortcut)(?:\.|$)")),
    ("head", re.compile(rf"^((?:.*\.)?post_quant_conv|{_DEC}conv_in)(?:\.|$)")),
    ("tail", re.compile(rf"^({_DEC}(?:norm_out|conv_out|nonlinearity))(?:\.|$)")),
)


def is_vae_graph(graph: Graph) -> bool:
    """A Wan VAE decode graph: it has the decoder's conv_in and residual blocks."""
    mods = {n.module for n in graph}
    return any(re.search(r"(?:^|\.)decoder\.conv_in$", m) for m in mods) and any(".resnets." in m for m in mods)


@dataclass
class Macro:
    name: str
    kind: str
    nodes: list[str] = field(default_factory=list)
    params: list[str] = field(default_factory=list)
    signature: tuple = ()


@dataclass(frozen=True)
class VaeStrategy:
    name: str
    key: tuple  # stream layout it reads and writes: ("rep",) or ("hw", h_axes, w_axes)
    params: dict  # placeholder node name -> Layout
    forced: dict  # node name -> Layout


def find_macros(graph: Graph) -> list[Macro]:
    """The macros in graph order (see the module docstring)."""
    macros: dict[str, Macro] = {}
    order: list[str] = []
    macro_of: dict[str, str] = {}
    pending: list[str] = []

    def claim(name: str, kind: str, node: Node) -> None:
        if name not in macros:
            macros[name] = Macro(name, kind)
            order.append(name)
        for p in pending:
            macros[name].nodes.append(p)
            macro_of[p] = name
        pending.clear()
        macros[name].nodes.append(node.name)
        macro_of[node.name] = name

    for node in graph:
        if node.op in ("placeholder", "output"):
            continue
        hit = next(((kind, m.group(1)) for kind, pat in _PATTERNS if (m := pat.match(node.module))), None)
        if hit is not None:
            kind, name = hit
            if kind == "tail" and name.endswith("nonlinearity"):
                name = name.rsplit(".", 1)[0] + ".norm_out"
            if kind == "tail":
                name = "tail"
            if kind == "head":
                name = "head"
            claim(name, kind, node)
            continue
        producers = [macro_of[i] for i in node.inputs if i in macro_of]
        conv2 = next(
            (
                macro_of[i]
                for i in node.inputs
                if i in macro_of and graph[i].op == "conv3d" and graph[i].module.endswith(".conv2")
            ),
            None,
        )
        if node.op == "add" and conv2 is not None:
            claim(conv2, "resblock", node)  # the residual add
        elif producers and macros[producers[0]].kind != "resblock" and not pending:
            claim(producers[0], macros[producers[0]].kind, node)
        else:
            pending.append(node.name)
    if pending:
        last = order[-1]
        for p in pending:
            macros[last].nodes.append(p)
    out = [macros[n] for n in order]
    for m in out:
        inside = set(m.nodes)
        m.nodes = [n.name for n in graph if n.name in inside]
        m.params = list(dict.fromkeys(i for x in m.nodes for i in graph[x].inputs if graph[i].is_param))
        m.signature = (
            m.kind,
            tuple((graph[x].op, tuple(tuple(o.shape) for o in graph[x].outputs)) for x in m.nodes),
            tuple(tuple(graph[p].out.shape) for p in m.params),
        )
    return out


def stream_layout(key: tuple, meta: TensorMeta) -> Layout:
    """The layout of a (B, C, T, H, W) or (N, C, H, W) activation under a stream key."""
    nd = len(meta.shape)
    if key[0] != "hw" or nd < 4:
        return Layout.replicated(nd)
    dims = [()] * nd
    dims[nd - 2], dims[nd - 1] = key[1], key[2]
    return Layout(tuple(dims))


def _conv_layout(key: tuple, conv: Node) -> Layout:
    """A conv's output under a stream key; a conv1x1-rewritten linear's output is channel-last
    (B, T, H, W, C), so its H and W sit one dim earlier."""
    lay = stream_layout(key, conv.out)
    if conv.op != "linear":
        return lay
    return Layout((lay.dims[0],) + lay.dims[2:] + (lay.dims[1],))


def _key_name(key: tuple) -> str:
    if key[0] != "hw":
        return "replicated"
    return f"H:{'+'.join(key[1]) or '-'},W:{'+'.join(key[2]) or '-'}"


def spatial_keys(mesh: MeshSpec) -> list[tuple]:
    """Every assignment of the mesh axes (size > 1) to H, W or neither (except all-neither), with
    every major-to-minor order of the axes sharing a dim."""
    axes = [a for a in mesh.axis_names if mesh.axis_size(a) > 1]
    out = []
    for assign in itertools.product(("h", "w", None), repeat=len(axes)):
        h = tuple(a for a, x in zip(axes, assign) if x == "h")
        w = tuple(a for a, x in zip(axes, assign) if x == "w")
        if h or w:
            for hp in dict.fromkeys(itertools.permutations(h)):
                for wp in dict.fromkeys(itertools.permutations(w)):
                    out.append(("hw", hp, wp))
    return out


def local_transition(k: tuple, l: tuple) -> bool:
    """Whether the plan may move the stream from key k to key l: equal keys, or to or from
    replicated (an all-gather / a free local slice). Two different spatial layouts are not allowed
    next to each other: measured on 2x2, even a refinement (W over model -> W over (model, batch),
    where every device already holds its rows) made GSPMD all-gather W inside the next
    ``time_conv`` (2 all-gathers the rules do not predict). tt-metal keeps one H/W fracture for the
    whole decoder too; the ILP still chooses which one, and which macros leave it."""
    return k == l or k[0] != "hw" or l[0] != "hw"


# Price of a stream transition that would reorder the devices' rows (neither refines nor coarsens):
# excluded from the plan (GSPMD emits ad-hoc permutes and gathers for it; not modelled).
_FORBIDDEN_NS = 10**12


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
                f"spatial({_key_name(key)})",
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


def _spans_space(graph: Graph, conv: Node) -> bool:
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
            why.append(Exclusion(f"spatial({_key_name(key)})", _TRANSPOSED.format(target=target.name)))
            continue
        if not halo and m.kind != "attention":
            bad = next((r for c in convs if _spans_space(graph, c) and (r := _no_explicit_halo(graph, c))), None)
            if bad:
                why.append(Exclusion(f"spatial({_key_name(key)})", bad))
                continue
        if m.kind == "attention":
            forced = _attention_gather(graph, m, key)
            out.append(VaeStrategy(f"gather({_key_name(key)})", key, rep, forced))
            frames = _attention_frames(graph, m, key, mesh, why)
            out.extend(frames)
            continue
        forced = {c.name: _conv_layout(key, c) for c in convs}
        for c in convs:
            if c.op == "linear" and key[1] and key[2]:
                # its rows are gathered (planner.rules.matmul): W first, then H, as GSPMD does (2x2)
                forced[c.inputs[0]] = _conv_layout(("hw", key[1], ()), c)
        out.append(VaeStrategy(f"spatial({_key_name(key)})", key, rep, forced))
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
            Exclusion(f"frames({'+'.join(t)}) at {_key_name(key)}", f"{frames} frames (B*T) do not divide into {n}")
        )
        return []
    rep = {p: Layout.replicated(len(graph[p].out.shape)) for p in m.params}
    split = Layout(((t,) + ((),) * (len(normed.out.shape) - 1)))
    forced = {
        normed.name: split,
        sdpa.name: Layout((t,) + ((),) * (len(sdpa.out.shape) - 1)),
        last.name: stream_layout(key, last.out),
    }
    return [VaeStrategy(f"frames({'+'.join(t)}) at {_key_name(key)}", key, rep, forced)]


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


class VaeFamily:
    """The VAE decode as a model family of `planner.engine`: its macros (`find_macros`, identical
    residual blocks sharing one group), their options priced by the op rules, the stream edges;
    its decisions and its plan."""

    def __init__(
        self,
        graph: Graph,
        mesh: MeshSpec,
        hw: HardwareProfile,
        *,
        values: Optional[Mapping[str, int]] = None,
        only: Optional[Mapping[str, str]] = None,
        preset: str = "auto",
        model: str = "",
        target: str = "gspmd",
    ):
        self.target = get_target(target)
        self.halo = self.target.spatial_halo
        if preset not in PRESETS:
            raise PlanError(f"unknown VAE plan preset {preset!r}; choose one of {sorted(PRESETS)}")
        self.g, self.mesh, self.hw, self.vals = graph, mesh, hw, dict(values or {})
        self.preset, self.restricts, self.model = preset, (PRESETS[preset], dict(only or {})), model
        self.macros = find_macros(graph)
        self.macro_of = {x: m.name for m in self.macros for x in m.nodes}
        self.by_name = {m.name: m for m in self.macros}
        groups: dict[tuple, list[Macro]] = {}
        for m in self.macros:
            groups.setdefault(m.signature, []).append(m)
        self.group_of = {m.name: ms[0].name for ms in groups.values() for m in ms}
        self.members = {ms[0].name: ms for ms in groups.values()}

    def crossing(self, m: Macro) -> list[str]:
        inside = set(m.nodes)
        out = []
        for x in m.nodes:
            for i in self.g[x].inputs:
                src = self.g[i]
                if i in inside or src.is_param or not src.outputs or i in out:
                    continue
                out.append(i)
        return out

    def evaluate(self, m: Macro, s: VaeStrategy) -> Evaluation:
        stream = {x: stream_layout(s.key, self.g[x].out) for x in self.crossing(m)}
        return pricing.evaluate_option(
            self.g,
            m.nodes,
            self.mesh,
            self.hw,
            params=s.params,
            stream=stream,
            forced=s.forced,
            values=self.vals,
            halo=self.halo,
        )

    def param_bytes(self, m: Macro, s: VaeStrategy) -> float:
        return pricing.param_bytes(self.g, m.params, s.params, self.mesh, self.vals)

    def reshard_seconds(self, tensor: str, k: tuple, l: tuple) -> float:
        meta = self.g[tensor].out
        return pricing.reshard_seconds(
            meta, stream_layout(k, meta), stream_layout(l, meta), self.mesh, self.hw, self.vals
        )

    def problem(self) -> engine.Problem:
        groups: list[Group] = []
        tables: dict[str, tuple[VaeStrategy, ...]] = {}
        excluded: dict[str, tuple[Exclusion, ...]] = {}
        evals: dict[tuple[str, str], Evaluation] = {}
        for gname, members in self.members.items():
            rep = members[0]
            opts, why = macro_strategies(self.g, rep, self.mesh, self.crossing(rep), self.target)
            kept = [s for s in opts if all(_matches(r, rep, s.name, self.mesh) for r in self.restricts)]
            if not kept:
                wanted = [r.get(rep.name, r.get(rep.kind, r.get("*"))) for r in self.restricts]
                raise PlanError(
                    f"{rep.name} ({rep.kind}): no legal strategy matches preset {self.preset!r} and only="
                    f"{[w for w in wanted if w]!r}; legal: "
                    + ", ".join(s.name for s in opts)
                    + ("; excluded: " + "; ".join(f"{x.option}: {x.reason}" for x in dict.fromkeys(why)) if why else "")
                )
            why += [Exclusion(s.name, f"restricted by preset {self.preset!r} / only") for s in opts if s not in kept]
            options = []
            for s in kept:
                ev = evals[gname, s.name] = self.evaluate(rep, s)
                options.append(pricing.option(s.name, s.key, ev, self.param_bytes(rep, s) * len(members)))
            groups.append(Group(gname, tuple(options), len(members)))
            tables[gname], excluded[gname] = tuple(kept), tuple(why)
        hint = {g.name: next((i for i, o in enumerate(g.options) if o.key[0] == "hw"), 0) for g in groups}
        return engine.Problem(tuple(groups), tuple(_edges(self, tables)), tables, excluded, evals, hint=hint)

    subject = "the VAE decode"

    def advice(self, budget: float) -> tuple[str, tuple[str, ...]]:
        return ", use more devices, or decode chunked-T with a smaller t_chunk", ()

    def decisions(self, problem: engine.Problem, solution: engine.Solution) -> tuple[Decision, ...]:
        return _decisions(self, problem, solution)

    def assemble(self, problem: engine.Problem, solution: engine.Solution, decisions) -> Plan:
        return _assemble(self, solution, decisions)


def _matches(only: Mapping[str, str], m: Macro, name: str, mesh: MeshSpec) -> bool:
    pattern = only.get(m.name, only.get(m.kind, only.get("*")))
    if pattern is None:
        return True
    axes = "+".join(a for a in mesh.axis_names if mesh.axis_size(a) > 1)
    return re.search(pattern.replace("ALL", re.escape(axes)), name) is not None


def plan_vae(
    graph: Graph,
    mesh: MeshSpec,
    hardware: str | HardwareProfile | None = None,
    *,
    memory_gb: Optional[float] = None,
    values: Optional[Mapping[str, int]] = None,
    time_limit_s: float = 10.0,
    model: str = "",
    only: Optional[Mapping[str, str]] = None,
    preset: str = "auto",
    target: str = "gspmd",
) -> Plan:
    """Plan a captured Wan VAE decode graph.

    Args:
        graph: the captured full-T decode (or one chunk of a chunked-T decode).
        mesh, hardware, memory_gb, values, time_limit_s: as `planner.plan_graph`.
        only: macro name or kind (``resblock``, ``attention``, ``upsample``, ``shortcut``, ``head``,
            ``tail``, ``*`` for the rest) -> regular expression a strategy name must match
            (``ALL`` stands for every mesh axis of size > 1, joined by ``+``).
        preset: ``auto`` (the solver decides), ``spatial``, ``channel-megatron`` (the seed's hand
            plan), ``replicated``; a strategy must satisfy both the preset and `only`.
        target: the partitioner (`planner.targets`), recorded in the plan; for one that exchanges no
            conv halos (``tt-mlir``) a spatial split is priced with the halo the lowering writes into the
            program (`planner.rules.conv`, `wancompile.halo`), and offered only where every conv it
            splits has a same-size stride-1 window (otherwise excluded, with the reason in the decisions).

    Raises:
        PlanError: no plan fits the memory budget, or `only` leaves a macro without a legal strategy
            (the message lists why the wanted ones were excluded, e.g. an uneven spatial split).
    """
    hw = resolve_hardware(hardware, mesh)
    hw = get_target(target).profile(hw)  # what the target cannot lower, priced out
    family = VaeFamily(
        graph, mesh, hw, values=values, only=only, preset=preset, model=model or graph.model, target=target
    )
    budget = memory_gb * 1e9 if memory_gb is not None else float(hw.dram_bytes)
    return engine.plan(family, budget, time_limit_s).with_(target=target)


def halo_convs(graph: Graph, plan: Plan) -> list[str]:
    """Locations of the convs `plan` splits on a spatial dim their window spans: the ones whose halo
    depends on the target (the partitioner's exchange, or the program's: `planner.targets.Target.spatial_halo`)."""
    out, at = [], graph.by_location()
    for a in plan.activations:
        node = at.get(a.location)
        if node is None or node.op not in ("conv3d", "conv2d") or a.input is not None or not _spans_space(graph, node):
            continue
        kernel = graph[node.inputs[1]].out.shape[2:]
        if any(e is not None and k > 1 for e, k in zip(tuple(a.spec)[-len(kernel) :], kernel)):
            out.append(str(a.location))
    return list(dict.fromkeys(out))


def _edges(ctx: VaeFamily, tables: Mapping[str, tuple[VaeStrategy, ...]]) -> list[Edge]:
    costs: dict[tuple[str, str], dict] = {}
    for m in ctx.macros:
        dst = ctx.group_of[m.name]
        for x in ctx.crossing(m):
            src_macro = ctx.macro_of.get(x)
            if src_macro is None:
                continue  # a graph input: laid out as the consuming macro wants (no collective)
            src = ctx.group_of[src_macro]
            if src == dst:
                continue
            table = costs.setdefault((src, dst), {})
            for k in {s.key for s in tables[src]}:
                for l in {s.key for s in tables[dst]}:
                    cost = to_ns(ctx.reshard_seconds(x, k, l)) if local_transition(k, l) else _FORBIDDEN_NS
                    table[k, l] = table.get((k, l), 0) + cost
    return [Edge(a, b, 1, c) for (a, b), c in costs.items()]


def _decisions(ctx: VaeFamily, problem: engine.Problem, solution: engine.Solution) -> tuple[Decision, ...]:
    """One typed Decision per group (`planner.explain.explain_choices`): costs per decode; the stream
    of an option is the layout of the group's first input under its key."""

    def stream(g: Group, key: tuple) -> str:
        crossing = ctx.crossing(ctx.by_name[g.name])
        return stream_layout(key, ctx.g[crossing[0]].out).show(ctx.mesh) if crossing else ""

    members = {name: tuple(m.name for m in ms) for name, ms in ctx.members.items() if len(ms) > 1}
    return engine.explain(problem, solution, "decode", stream=stream, members=members)


def _assemble(ctx: VaeFamily, solution: engine.Solution, decisions) -> Plan:
    g, mesh, chosen = ctx.g, ctx.mesh, solution.chosen
    events: Counter = Counter()
    compute = 0.0
    warnings: list[str] = []
    acts: list[ActivationConstraint] = []
    params = {n.param: (None,) * len(n.out.shape) for n in g.params()}
    key_of: dict[str, tuple] = {}
    peak = 0.0
    param_bytes = 0.0
    for m in ctx.macros:
        gname = ctx.group_of[m.name]
        opts, _ = macro_strategies(g, m, mesh, ctx.crossing(m), ctx.target)
        s = next(o for o in opts if o.name == chosen[gname].name)
        key_of[m.name] = s.key
        ev = ctx.evaluate(m, s)
        compute += ev.compute_seconds
        peak = max(peak, ev.peak_bytes)
        param_bytes += ctx.param_bytes(m, s)
        warnings += ev.warnings
        for e in ev.events:
            events[(e.kind, e.axes, e.bytes, e.where)] += 1
        for p, lay in s.params.items():
            params[g[p].param] = lay.to_spec()
        for name, lay in s.forced.items():
            acts.append(
                ActivationConstraint(
                    g[name].location, lay.to_spec(), g[name].out.shape, reason=f"{m.kind} {s.name}: {g[name].op} output"
                )
            )
        for x in ctx.crossing(m):
            src = g[x]
            if src.op == "placeholder":  # graph input (latents, chunk history): enters in this layout
                spec = stream_layout(s.key, src.out).to_spec()
                if any(e is not None for e in spec) and all(a.location != src.location for a in acts):
                    acts.append(
                        ActivationConstraint(
                            src.location, spec, src.out.shape, reason="graph input enters in the plan's layout"
                        )
                    )
    for m in ctx.macros:
        for x in ctx.crossing(m):
            src_macro = ctx.macro_of.get(x)
            if src_macro is None or key_of[src_macro] == key_of[m.name]:
                continue
            meta = g[x].out
            have, want = stream_layout(key_of[src_macro], meta), stream_layout(key_of[m.name], meta)
            for kind, axes, shape in redistribute(meta, have, want, mesh):
                nbytes = int(as_number(numel(shape), ctx.vals) * meta.itemsize)
                events[(kind, axes, nbytes, f"{g[x].location} -> {m.name}")] += 1
            if have != want:  # the macro was priced reading its stream in its own layout: so it reads it
                for reader in m.nodes:
                    for i, inp in enumerate(g[reader].inputs):
                        if inp == x:
                            acts.append(
                                ActivationConstraint(
                                    g[reader].location,
                                    want.to_spec(),
                                    meta.shape,
                                    reason=f"{m.name} reads {g[x].location} as {_key_name(key_of[m.name])}",
                                    input=i,
                                )
                            )
    collectives = pricing.collectives(events, mesh)
    comm = sum(collective_seconds(c.kind, c.bytes, c.axes, mesh, ctx.hw) * c.count for c in collectives)
    memory = int(param_bytes + pricing.ACTIVATION_FACTOR * peak)
    notes = [
        "VAE plan: one strategy per macro (residual block, attention, upsampler, head, tail); identical residual "
        "blocks share one ILP variable",
        "predicted time = compute + comm, no overlap; memory = parameters + 3 x the largest per-op live set",
    ]
    notes += [f"warning: {w}" for w in dict.fromkeys(warnings)]
    return Plan(
        model=ctx.model,
        mesh=mesh,
        params=params,
        activations=tuple(acts),
        hardware=ctx.hw.name,
        collectives=collectives,
        predicted=Predicted(compute + comm, compute, comm, memory),
        solver=engine.solver_info(solution),
        decisions=tuple(decisions),
        notes=tuple(notes),
        weight_sets=1,
    )
