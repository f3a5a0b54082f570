"""FX graph passes that normalise the captured Wan graphs before planning (DESIGN.md §6).

Each pass is one file, numerically identical to what it replaces (docs/rewrites.md states the bound
for each), that registers itself (`rewrites._registry`): its name, a one-line summary and when it runs
are data, from which `PASS_NAMES`, the backend's ``rewrites`` option, the CLI's ``--rewrites`` and the
run order all come. Nothing here imports the planner or torch_xla.

    gm, reports = apply_rewrites(gm, "all", RewriteContext(sp_multiple=8 * 32))

rewrites ``gm`` (a GraphModule from dynamo, nodes carrying ``meta["example_value"]`` and
``meta["nn_module_stack"]``) in place and returns it with one `RewriteReport` per pass that ran. New
nodes keep both meta fields, so capture reads the rewritten graph like the original.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Sequence, Union

import torch.fx as fx

from ._core import RewriteContext, RewriteReport
from ._registry import Pass, Rewrite, ordered

# Every pass module registers its passes on import (the order they run in is their `Rewrite.order`): a new
# rewrite is one file here, nothing to list
for _module in pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["PASS_NAMES", "PASSES", "REWRITES", "Rewrite", "RewriteContext", "RewriteReport", "apply_rewrites"]

REWRITES: tuple[Rewrite, ...] = ordered()
PASSES: dict[str, Pass] = {r.name: r.run for r in REWRITES}
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
