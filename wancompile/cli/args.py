"""What every ``wancompile`` verb shares: exit codes, `UsageError`, the one-line-error argparse parser,
argument types, the output-directory check."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from planner.errors import Error

USAGE_EXIT = 2  # argparse's convention for usage errors; every bad input through the CLI exits with it
FAILURE_EXIT = 1  # the input was fine but the work failed (a file that cannot be written, invalid plans)


class UsageError(Error):
    """A bad command-line value; `main` prints it as one line and exits with USAGE_EXIT."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``wancompile plan: error: ...`` and exit 2, no usage block."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(USAGE_EXIT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _positive_int(what: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} must be a whole number, got {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{what} must be at least 1, got {value}")
        return value

    return parse


def _number(what: str, *, positive: bool):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} must be a number, got {text!r}") from None
        if not math.isfinite(value) or (value <= 0 if positive else value < 0):
            raise argparse.ArgumentTypeError(f"{what} must be {'positive' if positive else 'zero or more'}, got {text}")
        return value

    return parse


def count_flag(parser: argparse.ArgumentParser, flag: str, default, help: str | None = None) -> None:
    """A whole-number flag of at least 1, its errors naming `flag`."""
    parser.add_argument(flag, type=_positive_int(flag), default=default, help=help)


def number_flag(parser: argparse.ArgumentParser, flag: str, default, help: str | None = None, *, positive=True) -> None:
    """A finite number flag, positive (or, ``positive=False``, zero or more), its errors naming `flag`."""
    parser.add_argument(flag, type=_number(flag, positive=positive), default=default, help=help)


def check_out_dir(out: Path, flag: str) -> None:
    """`out` exists as a writable directory (created if needed), else a UsageError naming `flag`."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"{flag} {out} is a file; give a directory to write into")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{flag} {out}: cannot create the directory ({e.strerror})") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {out}: the directory is not writable; choose another --out")


def check_video(spec, resolution: str, frames: int) -> None:
    """`spec` (a `wancompile.models.WanModel`) has `resolution` and takes `frames`; else a UsageError
    naming the flag at fault."""
    try:
        spec.latent_shape(resolution, frames)
    except ValueError as e:
        raise UsageError(f"--{'resolution' if 'resolution' in str(e) else 'frames'}: {e}") from None
