"""The project's errors reach the caller of a compiled function as themselves, not as dynamo's wrapper.

Dynamo wraps whatever a backend raises in ``BackendCompilerFailed`` (its ``inner_exception`` holds the
error), so ``except wancompile.Error`` around ``torch.compile(model, backend="wan_autoshard")(x)``
would catch nothing. Dynamo lets one family through unwrapped: ``ShortenTraceback``, the base of its own
backend-failure error. `catchable` re-raises a project error (a `planner.errors.Error`, docs/errors.md)
as an instance of a subclass of both its own class and ``ShortenTraceback``: ``isinstance(e,
MemoryBudgetError)`` holds, its fields (``need_gb``, ...) are the original's, and dynamo passes it on
(trimming its own frames from the traceback).

On its way out dynamo appends its advice to the message of every error that passes (``Set
TORCHDYNAMO_VERBOSE=1 ... reporting a bug to PyTorch``, by assigning ``args``): advice about dynamo's
bugs, where the project's message already says what was wrong and how to fix it. The re-raised error's
``args`` are fixed when it is made (`_Final`), so its message is the original's, word for word.
Anything else (a bug, torch's own errors) keeps dynamo's wrapping and its advice.
"""

from __future__ import annotations

from planner.errors import Error

_SUBCLASSES: dict[type, type] = {}


class _Final:
    """``args`` that keep the value they were made with: assigning them again (dynamo's
    ``augment_exc_message``) changes nothing, so ``str(e)`` is the project's message."""

    @property
    def args(self) -> tuple:
        return BaseException.args.__get__(self)

    @args.setter
    def args(self, value: tuple) -> None:
        pass


def catchable(e: Exception) -> Exception:
    """`e` as an instance of ``type(e)`` that dynamo neither wraps nor appends to (module docstring)."""
    from torch._dynamo.exc import ShortenTraceback

    if isinstance(e, ShortenTraceback) or not isinstance(e, Error):
        return e
    cls = type(e)
    sub = _SUBCLASSES.get(cls)
    if sub is None:
        sub = _SUBCLASSES[cls] = type(
            cls.__name__,
            (_Final, cls, ShortenTraceback),
            {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__},
        )
    out = sub.__new__(sub)
    BaseException.args.__set__(out, e.args)
    out.__dict__.update(e.__dict__)
    out.first_useful_frame = None  # keep the whole traceback: it ends in the project's code
    return out.with_traceback(e.__traceback__)
