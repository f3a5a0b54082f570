"""The VAE decode's macros, found by module path, and the stream layouts between them.

The VAE's macros are its units of work:

- ``resblock``: a ``WanResidualBlock`` (norm1, silu, conv1, norm2, silu, conv2, shortcut, the
  residual add);
- ``attention``: the mid-block ``WanAttentionBlock`` (per frame: batch B*T, sequence H*W);
- ``upsample``: a ``WanResample`` (``time_conv``, the 2x broadcast upsample, its conv2d, the frame
  interleave), ``avg_shortcut`` (Wan 2.2 ``DupUp3D``);
- ``head`` (``post_quant_conv``, ``conv_in``) and ``tail`` (``norm_out``, ``conv_out``, unpatchify,
  clamp).

Root-level glue (the full-T walk's frame bookkeeping) follows the macro that produced its input,
except after a residual block, where it joins the next macro (so every residual block of one shape
has the same ops and can share ILP variables: `planner.macros.Macro.signature`).

The stream between macros is keyed ``("rep",)`` (replicated) or ``("hw", h_axes, w_axes)`` (H split
over h_axes, W over w_axes): `stream_layout` is a key's layout of a (B, C, T, H, W) activation,
`spatial_keys` the mesh's keys, `local_transition` the key changes a plan may make between macros.
"""

from __future__ import annotations

import itertools
import re

from planner.graph import Graph, Node, TensorMeta
from planner.macros import Macro
from planner.mesh import MeshSpec
from planner.placements import Layout

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


def find_macros(graph: Graph) -> list[Macro]:
    """The macros in graph order (see the module docstring)."""
    nodes: dict[str, list[str]] = {}  # macro name -> its node names, as claimed
    kinds: dict[str, str] = {}
    macro_of: dict[str, str] = {}
    pending: list[str] = []

    def claim(name: str, kind: str, node: Node) -> None:
        if name not in nodes:
            nodes[name], kinds[name] = [], kind
        for p in pending:
            nodes[name].append(p)
            macro_of[p] = name
        pending.clear()
        nodes[name].append(node.name)
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
        elif producers and kinds[producers[0]] != "resblock" and not pending:
            claim(producers[0], kinds[producers[0]], node)
        else:
            pending.append(node.name)
    if pending:
        nodes[list(nodes)[-1]].extend(pending)
    out = []
    for name, claimed in nodes.items():
        inside = set(claimed)
        ops = tuple(n.name for n in graph if n.name in inside)
        params = tuple(dict.fromkeys(i for x in ops for i in graph[x].inputs if graph[i].is_param))
        signature = (
            kinds[name],
            tuple((graph[x].op, tuple(tuple(o.shape) for o in graph[x].outputs)) for x in ops),
            tuple(tuple(graph[p].out.shape) for p in params),
        )
        out.append(Macro(name, kinds[name], ops, params, signature=signature))
    return out


def stream_layout(key: tuple, meta: TensorMeta) -> Layout:
    """The layout of a (B, C, T, H, W) or (N, C, H, W) activation under a stream key."""
    nd = len(meta.shape)
    if key[0] != "hw" or nd < 4:
        return Layout.replicated(nd)
    dims = [()] * nd
    dims[nd - 2], dims[nd - 1] = key[1], key[2]
    return Layout(tuple(dims))


def conv_layout(key: tuple, conv: Node) -> Layout:
    """A conv's output under a stream key; a conv1x1-rewritten linear's output is channel-last
    (B, T, H, W, C), so its H and W sit one dim earlier."""
    lay = stream_layout(key, conv.out)
    if conv.op != "linear":
        return lay
    return Layout((lay.dims[0],) + lay.dims[2:] + (lay.dims[1],))


def key_name(key: tuple) -> str:
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
FORBIDDEN_NS = 10**12
