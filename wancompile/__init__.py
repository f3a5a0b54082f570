"""wancompile: a torch.compile backend that auto-shards Wan 2.2 over XLA device meshes.

transformer = torch.compile(pipe.transformer, backend="wan_autoshard", options={"mesh": "8x4"})

Importing the package imports neither torch nor torch_xla: the names whose modules need them load on
first use (`__getattr__`), so ``wancompile explain`` / ``diff`` / ``validate`` / ``export``, which only
read JSON, start in a fraction of a second (tests/test_cli.py checks the imports).
"""

__version__ = "0.1.0"

import importlib as _importlib

from wancompile import runtime as _runtime

# SPMD must be on before torch_xla's runtime starts; torch.compile(..., backend="wan_autoshard")
# imports this package, so enabling it here makes compile-then-run safe (wancompile/runtime.py).
# It sets environment variables only; torch_xla is not imported.
if not _runtime.enable_spmd_early():
    import warnings

    warnings.warn(
        "wancompile was imported after torch_xla's runtime started without SPMD; wan_autoshard "
        "compiles in this process will be refused (see wancompile/runtime.py). Import wancompile "
        "before the first XLA use.",
        RuntimeWarning,
        stacklevel=2,
    )

from planner.errors import Error, InfeasiblePlanError, MemoryBudgetError, PlanError, SolverTimeout
from planner.mesh import MeshError

# public names whose modules import torch: name -> module, imported on first access (PEP 562)
_LAZY = {
    "OptionsError": "wancompile.options",
    "VerificationError": "wancompile.verify",
    "NonFiniteInputError": "wancompile.verify",
    "enable_full_t": "wancompile.vae",
    "disable_full_t": "wancompile.vae",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'wancompile' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value  # the next access is a plain attribute
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


def compile_pipeline(pipe, *args, **kwargs):
    """Compile a diffusers `WanPipeline`'s transformer(s) and VAE decode; see `wancompile.pipeline.compile_pipeline`."""
    from wancompile.pipeline import compile_pipeline as _compile_pipeline

    return _compile_pipeline(pipe, *args, **kwargs)


def restore_pipeline(pipe):
    """Undo `compile_pipeline`; see `wancompile.pipeline.restore_pipeline`."""
    from wancompile.pipeline import restore_pipeline as _restore_pipeline

    return _restore_pipeline(pipe)


__all__ = [
    "compile_pipeline",
    "restore_pipeline",
    "enable_full_t",
    "disable_full_t",
    "__version__",
    # the errors of docs/errors.md, all `Error`s; the backend raises them as themselves (wancompile.catchable)
    "Error",
    "PlanError",
    "MemoryBudgetError",
    "InfeasiblePlanError",
    "SolverTimeout",
    "MeshError",
    "OptionsError",
    "VerificationError",
    "NonFiniteInputError",
]
