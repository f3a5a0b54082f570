"""tt-mlir's fused kernels, handed over as StableHLO composites in the program exported for it.

tt-xla's own torch path wraps attention, the norms and GELU in ``stablehlo.composite`` ops named
``tenstorrent.*`` (torch_xla's `StableHLOCompositeBuilder`); tt-mlir legalizes each to one TTIR op and
lowers it to one TTNN kernel: ``ttnn.scaled_dot_product_attention`` (flash attention: no L_q x L_k score
matrix in DRAM), ``ttnn.layer_norm``, ``ttnn.rms_norm``, ``ttnn.gelu``. Handed the same math as a chain of
small ops it runs a chain of small kernels, and attention's score matrix per head lands in DRAM.

What this module owns:

- `FUSED`: the op families and their composite (name, attributes), as data;
- `mark_sites`: the lowered graph's calls of those ops, where the plan's layout lets the kernel run on
  each chip's shard alone, replaced by calls of `fused` (which op, which composite);
- `emitting`: the context in which `fused` emits the composite. Outside it `fused` computes the op as
  the program on CPU always did (its decomposition; XLA:CPU has no kernel for the composite markers), so
  the program that runs on CPU is the composite's decomposition, and the exported program differs from
  it only by the markers (`wancompile.lowering.ShardedProgram` traces the export once more inside
  `emitting`).

Where the kernel cannot run on a shard alone, the op stays decomposed and the reason is data
(`Site.why_not`): a norm whose normalized dim the plan splits (tt-mlir refuses it: "'ttir.rms_norm' op
normalized_shape dimensions must match trailing dimensions of input tensor"; a split norm needs its
statistic all-reduced, which the decomposed form carries), attention in fp32 (tt-xla's composite is bf16
only, as is TTNN's kernel), with a mask, dropout or grouped heads, or split on the head dim.

Inside a composite's decomposition every Python number is an inline constant
(`torch_xla._XLAC._set_xla_all_numbers_special_scalars`): torch_xla otherwise passes ``scale`` or
``eps`` as a device argument, which becomes a fourth operand of the composite that tt-mlir's legalization
does not expect. The worker pins no constant inside a decomposition (`wancompile.tt.worker`): tt-mlir
flattens composites for Shardy and outlines them again after propagation, and a constraint inside the
group keeps it from being outlined (it was then lowered as its decomposition).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import torch
import torch.fx as fx
import torch.nn.functional as F

from wancompile.legalize import layer_norm_decomposed, sdpa_unflattened


@dataclass(frozen=True)
class Composite:
    """One fused op tt-mlir knows: the composite's name and the TTNN kernel it lowers to."""

    family: str  # "attention", "layer_norm", "rms_norm", "gelu"
    name: str  # the stablehlo.composite name tt-mlir legalizes (``tenstorrent.*``)
    kernel: str  # the TTNN op it becomes


FUSED = {
    "attention": Composite(
        "attention", "tenstorrent.scaled_dot_product_attention", "ttnn.scaled_dot_product_attention"
    ),
    "layer_norm": Composite("layer_norm", "tenstorrent.layer_norm", "ttnn.layer_norm"),
    "rms_norm": Composite("rms_norm", "tenstorrent.rms_norm", "ttnn.rms_norm"),
    "gelu": Composite("gelu", "tenstorrent.gelu", "ttnn.gelu"),
}

_EMITTING = [False]


@contextlib.contextmanager
def emitting() -> Iterator[None]:
    """`fused` calls traced inside emit their composite (for the exported program only)."""
    before = _EMITTING[0]
    _EMITTING[0] = True
    try:
        yield
    finally:
        _EMITTING[0] = before


@dataclass(frozen=True)
class Site:
    """A call of a fusable op in the lowered graph: its node, family, and why it stays decomposed ("" if not)."""

    node: str
    family: str
    why_not: str = ""
    lq: int = 0  # attention: its query and key tokens (whole) and head dim
    lk: int = 0
    head_dim: int = 0


# --- the ops, as the program computes them outside `emitting` (their decomposition) ---------------------


