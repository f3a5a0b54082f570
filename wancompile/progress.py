"""Progress of long steps (capture, solve, report) and the ``wancompile`` logger's console setup.

On a terminal a step shows a live line (``[2/4] solving … 1.3 s``) that a thread refreshes and the
step's end replaces with its time; elsewhere (CI, pipes, files) each step is one log record at INFO
when it ends, so logs stay clean. Everything goes to stderr; stdout keeps the command's result.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from contextlib import contextmanager
from typing import Iterator, Optional, TextIO

log = logging.getLogger("wancompile")


def setup_logging(verbose: int = 0, stream: Optional[TextIO] = None) -> None:
    """Console handler for the ``wancompile`` logger: WARNING by default, INFO with -v, DEBUG with -vv."""
    level = logging.WARNING if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(level)
    log.propagate = False


class Progress:
    """Numbered steps with elapsed time; live on a TTY."""

    def __init__(self, total: int, stream: Optional[TextIO] = None, live: Optional[bool] = None) -> None:
        self.total, self.index = total, 0
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
            log.info("%s %s in %.2f s", label, "done" if ok else "failed", dt)
