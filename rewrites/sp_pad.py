"""Sequence padding for SP: pad the tokens once, keep self-attention off the padded keys, cut once.

When the token count L is not a multiple of ``context.sp_multiple`` (SP degree × tile), sharding L
needs padding. This pass pads the block stack's tokens once and cuts them once::

    # block-stack entry, once per token tensor (hidden states, rope tables, per-token timestep proj)
    x = F.pad(x, [0, 0, ..., 0, P])                     # L → L + P along its token dim
    # every self-attention, in the form the target wants (``context.padded_keys``, `Target.padded_keys`):
    #   "mask":  a boolean key mask, built once
    key_mask = (torch.arange(L + P) < L).view(1, 1, 1, L + P)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)
    #   "slice": K and V cut back to the L real tokens (the SDPA's dim -2), no mask
    out = F.scaled_dot_product_attention(q, k[:, :, :L], v[:, :, :L])
    # exit, before the unpatchify reshape, once
    y = y[:, :L]

Which form: the key mask costs nothing where the attention kernel broadcasts it (gspmd: XLA adds the
[1, 1, 1, L + P] mask to the scores). TTNN's fused attention (tt-mlir) takes a mask only as
[B, 1|H, L_q, L_k] in DRAM, so tt-mlir ``ttnn.repeat``s the key mask to each chip's L_q × L_k, a tensor as large
as one head's score matrix (A14B 480p on bh-2x4: [1, 1, 8192, 32768] bf16, 537 MB per chip), which every
self-attention reads; handed K and V of L tokens (not a whole number of tiles) and no mask, the kernel masks
the last tile's padding itself, in L1 (tt-metal's sdpa_program_factory.cpp, ``use_padded_mask``). The slices
are local: a self-attention reads K and V whole on the tokens (SP gathers them; the planner's rule for a partial
slice of a split dim gathers first, and `planner.pins` pins the cut's input whole so that GSPMD does too), so the
form costs two ``slice_static`` kernels per block and no collective. Their price: by bytes, 4 x K per block
(read and write, K and V) against the mask's H_local x L_q x L_k read by every self-attention (A14B 480p on
bh-2x4, 8,192 queries a chip: 16x less); on hardware the seed (``docs/seeds.md``, seed 000) measured its
per-block K/V slice-backs at ~41 ms each on a Wormhole Galaxy at 480p (+3.3 s per iteration for 81), far above a
DRAM round trip: the open question for this form (`planner.published`).

Why it is exact: inside a Wan block only attention mixes tokens — every other op is per token — so
the P padded rows never reach a real row except as keys, and the mask gives them zero weight, or the
slice drops them (a real query still sees all L real keys, so no row is fully masked). Padded rows
compute finite values (zeros through LayerNorm/RMSNorm stay finite) that the exit cut drops.
Cross-attention keys come from the prompt, not from padded tensors, and are left alone.

Where: the block stack is the nodes of modules ``blocks.N`` and of every further top-level block family
(VACE's ``vace_blocks.N``: its hints are added to the main stream, so both stacks run on L + P tokens
and the control stack's self-attention is masked too), extended forward through the per-token
tail (``norm_out``, the output modulation, ``proj_out``: ops whose result still has L at dim 1) up to
the reshape that unpatchifies. Entries are the tensors with L at dim 1 that it reads (not parameters;
a tensor feeding ``attn2``, the prompt, never is), or with L at an inner dim: diffusion forcing
(SkyReels-V2 DF) gives every token its own timestep, so the blocks read a (B, 6, L, D) projection
that each block chunks on dim 1 into (B, L, D) modulations; it is padded on dim 2 (padded rows are
the table alone: finite, and read only by padded rows). Exits are the region's values read outside it. Before
touching the graph the pass re-runs every op of the stack on padded FakeTensors (and each self-attention
on its mask or its sliced K and V); if one rejects them (a hard-coded length), the graph is left unchanged
and the reason reported.

A hand matcher, not `rewrites._pattern`: what it rewrites is not a fixed subgraph but a region (every
op of the block stack, however deep) chosen by shapes (which tensors carry L, at which dim).
"""