def _attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    return sdpa_unflattened(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def _attention_math(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """SDPA's reference math (the composite's decomposition): scores, softmax, weighted values. torch_xla's
    own SDPA lowering guards all-masked rows with a select that torch_xla's composite outlining cannot
    move ("'stablehlo.select' op using value defined outside the region"); without a mask none is needed."""
    s = query.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.einsum("bhld,bhmd->bhlm", query, key) * s
    if attn_mask is not None:  # additive (`fused` turns a boolean mask into one before the composite)
        scores = scores + attn_mask
    return torch.einsum("bhlm,bhmd->bhld", scores.softmax(-1), value)


def _rms_norm(x, normalized_shape, weight=None, eps=None):
    return torch.rms_norm(x, normalized_shape, weight, eps)


def _gelu(x, approximate="none"):
    return F.gelu(x, approximate=approximate)


def _decomposed(family: str) -> Callable:
    return {"attention": _attention, "layer_norm": layer_norm_decomposed, "rms_norm": _rms_norm, "gelu": _gelu}[family]


def _attributes(family: str, args: tuple, kwargs: dict) -> dict:
    if family == "attention":
        scale = kwargs.get("scale")
        attr = {"is_causal": bool(kwargs.get("is_causal", False))}
        return attr if scale is None else {**attr, "scale": float(scale)}
    if family == "gelu":
        return {"approximate": "tanh"} if kwargs.get("approximate", "none") == "tanh" else {}
    shape = [int(d) for d in args[1]]
    eps = kwargs.get("eps", args[-1] if len(args) > 2 and isinstance(args[-1], float) else None)
    attr: dict[str, Any] = {"normalized_shape": shape}
    return attr if eps is None else {**attr, "epsilon": float(eps)}


# what a `fused` call runs outside `emitting`, by name: FX code embeds literals, not builtins like torch.rms_norm
_RUNS: dict[str, Callable] = {}


def _runs_key(fn: Callable) -> str:
    key = f"{getattr(fn, '__module__', None) or 'torch'}.{getattr(fn, '__qualname__', fn.__name__)}"
    _RUNS[key] = fn
    return key


def fused(*args: Any, family: str, runs: str, **kwargs: Any) -> Any:
    """The op of `family` on `args`: its composite inside `emitting`, else the call the lowered graph had
    (``runs``, by `_runs_key`: the op, or the lowering's form of it with pinned intermediates)."""
    if not _EMITTING[0]:
        return _RUNS[runs](*args, **kwargs)
    import torch_xla
    from torch_xla.experimental.mark_pattern_utils import StableHLOCompositeBuilder

    kwargs = {k: v for k, v in kwargs.items() if k not in ("mesh_key", "spec")}  # the pinned form's own
    if family == "attention":  # TTNN's kernel adds a float mask to the scores (tt-xla converts a boolean one so too)
        mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
        if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool:
            query = kwargs.get("query", args[0] if args else None)
            additive = torch.zeros(mask.shape, dtype=query.dtype, device=mask.device).masked_fill(~mask, float("-inf"))
            if "attn_mask" in kwargs:
                kwargs["attn_mask"] = additive
            else:
                args = (*args[:3], additive, *args[4:])
    name = FUSED[family].name + ("_tanh" if family == "gelu" and kwargs.get("approximate") == "tanh" else "")
    builder = StableHLOCompositeBuilder(name, _attributes(family, args, kwargs))
    tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    tensor_kw = [k for k, a in kwargs.items() if isinstance(a, torch.Tensor)]
    marked = builder.mark_inputs(*[args[i] for i in tensors], *[kwargs[k] for k in tensor_kw])
    marked = marked if isinstance(marked, (tuple, list)) else (marked,)
    args, kwargs = list(args), dict(kwargs)
    for j, i in enumerate(tensors):
        args[i] = marked[j]
    for j, k in enumerate(tensor_kw):
        kwargs[k] = marked[len(tensors) + j]
    special = torch_xla._XLAC._get_xla_all_numbers_special_scalars()
    torch_xla._XLAC._set_xla_all_numbers_special_scalars(True)
    try:
        out = {"attention": _attention_math}.get(family, _decomposed(family))(*args, **kwargs)
    finally:
        torch_xla._XLAC._set_xla_all_numbers_special_scalars(special)
    return builder.mark_outputs(out)


# --- where: the lowered graph's calls, and whether the plan lets the kernel run on a shard ---------------

_FAMILY = {
    layer_norm_decomposed: "layer_norm",
    torch.rms_norm: "rms_norm",
    F.rms_norm: "rms_norm",
    F.gelu: "gelu",
    torch._C._nn.gelu: "gelu",
    sdpa_unflattened: "attention",
    F.scaled_dot_product_attention: "attention",
    torch._C._nn.scaled_dot_product_attention: "attention",
}


def _value(a: Any) -> Any:
    return a.meta.get("example_value", a.meta.get("val")) if isinstance(a, fx.Node) else a


_ATTENTION_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


def _attention_args(node: fx.Node) -> dict:
    return {**dict(zip(_ATTENTION_ARGS, node.args)), **node.kwargs}


def _tokens(node: fx.Node) -> tuple[int, int, int]:
    """An attention call's query tokens, key tokens and head dim (0s where q, k are not 4-D of known size)."""
    bound = _attention_args(node)
    q, k = _value(bound.get("query")), _value(bound.get("key"))
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k)):
        return 0, 0, 0
    try:
        return int(q.shape[2]), int(k.shape[2]), int(q.shape[3])
    except (TypeError, ValueError):  # symbolic sizes (dynamic shapes)
        return 0, 0, 0


