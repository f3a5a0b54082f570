"""What persists across processes under the ``cache_dir`` option: plans by graph hash, XLA's programs.

A second process that compiles the same model still captures it with dynamo (that is how it learns
which graph it has), but then skips what it can:

* **plans** (`PlanCache`): the planner's answer for an annotated graph is a function of the graph, the
  mesh, the planning options and the planner's code, so it is stored as ``plans/<key>.json`` under that
  key (`plan_key`) and read back with `planner.plan.load_plan` instead of solving again. A changed
  planner source file changes the key (`planner_version`), so a stale plan is never served.
* **XLA executables** (`start_xla_cache`): torch_xla's persistent compilation cache
  (``torch_xla.runtime.initialize_cache``) under ``xla/``, keyed by torch_xla on the traced graph's hash,
  so a compiled program is loaded instead of compiled (its ``PersistentCacheHit`` counter says so).
  XLA:CPU's PJRT client serializes executables but cannot load them ("Deserializing serialized executable
  not supported", torch_xla 2.9: every load is a ``PersistentCacheDeserializeFailure`` and a recompile),
  so on ``PJRT_DEVICE=CPU`` it stays off; accelerator clients (TPU, GPU, tt-xla's plugin) load them. It must be switched on before the runtime starts,
  and it is left off when HLO dumps are asked for: a program loaded from the cache is not compiled,
  so XLA writes no partitioned HLO for the collectives check to read.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from planner.graph import Graph
from planner.mesh import MeshSpec
from planner.plan import Plan, PlanError, load_plan, save_plan

log = logging.getLogger("wancompile")

_PLANNER = Path(__file__).resolve().parents[1] / "planner"


@lru_cache(maxsize=1)
def planner_version() -> str:
    """A hash of the planner's source and data files: plans made by other planner code do not match."""
    h = hashlib.sha256()
    for path in sorted(p for p in _PLANNER.rglob("*") if p.suffix in (".py", ".json") and p.is_file()):
        h.update(path.relative_to(_PLANNER).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def plan_key(graph: Graph, mesh: MeshSpec, settings: Mapping[str, Any]) -> str:
    """The key of the plan for `graph` on `mesh` under the planning `settings` (JSON-able values)."""
    h = hashlib.sha256()
    for part in (planner_version(), graph.to_json(), json.dumps([mesh.shape, mesh.axis_names])):
        h.update(part.encode())
    h.update(json.dumps(dict(settings), sort_keys=True, default=str).encode())
    return h.hexdigest()[:32]


class PlanCache:
    """Plans stored as ``<root>/plans/<key>.json``."""

    def __init__(self, root: Path) -> None:
        self.dir = Path(root) / "plans"

    def get(self, key: str) -> Optional[Plan]:
        """The stored plan of `key`, or None (none stored, or unreadable: then it is planned again)."""
        path = self.dir / f"{key}.json"
        if not path.is_file():
            return None
        try:
            return load_plan(path)
        except (PlanError, KeyError, TypeError, ValueError) as e:
            log.warning("wan_autoshard: ignoring the cached plan %s (%s); planning again", path, e)
            return None

    def put(self, key: str, plan: Plan) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        save_plan(plan, self.dir / f"{key}.json")


def cached_plan(
    root: Optional[Path], graph: Graph, mesh: MeshSpec, settings: Mapping[str, Any], solve: Callable[[], Plan]
) -> tuple[Plan, bool]:
    """The plan `solve()` makes, read from the plan cache under `root` when it holds one for this key
    (stored there after solving otherwise); `root` None: no cache. Returns (plan, whether it was cached)."""
    if root is None:
        return solve(), False
    cache, key = PlanCache(root), plan_key(graph, mesh, settings)
    plan = cache.get(key)
    if plan is not None:
        log.info("wan_autoshard: plan %s from the plan cache %s", key, cache.dir)
        return plan, True
    plan = solve()
    cache.put(key, plan)
    return plan, False


def start_xla_cache(root: Path) -> bool:
    """torch_xla's persistent compilation cache under ``<root>/xla``, if the runtime has not started, no
    HLO dump directory is set and the device is not XLA:CPU; returns whether it is on."""
    from wancompile import runtime

    if os.environ.get("XLA_PERSISTENT_CACHE_PATH"):
        return True
    if runtime.runtime_started() or runtime.current_dump_dir() is not None:
        return False
    if os.environ.get("PJRT_DEVICE", "CPU").upper() == "CPU":  # XLA:CPU cannot load what it stores (module doc)
        return False
    import torch_xla
    import torch_xla.runtime as xr

    if torch_xla._XLAC._xla_computation_cache_is_initialized():
        return False
    path = Path(root) / "xla"
    path.mkdir(parents=True, exist_ok=True)
    xr.initialize_cache(str(path), readonly=False)
    return True