from __future__ import annotations

import operator
import re
from typing import Any

import torch
import torch.fx as fx

from ._core import (
    SDPA,
    Emitter,
    RewriteContext,
    RewriteReport,
    Skip,
    calls,
    evaluate,
    fake_mode_of,
    finish,
    module_path,
    report,
    value,
)
from ._registry import Rewrite, register

BLOCK = re.compile(r"^(\w+_)?blocks\.\d+(\.|$)")  # every top-level block family: blocks.N, vace_blocks.N
CROSS_ATTENTION = re.compile(r"(^|\.)attn2(\.|$)")
FORMS = ("mask", "slice")  # `RewriteContext.padded_keys`


def pad_tokens(gm: fx.GraphModule, context: RewriteContext = RewriteContext()) -> RewriteReport:
    if context.padded_keys not in FORMS:
        raise ValueError(f"padded_keys={context.padded_keys!r}: choose one of {', '.join(FORMS)}")
    if context.sp_multiple <= 1:
        return report("sp_pad", (), ())
    if not any(BLOCK.match(module_path(n)) for n in gm.graph.nodes if n.op.startswith("call")):
        return report("sp_pad", (), ())  # not a DiT block stack (a VAE graph): nothing to pad
    try:
        plan = _Plan(gm.graph, context.sp_multiple, context.padded_keys)
    except Skip as why:
        return report("sp_pad", (), (str(why),))
    if plan.pad == 0:  # nothing to pad: no candidate left unchanged
        return report("sp_pad", (), ())
    plan.apply()
    finish(gm)
    return report("sp_pad", [module_path(n) for n in plan.self_attention], ())


register(
    Rewrite(
        "sp_pad",
        pad_tokens,
        "the blocks.N stack when L % sp_multiple != 0 -> pad once at entry, key-mask self-attention (or cut its K and V"
        " back to L: padded_keys='slice'), one cut at exit",
        order=90,  # last: pads the graph the other passes produced
    )
)


