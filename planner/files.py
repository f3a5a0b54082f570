"""Every file the project writes goes through here: one file atomically, or a set of files committed
so that a reader never sees a mixed or half-written set.

- `write_text(path, text)`: the text goes to a temporary file in the same directory (same file
  system), is flushed and fsynced, then renamed over `path` (``os.replace``, atomic on POSIX). A
  process killed at any moment leaves `path` either as it was or with the whole new text, never
  truncated; at worst a stray ``.<name>.<pid>.wancompile-tmp`` file, removed by the next write
  into that directory.
- `write_set(directory, files, commit=...)`: several files that belong together (plan.json,
  plan.md, plan.html, graph.json, summary.txt). All temporaries are written first; then the old
  commit file (``plan.json``) is removed, the other files are renamed into place, and the new
  commit file is renamed in last. **Guarantee: whenever the commit file exists, every file of the
  set beside it comes from the same write.** A process killed mid-commit leaves no commit file (the
  directory then holds no plan: `load_plan` and the ``wancompile`` verbs say so) — the previous
  complete set or none, never a plan.json next to another run's plan.md.

Lives in `planner` because it is the bottom layer (planner's `save_plan` uses it and planner
imports nothing of wancompile's).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Union

TMP_SUFFIX = ".wancompile-tmp"
Text = Union[str, bytes]


def _tmp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}{TMP_SUFFIX}")


def _write_tmp(path: Path, data: Text) -> Path:
    tmp = _tmp_path(path)
    with open(tmp, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    return tmp


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def clean_stale(directory: Path) -> None:
    """Remove temporaries a killed writer left behind (any pid's)."""
    try:
        for p in directory.glob(f".*{TMP_SUFFIX}"):
            try:
                p.unlink()
            except OSError:
                pass
    except OSError:
        pass


def write_text(path: Union[str, Path], data: Text) -> Path:
    """Write `data` to `path` atomically (see the module docstring); creates the parent directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    clean_stale(path.parent)
    tmp = _write_tmp(path, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return path


def write_set(directory: Union[str, Path], files: Mapping[str, Text], *, commit: str = "plan.json") -> dict[str, Path]:
    """Write `files` (name -> text) into `directory` as one set, `commit` renamed in last."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    clean_stale(directory)
    if commit not in files:
        raise ValueError(f"write_set: the commit file {commit!r} is not among {sorted(files)}")
    tmps: dict[str, Path] = {}
    try:
        for name, data in files.items():
            tmps[name] = _write_tmp(directory / name, data)
        (directory / commit).unlink(missing_ok=True)  # from here until the last rename: no plan
        _fsync_dir(directory)
        for name in [n for n in files if n != commit] + [commit]:
            os.replace(tmps[name], directory / name)
            del tmps[name]
    finally:
        for tmp in tmps.values():
            tmp.unlink(missing_ok=True)
    _fsync_dir(directory)
    return {name: directory / name for name in files}
