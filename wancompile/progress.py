"""Progress of long steps (capture, solve, report) and the console's logging setup for the CLI.

On a terminal a step shows a live line (``[2/4] solving … 1.3 s``) that a thread refreshes and the
step's end replaces with its time; elsewhere (CI, pipes, files) each step is one line, written when it
starts and finished when it ends (``[2/4] solving … done in 1.30 s``), or with ``-v`` one log record at
INFO when it ends. Everything goes to stderr; stdout keeps the command's result.

The console handlers write to whatever ``sys.stderr`` is when a record is written, not to the stream
that was stderr when they were made: a CLI run in-process (the tests) under a capture that later
closes leaves no handler on a closed stream (`StderrHandler`, `diffusers_to_stderr`). `quiet` drops the
records of other libraries that say nothing a user of the CLI can act on, by logger and message.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from contextlib import contextmanager
from typing import Iterator, Optional, TextIO

log = logging.getLogger("wancompile")


class StderrHandler(logging.StreamHandler):
    """A console handler on the current ``sys.stderr`` (looked up per record)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> TextIO:  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:  # the stream is always the current stderr
        pass


def setup_logging(verbose: int = 0, stream: Optional[TextIO] = None) -> None:
    """Console handler for the ``wancompile`` logger: WARNING by default, INFO with -v, DEBUG with -vv."""
    level = logging.WARNING if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG
    handler = logging.StreamHandler(stream) if stream is not None else StderrHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(level)
    log.propagate = False


_DIFFUSERS_CONSOLE: Optional[StderrHandler] = None


def diffusers_to_stderr() -> None:
    """diffusers' console handler, made when diffusers first logs and bound to the stream that was
    stderr then (its write and its flush), replaced by a `StderrHandler`; its level stays diffusers'."""
    global _DIFFUSERS_CONSOLE
    from diffusers.utils import logging as diffusers_logging

    if _DIFFUSERS_CONSOLE is None:
        _DIFFUSERS_CONSOLE = StderrHandler()
    diffusers_logging.disable_default_handler()
    diffusers_logging.add_handler(_DIFFUSERS_CONSOLE)  # once: the same handler object is not added twice


class _Drop(logging.Filter):
    def __init__(self, starts: tuple[str, ...]) -> None:
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.starts)


@contextmanager
def quiet(records: dict[str, tuple[str, ...]]) -> Iterator[None]:
    """While the block runs, drop the records that logger ``name`` ("" = the root logger) itself
    writes whose message starts with one of ``records[name]``; everything else passes."""
    filters = [(logging.getLogger(name), _Drop(tuple(starts))) for name, starts in records.items()]
    for logger, f in filters:
        logger.addFilter(f)
    try:
        yield
    finally:
        for logger, f in filters:
            logger.removeFilter(f)


# XLA's C++ log line at every GSPMD partitioning (torch_xla 2.9 partitions with GSPMD; a user of
# torch_xla cannot choose Shardy): one per compiled program, nothing to act on
GSPMD_DEPRECATION = "GSPMD sharding propagation is going to be deprecated"


@contextmanager
def without_stderr_lines(*needles: str) -> Iterator[None]:
    """While the block runs, drop the lines written to file descriptor 2 (C++ libraries' logs included)
    that contain one of `needles`; every other line passes through as it is written."""
    sys.stderr.flush()
    read_fd, write_fd = os.pipe()
    saved = os.dup(2)
    os.dup2(write_fd, 2)
    os.close(write_fd)

    def pump() -> None:
        with os.fdopen(read_fd, "rb") as lines:
            for line in lines:
                if not any(n.encode() in line for n in needles):
                    os.write(saved, line)

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # closes the pipe's last write end: the pump reads to its end and stops
        thread.join()
        os.close(saved)


class Progress:
    """Numbered steps with elapsed time: live on a TTY; elsewhere one line per step (`echo`, unless the
    ``wancompile`` logger logs INFO, whose record then says it)."""

    def __init__(
        self, total: int, stream: Optional[TextIO] = None, live: Optional[bool] = None, echo: bool = True
    ) -> None:
        self.total, self.index, self.echo = total, 0, echo
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self.times: dict[str, float] = {}

    @contextmanager
    def step(self, what: str) -> Iterator[None]:
        self.index += 1
        label = f"[{self.index}/{self.total}] {what}"
        t0 = time.perf_counter()
        stop = threading.Event()
        ticker = None
        if self.live:

            def tick() -> None:
                while not stop.wait(0.2):
                    self.stream.write(f"\r{label} … {time.perf_counter() - t0:.1f} s")
                    self.stream.flush()

            ticker = threading.Thread(target=tick, daemon=True)
            ticker.start()
        log.debug("%s: started", label)
        echo = not self.live and self.echo and not log.isEnabledFor(logging.INFO)  # -v: the log record says it
        if echo:
            self.stream.write(f"{label} … ")
            self.stream.flush()
        ok = False
        try:
            yield
            ok = True
        finally:
            stop.set()
            if ticker is not None:
                ticker.join()
            dt = time.perf_counter() - t0
            self.times[what] = dt
            if self.live:
                self.stream.write(f"\r{label} {'done' if ok else 'failed'} in {dt:.2f} s\n")
                self.stream.flush()
            elif echo:
                self.stream.write(f"{'done' if ok else 'failed'} in {dt:.2f} s\n")
                self.stream.flush()
            log.info("%s %s in %.2f s", label, "done" if ok else "failed", dt)
