"""FX graph passes that normalise the captured Wan graphs before planning (DESIGN.md §6).

Each pass is one file, numerically identical to what it replaces (docs/rewrites.md states the bound
for each). Nothing here imports the planner or torch_xla.

    gm, reports = apply_rewrites(gm, "all", RewriteContext(sp_multiple=8 * 32))

rewrites ``gm`` (a GraphModule from dynamo, nodes carrying ``meta["example_value"]`` and
``meta["nn_module_stack"]``) in place and returns it with one `RewriteReport` per pass that ran. New
nodes keep both meta fields, so capture reads the rewritten graph like the original.
"""

from __future__ import annotations

from typing import Callable, Sequence, Union

import torch.fx as fx

from ._core import RewriteContext, RewriteReport
from .conv import conv1x1_to_linear, patch_embed_to_linear
from .qkv import fuse_qkv
from .rmsnorm import fuse_rmsnorm
from .rope import rope_without_scatter
from .sp_pad import pad_tokens

__all__ = ["PASS_NAMES", "PASSES", "RewriteContext", "RewriteReport", "apply_rewrites"]

Pass = Callable[[fx.GraphModule, RewriteContext], RewriteReport]

# Passes run in this order whatever order they are named in: conv1x1 before patch_embed claims a
# k = s = 1 conv for the cheaper form; sp_pad last, so it pads the graph the others produced.
PASSES: dict[str, Pass] = {
    "qkv": fuse_qkv,
    "rmsnorm": fuse_rmsnorm,
    "conv1x1": conv1x1_to_linear,
    "patch_embed": patch_embed_to_linear,
    "rope": rope_without_scatter,
    "sp_pad": pad_tokens,
}
PASS_NAMES = tuple(PASSES)


def apply_rewrites(
    gm: fx.GraphModule,
    names: Union[str, Sequence[str]] = "all",
    context: RewriteContext = RewriteContext(),
) -> tuple[fx.GraphModule, list[RewriteReport]]:
    """Run the named passes (``"all"``, ``"none"``, a sequence of names, or a comma-separated string)
    on ``gm`` in place, in `PASS_NAMES` order; return ``gm`` and one report per pass run."""
    selected = _select(names)
    reports = [PASSES[name](gm, context) for name in PASS_NAMES if name in selected]
    return gm, reports


def _select(names: Union[str, Sequence[str]]) -> set[str]:
    if isinstance(names, str):
        if names == "all":
            return set(PASS_NAMES)
        if names == "none":
            return set()
        names = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in names if n not in PASSES]
    if unknown:
        raise ValueError(
            f"unknown rewrite pass(es) {unknown}: valid names are {', '.join(PASS_NAMES)} (or 'all' / 'none')"
        )
    return set(names)