class _Plan:
    """What to pad, mask and cut, worked out (and checked on FakeTensors) before the graph changes."""

    def __init__(self, graph: fx.Graph, multiple: int, form: str = "mask") -> None:
        self.graph = graph
        self.form = form
        self.nodes = list(graph.nodes)
        self.region = self._block_stack()
        self.tokens = self._token_count()
        self.pad = -self.tokens % multiple
        if self.pad == 0:
            return
        self._extend_through_tail()
        self.entries = self._entries()
        self.self_attention = self._self_attention()
        self.values = self._rerun_padded()
        self.exits = [n for n in self.nodes if n in self.region and any(u not in self.region for u in n.users)]
        for node in self.exits:
            self._check_token_major(node, self.values[node], self.tokens + self.pad, "leaves the block stack")

    # --- finding the pieces ---------------------------------------------------------------------

    def _block_stack(self) -> set[fx.Node]:
        region = {n for n in self.nodes if n.op.startswith("call") and BLOCK.match(module_path(n))}
        if not region:
            raise Skip("no blocks.N modules: not a DiT block stack")
        return region

    def _token_count(self) -> int:
        outputs = [n for n in self.nodes if n in self.region and any(u not in self.region for u in n.users)]
        counts = set()
        for node in outputs:
            self._check_token_major(node, value(node), None, "leaves the block stack")
            counts.add(value(node).shape[1])
        if len(counts) != 1:
            raise Skip(f"block stack outputs disagree on the token count: {sorted(map(str, counts))}")
        tokens = counts.pop()
        if not isinstance(tokens, int):
            raise Skip(f"token count {tokens} is symbolic")
        return tokens

    def _extend_through_tail(self) -> None:
        """Add the per-token ops after the last block (norm_out, modulation, proj_out) to the region."""
        for node in self.nodes:
            if node in self.region or not node.op.startswith("call"):
                continue
            if any(i in self.region for i in node.all_input_nodes) and self._has_tokens(node):
                self.region.add(node)

    def _has_tokens(self, node: fx.Node) -> bool:
        if node.op not in ("call_function", "call_method", "call_module", "placeholder"):
            return False
        v = node.meta.get("example_value")
        return isinstance(v, torch.Tensor) and v.dim() >= 2 and v.shape[1] == self.tokens

    def _token_dim(self, node: fx.Node) -> int | None:
        """The dim of `node`'s value that holds the tokens: the first after the batch with L entries,
        not the features (last) of a rank > 2 value. 1 for ``(B, L, ...)`` (hidden states, RoPE
        tables), 2 for diffusion forcing's ``(B, 6, L, D)`` per-token timestep projection; None: none."""
        v = node.meta.get("example_value")
        if node.op not in ("call_function", "call_method", "call_module", "placeholder"):
            return None
        if not isinstance(v, torch.Tensor) or v.dim() < 2:
            return None
        return next((d for d in range(1, max(2, v.dim() - 1)) if v.shape[d] == self.tokens), None)

    def _entries(self) -> list[fx.Node]:
        entries = []
        for node in self.nodes:
            if node in self.region or self._token_dim(node) is None or _is_parameter(node):
                continue
            readers = [u for u in node.users if u in self.region]
            if readers and not any(CROSS_ATTENTION.search(module_path(u)) for u in readers):
                entries.append(node)
        if not entries:
            raise Skip("found no tensor with the token dim entering the block stack")
        return entries

    def _self_attention(self) -> list[fx.Node]:
        """SDPA nodes whose keys derive from a padded tensor (cross-attention keys come from the prompt)."""
        tainted = set(self.entries)
        found = []
        for node in self.nodes:
            if node in self.region and any(i in tainted for i in node.all_input_nodes):
                tainted.add(node)
                if calls(node, SDPA) and _sdpa_arg(node, 1, "key") in tainted:
                    found.append(node)
        for node in found:
            if _sdpa_arg(node, 3, "attn_mask") is not None or _sdpa_arg(node, 5, "is_causal"):
                raise Skip(f"{module_path(node)}: self-attention already has a mask or is causal")
        if not found:
            raise Skip("found no self-attention in the block stack")
        return found

    # --- checking on FakeTensors ----------------------------------------------------------------

    def _rerun_padded(self) -> dict[fx.Node, Any]:
        """Example values of every region node with the entries padded; raises Skip if an op refuses."""
        values: dict[fx.Node, Any] = {}
        lookup = lambda a: values[a] if isinstance(a, fx.Node) and a in values else value(a)  # noqa: E731
        for entry in self.entries:
            values[entry] = evaluate("call_function", torch.nn.functional.pad, (entry, self._widths(entry)), {})
        mask = evaluate(
            "call_function",
            _key_mask_value,
            (self.tokens, self.pad, self._device()),
            {},
            mode=fake_mode_of(value(self.entries[0])),
        )
        for node in self.nodes:
            if node not in self.region:
                continue
            args, kwargs = node.args, dict(node.kwargs)
            if node in self.self_attention and self.form == "mask":
                kwargs["attn_mask"] = mask
            elif node in self.self_attention:  # "slice": K and V cut back to the real tokens
                for index, name in ((1, "key"), (2, "value")):
                    padded = lookup(_sdpa_arg(node, index, name))
                    if not isinstance(padded, torch.Tensor) or padded.shape[-2] != self.tokens + self.pad:
                        raise Skip(
                            f"{module_path(node)}: its {name} does not hold the {self.tokens + self.pad} padded tokens at dim -2"
                        )
                    cut = evaluate("call_function", operator.getitem, (padded, self._real_keys(padded)), {})
                    args, kwargs = _with_sdpa_arg(args, kwargs, index, name, cut)
            try:
                values[node] = evaluate(node.op, node.target, args, kwargs, lookup)
            except Exception as error:  # any op that cannot take L + P tokens
                raise Skip(
                    f"{module_path(node)}: {node.name} does not accept {self.tokens + self.pad} tokens "
                    f"({type(error).__name__}: {str(error).splitlines()[0][:120]})"
                ) from None
        return values

    def _check_token_major(self, node: fx.Node, v: Any, tokens, what: str) -> None:
        if not isinstance(v, torch.Tensor) or v.dim() < 2 or (tokens is not None and v.shape[1] != tokens):
            shape = tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__
            raise Skip(f"{module_path(node)}: {node.name} {what} without tokens at dim 1 (shape {shape})")

    def _widths(self, node: fx.Node) -> list[int]:
        """``F.pad`` widths (last dim first) that pad the token dim of an entry by P at its end."""
        return [0, 0] * (value(node).dim() - 1 - self._token_dim(node)) + [0, self.pad]

    def _real_keys(self, kv: Any) -> tuple:
        """The index that cuts a K or V (tokens at dim -2) back to the real tokens."""
        return (slice(None),) * (kv.dim() - 2) + (slice(None, self.tokens),)

    def _device(self) -> torch.device:
        return value(_sdpa_arg(self.self_attention[0], 1, "key")).device

    # --- rewriting ------------------------------------------------------------------------------

    def apply(self) -> None:
        last_placeholder = [n for n in self.nodes if n.op == "placeholder"][-1]
        for entry in self.entries:
            anchor = last_placeholder if entry.op == "placeholder" else entry  # placeholders stay first
            padded = Emitter(self.graph, anchor, entry, after=True).call(
                torch.nn.functional.pad, entry, self._widths(entry), name=f"{entry.name}_padded"
            )
            entry.replace_all_uses_with(padded, delete_user_cb=lambda user: user in self.region)
        if self.form == "mask":
            mask = self._emit_key_mask()
            for node in self.self_attention:
                if len(node.args) > 3:
                    node.update_arg(3, mask)
                else:
                    node.update_kwarg("attn_mask", mask)
        for node, v in self.values.items():
            if node in self.region and "example_value" in node.meta:
                node.meta["example_value"] = v
        if self.form == "slice":  # after the padded example values: the cuts are computed from them
            for node in self.self_attention:
                self._cut_keys(node)
        for node in self.exits:
            cut = Emitter(self.graph, node, node, after=True).getitem(
                node, (slice(None), slice(None, self.tokens)), name=f"{node.name}_unpadded"
            )
            node.replace_all_uses_with(cut, delete_user_cb=lambda user: user not in self.region and user is not cut)  # noqa: B023 (called here)

    def _cut_keys(self, node: fx.Node) -> None:
        """Self-attention `node` reads its K and V cut back to the real tokens (one cut where K is V), made right
        before it in its module (the attention's: the planner prices them with its macro)."""
        emit = Emitter(self.graph, node, node)
        cuts: dict[fx.Node, fx.Node] = {}
        for index, name in ((1, "key"), (2, "value")):
            kv = _sdpa_arg(node, index, name)
            if kv not in cuts:
                cuts[kv] = emit.getitem(kv, self._real_keys(value(kv)), name=f"{kv.name}_real")
            if len(node.args) > index:
                node.update_arg(index, cuts[kv])
            else:
                node.update_kwarg(name, cuts[kv])

    def _emit_key_mask(self) -> fx.Node:
        first = next(n for n in self.nodes if n in self.region)
        emit = Emitter(self.graph, first, first, stack={})
        positions = emit.call(torch.arange, self.tokens + self.pad, device=self._device(), name="token_positions")
        valid = emit.call(operator.lt, positions, self.tokens, name="valid_tokens")
        return emit.method("view", valid, 1, 1, 1, self.tokens + self.pad, name="key_mask")


def _is_parameter(node: fx.Node) -> bool:
    return isinstance(node.meta.get("example_value"), torch.nn.Parameter) or node.type is torch.nn.Parameter


def _key_mask_value(tokens: int, pad: int, device: torch.device) -> torch.Tensor:
    return (torch.arange(tokens + pad, device=device) < tokens).view(1, 1, 1, tokens + pad)


def _with_sdpa_arg(args: tuple, kwargs: dict, index: int, name: str, new: Any) -> tuple[tuple, dict]:
    """An SDPA call's (args, kwargs) with argument `index` / `name` replaced by `new`."""
    if len(args) > index:
        return (*args[:index], new, *args[index + 1 :]), kwargs
    return args, {**kwargs, name: new}


def _sdpa_arg(node: fx.Node, index: int, name: str) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name)
