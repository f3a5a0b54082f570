"""The rewrite registry: every normalising pass, its name, and when it runs, as data.

A pass file ends with ``register(Rewrite(...))``; importing it (``rewrites/__init__.py`` imports every
pass module) is all it takes for the pass to be in `PASS_NAMES`, accepted by the backend's ``rewrites``
option and the CLI's ``--rewrites``, and run in its place by `apply_rewrites`.

Order: passes run by ``order`` (a number: gaps of 10 leave room for a new pass between two; ties by
name), and every ``after`` dependency is checked to run first. The local normalisations sit at 10-50,
``sp_pad`` at 90: it pads the graph the others produced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Optional

import torch.fx as fx

from ._core import RewriteContext, RewriteReport

Pass = Callable[[fx.GraphModule, RewriteContext], RewriteReport]


@dataclass(frozen=True)
class Rewrite:
    """One registered pass: ``run(gm, context)`` rewrites ``gm`` in place and reports what it did."""

    name: str
    run: Pass
    summary: str  # one line: what it matches and what it emits (CLI help, docs)
    order: int  # run position (smaller first)
    after: tuple[str, ...] = ()  # passes that must have run before this one (when both are selected)


_REGISTRY: dict[str, Rewrite] = {}


def register(rewrite: Rewrite) -> Rewrite:
    """Add ``rewrite`` to the registry (a name registers once); returns it."""
    if rewrite.name in _REGISTRY and _REGISTRY[rewrite.name] != rewrite:
        raise ValueError(f"rewrite {rewrite.name!r} is registered twice")
    _REGISTRY[rewrite.name] = rewrite
    return rewrite


def ordered(rewrites: Optional[Iterable[Rewrite]] = None) -> tuple[Rewrite, ...]:
    """``rewrites`` (default: every registered pass) in run order; raises if a pass would run before one
    it names in ``after``."""
    passes = sorted(_REGISTRY.values() if rewrites is None else rewrites, key=lambda r: (r.order, r.name))
    position = {r.name: i for i, r in enumerate(passes)}
    for r in passes:
        for dep in r.after:
            if dep not in position:
                raise ValueError(f"rewrite {r.name!r} runs after {dep!r}, which is not registered")
            if position[dep] > position[r.name]:
                raise ValueError(f"rewrite {r.name!r} must run after {dep!r}: give {dep!r} an order below {r.order}")
    return tuple(passes)
