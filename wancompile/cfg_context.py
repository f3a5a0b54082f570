"""The CFG-pair context: whether the batch-2 forward being compiled is a CFG pair its caller can also run as
two batch-1 forwards (`compile_pipeline`'s `CFGBatched`), which lets the planner choose ``sequential``."""

from __future__ import annotations

import contextlib
import contextvars

# True while a caller that can run a CFG pair as two batch-1 forwards instead (compile_pipeline's `CFGBatched`)
# calls its batch-2 forward: the planner may then choose ``sequential`` (planner.cfg.CfgSequential is raised)
CFG_PAIR_SPLITTABLE: contextvars.ContextVar[bool] = contextvars.ContextVar("wancompile_cfg_pair", default=False)


@contextlib.contextmanager
def cfg_pair_splittable(flag: bool = True):
    """Calls inside run a CFG pair's batch-2 forward that the caller can run as two forwards instead."""
    token = CFG_PAIR_SPLITTABLE.set(flag)
    try:
        yield
    finally:
        CFG_PAIR_SPLITTABLE.reset(token)
