"""The DiT plan's activation constraints: where GSPMD is told a layout, and why.

Owns the constraints a plan writes beside its parameter specs: the block-stack entry and exit, the
stream pins and copies `planner.dit_assemble` lists (written for every block, or for an FSDP block
range), the adaLN modulation, the further families' entries, the prologue values the blocks read,
sp_pad's paddings and unpadding slices, the RoPE tables, the batch-split inputs. Each is there
because GSPMD, left open, chose otherwise (the measurement is in the reason).

A mixin of `planner.dit_family.DitFamily`: its methods read the family's state (``self.g``, ``self.st``, ``self.mesh`` ...) and call its other parts by name.
"""

from __future__ import annotations

from planner.dit_state import DitState
from planner.graph import Graph, Node
from planner.placements import Layout
from planner.plan import (
    ActivationConstraint,
)


class DitPins(DitState):
    """The DiT plan's activation constraints (see the module docstring)."""

    def _activations(self, pins, sigma0, copies, *, tokens_split: bool, ranged=()) -> tuple[ActivationConstraint, ...]:
        """Constraints: `pins` (node, layout, reason) in place after the op, `copies` (reader, input index,
        layout) on a reader's input; block nodes are written for every block, `ranged` pins (node,
        layout, reason, blocks) for those blocks only (FSDP per block range); the prologue values the
        blocks read, in their planned layout. `tokens_split`: some block macro splits the stream's tokens."""
        entry = self.g[self.st.entry]
        acts = [
            ActivationConstraint(
                entry.location,
                self.stream(sigma0).to_spec(),
                entry.out.shape,
                reason="block-stack entry: tokens split over the SP axes (a transpose copy, not a reshape)",
            )
        ]
        if entry.op == "pad" and any(sigma0[0]):
            # sp_pad's token padding: keep its input whole, so the split starts after the pad (a free
            # local slice). Left to propagation, GSPMD splits the unpadded tokens and shifts them into
            # the padded shards with a collective-permute (45 -> 64 tokens over 4: 12 vs 16 per device).
            src = self.g[entry.inputs[0]]
            whole = self.lift(src.name, Layout.replicated(len(src.out.shape))).to_spec()
            acts.insert(
                0, ActivationConstraint(src.location, whole, src.out.shape, reason="tokens whole before SP padding")
            )

        def per_block(node, blocks=None) -> list:
            if not self.st.in_rep(self.g, node):
                return [node.location]
            return [self.g.block_location(node, k) for k in (range(self.n) if blocks is None else blocks)]

        for name, lay, why, *blocks in [*pins, *ranged]:
            node = self.g[name]
            k = self.g.picks(node)
            # output k of a tuple-valued op (an adaLN chunk piece) is constrained at that op: a getitem
            # of a tuple is no op in the model's own code (plain torch_xla, the export, cannot see it)
            at, output = (self.g[node.inputs[0]], k) if k is not None else (node, 0)
            acts += [
                ActivationConstraint(loc, lay.to_spec(), node.out.shape, output=output, reason=why)
                for loc in per_block(at, *blocks)
            ]
        for name, i, lay in copies:
            node, value = self.g[name], self.g[self.g[name].inputs[i]]
            acts += [
                ActivationConstraint(
                    loc,
                    lay.to_spec(),
                    value.out.shape,
                    input=i,
                    reason="stream read in this macro's layout (a copy: the producing macro keeps its own)",
                )
                for loc in per_block(node)
            ]
        if tokens_split:
            for table in _rope_tables(self.g):
                acts.append(
                    ActivationConstraint(
                        table.location,
                        (None,) * len(table.out.shape),
                        table.out.shape,
                        reason="RoPE table kept replicated: each device slices its token rows locally (unconstrained, GSPMD "
                        "propagates the SP split back into the table's (F, H, W) -> L reshape and emits all-to-alls)",
                    )
                )
        # GSPMD propagates a split the blocks read in backwards into the unconstrained prologue
        # (measured: with the stream split beyond σ, the timestep projection all-reduced on a
        # contraction it chose to split; an FSDP K/V projection split on its input features made the
        # image embedder's last linear compute half its features and its LayerNorm all-reduce the
        # statistics): the values the blocks read from the prologue keep the rules' layout.
        pinned = {a.location for a in acts}
        for x in self._side_inputs():
            node = self.g[x]
            if node.location not in pinned and self.base.get(x):
                acts.append(
                    ActivationConstraint(
                        node.location,
                        self.base[x][0].to_spec(),
                        node.out.shape,
                        reason="prologue value the blocks read, kept in its planned layout",
                    )
                )
        if tokens_split:
            # the other token paddings (sp_pad: RoPE tables, diffusion forcing's per-token modulation and
            # output shift/scale) read whole like the entry's: left open, GSPMD split the unpadded
            # shift/scale of the output modulation and shifted them with collective-permutes
            pinned = {a.location for a in acts}
            for pad in self.g:
                src = self.g[pad.inputs[0]] if pad.op == "pad" and pad.inputs else None
                while src is not None and src.op == "to" and self.g[src.inputs[0]].outputs == src.outputs:
                    src = self.g[src.inputs[0]]  # a device-only .to, which the lowering drops
                if src is None or pad.name == entry.name or src.location in pinned or not self._pads_tokens(pad, src):
                    continue
                whole = self.lift(src.name, Layout.replicated(len(src.out.shape))).to_spec()
                acts.append(
                    ActivationConstraint(src.location, whole, src.out.shape, reason="tokens whole before SP padding")
                )
            # and sp_pad's unpadding slices outside the blocks (Animate's face adapter reads the padded
            # stream, slices the true tokens back to group them by frame) read and make their planned
            # layouts: left open, GSPMD kept the token split through the slice (a collective-permute
            # shifting the shards onto the true token count), then gathered at the frame reshape
            ends = self.ends(sigma0)
            planned = ends.layouts
            for cut in self.g:
                src = self.g[cut.inputs[0]] if cut.op == "getitem" and cut.inputs else None
                if (
                    src is None
                    or cut.block is not None
                    or self.g.picks(cut) is not None
                    or cut.location in pinned
                    or not planned.get(cut.name)
                    or not self._pads_tokens(src, cut)
                ):
                    continue
                read = ends.required.get((cut.name, 0))
                if read is not None:
                    acts.append(
                        ActivationConstraint(
                            cut.location,
                            read.to_spec(),
                            src.out.shape,
                            input=0,
                            reason="padded tokens read by the unpadding slice as planned (resharded before it)",
                        )
                    )
                acts.append(
                    ActivationConstraint(
                        cut.location,
                        planned[cut.name][0].to_spec(),
                        cut.out.shape,
                        reason="tokens unpadded in their planned layout",
                    )
                )
        exit_ = self.g[self.st.exit]
        exit_lay = self.lift(exit_.name, Layout.replicated(len(exit_.out.shape)))
        acts.append(
            ActivationConstraint(
                exit_.location,
                exit_lay.to_spec(),
                exit_.out.shape,
                reason="exit: tokens gathered before unpatchify"
                + (" (batch stays split: each half keeps its branch)" if self.batch_axes else ""),
            )
        )
        inputs = [
            ActivationConstraint(
                self.g[x].location,
                lays[0].to_spec(),
                self.g[x].out.shape,
                reason="model input split on the batch: one CFG branch per half of the mesh",
            )
            for x, lays in self.inputs.items()
        ]
        return tuple(inputs + acts)

    def _family_entries(self, chosen) -> tuple[ActivationConstraint, ...]:
        """Each further family's entries (VACE's control tokens: patch-embedded, then ``cat`` with zero
        padding) in the layout its first macro reads them, the values they are made from whole: left
        open, GSPMD propagated the token split back through the patch embedding's transpose into the
        conv and all-to-all'ed it (measured on 2x4); whole, the split is a local slice at the entry."""
        out = []
        for f in self.st.families:
            lay = self.stream(chosen[f.macros[0].name].stream)
            for x in f.entries:
                node = self.g[x]
                for i in dict.fromkeys(node.inputs):
                    src = self.g[i]
                    while src.outputs and src.op in ("transpose", "flatten") and src.inputs:
                        if src.op == "transpose":
                            whole = self.lift(i, Layout.replicated(len(src.out.shape)))
                            out.append(
                                ActivationConstraint(
                                    src.location,
                                    whole.to_spec(),
                                    src.out.shape,
                                    reason="block-family entry's tokens whole until the entry (left open, GSPMD split "
                                    "the patch embedding's channels and all-to-all'ed them onto the tokens: 2x4)",
                                )
                            )
                        src = self.g[src.inputs[0]]
                    if src.op in ("conv3d", "linear") and not any(x.location == src.location for x in out):
                        whole = self.lift(src.name, Layout.replicated(len(src.out.shape)))
                        out.append(
                            ActivationConstraint(
                                src.location,
                                whole.to_spec(),
                                src.out.shape,
                                reason="block-family patch embedding whole",
                            )
                        )
                readers = self._entry_projections(x)
                if not any(lay.dims) or not readers:
                    out.append(
                        ActivationConstraint(
                            node.location,
                            lay.to_spec(),
                            node.out.shape,
                            reason="block-family entry (the control tokens): laid out as its first macro reads them",
                        )
                    )
                    continue
                # whole up to the projection that reads it, whose output is split: each device projects
                # its own token rows (a pinned split on the concatenation still all-to-all'ed: 2x4)
                out.append(
                    ActivationConstraint(
                        node.location,
                        self.lift(x, Layout.replicated(len(node.out.shape))).to_spec(),
                        node.out.shape,
                        reason="block-family entry (the control tokens) whole; split by the projection reading it",
                    )
                )
                out += [
                    ActivationConstraint(
                        u.location,
                        lay.to_spec(),
                        u.out.shape,
                        reason="block-family entry projected in its first macro's layout (tokens on its SP axes)",
                    )
                    for u in readers
                ]
        return tuple(out)

    def _modulation(self, chosen, evals) -> list[tuple[str, Layout]]:
        """Block values that do not depend on the stream (the adaLN modulation: the block's table
        plus the timestep projection, chunked) read by ops that do, with the layout the chosen
        option of their macro gives them. With the stream split on hidden in one macro and whole in
        another, GSPMD propagated the split backwards into the shared chunk and all-gathered the other
        macro's vectors (measured: 3 per block on 2x4); pinned, each use slices its own. An op that
        reads only values made before the blocks (the RoPE table's even/odd columns) is left to its
        input's layout: the table is pinned where it is made.

        A per-token modulation (diffusion forcing: a timestep per frame, so the table plus a
        (B, 6, L, D) projection, chunked) is pinned all along, not only where the stream reads it:
        left open, GSPMD split the chunk on the stream's tokens and all-gathered each piece back to
        the layout the readers are pinned in (measured: 9 all-gathers over the whole 2x4 mesh, none
        predicted)."""
        block = [n for n in self.g if self.st.in_rep(self.g, n) and n.op != "placeholder"]
        dependent = {self.st.entry}
        for n in block:
            if any(i in dependent for i in n.inputs):
                dependent.add(n.name)
        out = []
        for n in block:
            m = self.macro_of.get(n.name)
            if n.name in dependent or not n.outputs or m is None:
                continue
            if all(self.g[i].block is None and not self.g[i].is_param for i in n.inputs):
                continue
            if any(u.name in dependent for u in self.g.users(n.name)) or self._per_token(n):
                lay = evals[m, chosen[m].name].layouts.get(n.name)
                if lay and lay[0] is not None:
                    out.append((n.name, self.lift(n.name, lay[0])))  # a CFG half keeps its branch
        return out

    def _per_token(self, node) -> bool:
        """Whether a single-output value of rank > 2 holds the stream's tokens on an inner dim: a per-token
        modulation, (B, 6, L, D) in SkyReels-V2 DF, (B, L, 6, D) in Wan 2.2 TI2V, its (B, L, D) pieces."""
        shape = node.out.shape if len(node.outputs) == 1 else ()
        return any(d == self.st.tokens for d in shape[1:-1]) if len(shape) > 2 else False

    def _pads_tokens(self, pad, src) -> bool:
        """Whether op `pad` pads `src` on one dim to the stream's token count (sp_pad's padding)."""
        if not src.outputs or len(src.outputs) != 1 or len(src.out.shape) != len(pad.out.shape):
            return False
        grown = [b for a, b in zip(src.out.shape, pad.out.shape) if a != b]
        return grown == [self.st.tokens]

    def _side_inputs(self) -> list[str]:
        """Non-parameter values made before the block stack that block 0 or the epilogue read,
        except the stream."""
        out: list[str] = []
        prologue, epilogue = set(self.st.prologue), set(self.st.epilogue)
        for node in self.g:
            if not self.st.in_rep(self.g, node) and node.name not in epilogue:
                continue
            for i in node.inputs:
                src = self.g[i]
                if (
                    i in prologue
                    and not src.is_param
                    and src.outputs
                    and i != self.st.entry
                    and src.op != "placeholder"
                    and i not in out
                    and self._reads_a_placeholder(i)
                ):
                    out.append(i)
        return out

    def _reads_a_placeholder(self, name: str) -> bool:
        """Whether `name` depends on a model input or parameter: a value made from literals alone
        (sp_pad's key mask, an ``arange`` on the host) has nothing to pin and may not live on the device."""
        todo, seen = [name], set()
        while todo:
            x = self.g[todo.pop()]
            if x.op == "placeholder":
                return True
            if x.name not in seen:
                seen.add(x.name)
                todo.extend(x.inputs)
        return False


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
