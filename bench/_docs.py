"""Measured tables into docs/: one writer, so every table names the command and the commit it came from."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    return out.strip() or "an unknown commit"


def write_doc(name: str, title: str, command: str, context: str, body: list[str]) -> Path:
    """docs/`name`: `title`, the command and commit that measured it, `context`, then the table `body`."""
    path = ROOT / "docs" / name
    path.write_text(f"# {title}\n\nWritten by `{command}` on {commit()}. {context}\n\n" + "\n".join(body) + "\n")
    return path
