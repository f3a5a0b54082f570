"""Measured tables into docs/: one writer, so every table names the command and the commit it came from."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]


def commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    return out.strip() or "an unknown commit"


def write_doc(name: str, title: str, command: str, context: str, body: list[str]) -> Path:
    """docs/`name`: `title`, the command and commit that measured it, `context`, then the table `body`."""
    path = ROOT / "docs" / name
    path.write_text(f"# {title}\n\nWritten by `{command}` on {commit()}. {context}\n\n" + "\n".join(body) + "\n")
    return path


class _Tee(io.TextIOBase):
    def __init__(self, out) -> None:
        self.out, self.buf = out, io.StringIO()

    def write(self, s: str) -> int:
        self.out.write(s)
        self.buf.write(s)
        return len(s)

    def flush(self) -> None:
        self.out.flush()


def write_readme_block(block: str, text: str) -> Path:
    """README.md with the lines between ``<!-- begin BLOCK -->`` and ``<!-- end BLOCK -->`` replaced by `text`."""
    path = ROOT / "README.md"
    readme = path.read_text()
    begin, end = f"<!-- begin {block} -->", f"<!-- end {block} -->"
    if begin not in readme or end not in readme:
        raise SystemExit(f"README.md has no {begin} ... {end} block to write")
    head, rest = readme.split(begin, 1)
    path.write_text(head + begin + "\n" + text.rstrip() + "\n" + end + rest.split(end, 1)[1])
    return path


def main_writing(
    main: Callable[[], object], name: str, title: str, context: str = "", readme_block: str | None = None
) -> None:
    """Run a bench's `main`; with ``--write`` among the arguments, also write what it printed (its
    markdown tables) to docs/`name`, headed by the command and the commit, and, with `readme_block`,
    into README.md's block of that name (`write_readme_block`)."""
    write = "--write" in sys.argv[1:]
    if write:
        sys.argv.remove("--write")
    tee = _Tee(sys.stdout)
    with contextlib.redirect_stdout(tee) if write else contextlib.nullcontext():
        main()
    if write:
        args = " ".join(["PYTHONPATH=. python", f"bench/{Path(sys.argv[0]).name}", *sys.argv[1:], "--write"])
        write_doc(
            name, title, args, context or "Columns and method: the script's docstring.", [tee.buf.getvalue().rstrip()]
        )
        if readme_block:
            write_readme_block(readme_block, f"Written by `{args}` on {commit()}:\n\n{tee.buf.getvalue()}")