def why_not(node: fx.Node, family: str, spec: Optional[tuple]) -> str:
    """Why the call at `node` stays decomposed under the layout `spec` it computes in (None: not pinned), "" if
    tt-mlir runs it as its fused kernel on each chip's shard."""
    args = list(node.args)
    if family == "attention":
        bound = _attention_args(node)
        q, k, v = (_value(bound.get(n)) for n in _ATTENTION_ARGS[:3])
        if any(not isinstance(t, torch.Tensor) or t.dtype != torch.bfloat16 for t in (q, k, v)):
            return "attention in fp32: tt-mlir's fused attention takes bf16 q, k, v (tt-xla's composite likewise)"
        if q.dim() != 4 or bound.get("dropout_p") or bound.get("enable_gqa") or bound.get("is_causal"):
            return "dropout, causality, grouped heads or a non-4-D query: not the composite tt-xla emits"
        if spec is not None and len(spec) == 4 and spec[3] is not None:
            return f"the head dim is split ({spec[3]}): the kernel needs whole heads"
        return ""
    if family in ("layer_norm", "rms_norm"):
        shape = args[1] if len(args) > 1 else node.kwargs.get("normalized_shape")
        k = len(shape) if isinstance(shape, (tuple, list, torch.Size)) else 1
        if spec is None:
            return "its layout is not pinned by the plan"
        split = [s for s in spec[len(spec) - k :] if s is not None]
        if split:
            return f"the normalized dim is split over {split}: the statistic needs an all-reduce, the kernel runs on whole rows"
        return ""
    return ""


def mark_sites(gm: fx.GraphModule, specs: dict, pinned: dict) -> tuple[Site, ...]:
    """Replace every fusable call of `gm` that tt-mlir can run on a shard by a call of `fused` (which keeps the
    call as what runs outside `emitting`); `specs`: node -> the layout the plan pins it to compute in;
    `pinned`: op -> the lowering's form of it with pinned intermediates (`wancompile.constraints`), which
    some nodes already call. Returns every site with its reason to stay decomposed ("" where fused)."""
    family_of_form = {form: _FAMILY[op] for op, form in pinned.items() if op in _FAMILY}
    sites = []
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        family = _FAMILY.get(node.target) or family_of_form.get(node.target)
        if family is None:
            continue
        reason = why_not(node, family, specs.get(node))
        sites.append(Site(node.name, family, reason, *(_tokens(node) if family == "attention" else ())))
        if not reason:
            node.kwargs = {**node.kwargs, "family": family, "runs": _runs_key(node.target)}
            node.target = fused
    gm.recompile()
    return tuple(sites)
