"""The project's errors reach the caller of a compiled function as themselves, not as dynamo's wrapper.

Dynamo wraps whatever a backend raises in ``BackendCompilerFailed`` (its ``inner_exception`` holds the
error), so ``except wancompile.PlanError`` around ``torch.compile(model, backend="wan_autoshard")(x)``
would catch nothing. Dynamo lets one family through unwrapped: ``ShortenTraceback``, the base of its own
backend-failure error. `catchable` re-raises a project error (one defined in ``planner`` or
``wancompile``, docs/errors.md) as an instance of a subclass of both its own class and
``ShortenTraceback``: ``isinstance(e, MemoryBudgetError)`` holds, its fields (``need_gb``, ...) and
message are the original's, and dynamo passes it on (trimming its own frames from the traceback).
Anything else (a bug, torch's own errors) keeps dynamo's wrapping.
"""

from __future__ import annotations

_SUBCLASSES: dict[type, type] = {}


def is_ours(e: BaseException) -> bool:
    module = type(e).__module__
    return module.split(".")[0] in ("planner", "wancompile")


def catchable(e: Exception) -> Exception:
    """`e` as an instance of ``type(e)`` that dynamo does not wrap (module docstring)."""
    from torch._dynamo.exc import ShortenTraceback

    if isinstance(e, ShortenTraceback) or not is_ours(e):
        return e
    cls = type(e)
    sub = _SUBCLASSES.get(cls)
    if sub is None:
        sub = _SUBCLASSES[cls] = type(
            cls.__name__,
            (cls, ShortenTraceback),
            {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__},
        )
    out = sub.__new__(sub)
    out.args = e.args
    out.__dict__.update(e.__dict__)
    out.first_useful_frame = None  # keep the whole traceback: it ends in the project's code
    return out.with_traceback(e.__traceback__)
