"""The programs the backend compiled in this process (the last eight), for inspection: a registry that
the backend writes (`remember`) and the verifier, the pipeline wrappers and the tests read, without
importing the backend (no import circle backend -> wrappers -> verify -> backend)."""

from __future__ import annotations

from enum import Enum
from typing import Optional


class Component(str, Enum):
    """What a captured graph is, as the backend recognises it (`planner.families`; `ShardedProgram.kind`); the
    value is the model name its plan carries."""

    DIT = "wan-dit"  # a Wan DiT forward (repeated attention blocks)
    VAE = "wan-vae"  # a Wan VAE decode
    GRAPH = "graph"  # anything else: runs replicated

    @classmethod
    def of(cls, family: Optional[str]):
        """The component of a graph of planner family `family` (`planner.families`; None: none recognised it),
        or the family's name itself for a family registered since (a program's ``kind`` is its model name)."""
        if family is None:
            return cls.GRAPH
        return next((c for c in cls if c.value == family), family)


_RECENT: list = []  # newest last
KEEP = 8


def remember(program) -> None:
    """Record a program the backend compiled (the last `KEEP` are kept)."""
    _RECENT.append(program)
    del _RECENT[:-KEEP]


def last_program():
    """The most recently compiled `ShardedProgram` (plan, HLO path, verification), for inspection."""
    if not _RECENT:
        raise RuntimeError("no graph has been compiled with backend='wan_autoshard' in this process yet")
    return _RECENT[-1]


def recent_programs(kind: Optional[Component] = None) -> list:
    """The programs compiled in this process, oldest first (the last eight); of one `Component` if `kind`."""
    return [p for p in _RECENT if kind is None or p.kind == kind]
