"""docs/ cannot go stale by hand: a measured table lives in a page a bench writes (`bench/_docs.py`: the page
opens with the command and the commit it ran on), and the prose pages link to it instead of copying it."""

import re

from conftest import ROOT

DOCS = ROOT / "docs"
HEADER = re.compile(r"Written by `PYTHONPATH=\. python bench/(\w+\.py)[^`]*--write` on ([0-9a-f]{7,40})\b")


def bench_written():
    """docs page -> (the bench that wrote it, the commit), for every page whose header `_docs.write_doc` wrote."""
    pages = {}
    for page in sorted(DOCS.glob("*.md")):
        lines = page.read_text().splitlines()
        match = HEADER.match(lines[2]) if len(lines) > 2 else None
        if match:
            pages[page.name] = match.groups()
    return pages


def test_every_bench_written_page_names_the_bench_that_writes_it_and_its_commit():
    pages = bench_written()
    assert {"tt-check.md", "bench-tt.md", "tt-full-width.md", "vae-budget.md", "bench-ring.md"} <= set(pages)
    for page, (bench, _) in pages.items():
        script = ROOT / "bench" / bench
        assert script.is_file(), f"{page}: written by bench/{bench}, which is gone"
        assert f'"{page}"' in script.read_text(), f"{page}: bench/{bench} does not write it"


def test_every_link_between_docs_pages_resolves():
    broken = []
    for page in sorted(DOCS.glob("*.md")):
        for target in re.findall(r"\]\(([\w.-]+\.md)(?:#[\w-]*)?\)", page.read_text()):
            if not (DOCS / target).is_file():
                broken.append(f"{page.name} -> {target}")
    assert not broken, broken
