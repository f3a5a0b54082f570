"""DESIGN.md §3: planner/ plans without torch_xla or wancompile; rewrites/ never imports the planner; no
module of planner/, rewrites/ or wancompile/ depends, through any chain of imports, on itself; and none is
over 400 lines without saying why (a paragraph of its docstring that begins "Why ").

An import circle is read off the source (`ast`, nothing is imported): module A depends on module B when A
names B in an ``import`` or ``from ... import`` statement *anywhere* in its file — at the top, inside a
function (a lazy import) or under ``if TYPE_CHECKING:`` (a type-only one). A lazy import postpones the
circle to the first call, and a type-only one to the reader; neither removes it from the design, so both
count, and the failure message says which kind closes each circle. ``from pkg import name`` depends on the
module ``pkg.name`` when there is one, else on the package's ``__init__``; the package ``__init__`` a
submodule import runs first is not counted (every module would otherwise sit in a circle with the
``__init__`` that re-exports it). Imports by string (``importlib.import_module``) are not seen.
"""

import ast
import subprocess
import sys
from collections import deque

from conftest import ROOT

PACKAGES = ("planner", "rewrites", "wancompile")

PROBE = """
import importlib, pkgutil, sys
import {package}
for m in pkgutil.walk_packages({package}.__path__, "{package}."):
    importlib.import_module(m.name)
bad = sorted(n for n in sys.modules if n.split(".")[0] in {forbidden!r})
print(bad)
"""


def imported_by(package, forbidden):
    code = PROBE.format(package=package, forbidden=set(forbidden))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return out.strip().splitlines()[-1]


def test_planner_needs_neither_torch_xla_nor_wancompile():
    assert imported_by("planner", ["torch_xla", "wancompile"]) == "[]"


def test_rewrites_do_not_import_the_planner_or_torch_xla():
    assert imported_by("rewrites", ["planner", "torch_xla", "wancompile"]) == "[]"


# --- import circles -------------------------------------------------------------------------------------


def package_modules():
    """Dotted module name -> file, for every module of `PACKAGES` (a package is its ``__init__``)."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _kind(stack):
    """How an import statement runs, from the statements enclosing it."""
    for node in stack:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return "type-only"
    if any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) for node in stack):
        return "lazy"
    return "top-level"


def _imports(tree):
    """(import statement, how it runs) for every import in `tree`."""
    todo = [(tree, ())]
    while todo:
        node, stack = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, _kind(stack)
        for child in ast.iter_child_nodes(node):
            todo.append((child, stack + (node,)))


def import_graph():
    """module -> {imported module -> ["file:line (kind)", ...]} among the package modules."""
    modules = package_modules()

    def known(name):  # the innermost package module `name` lies in, or None
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {m: {} for m in modules}
    for module, path in modules.items():
        here = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        for node, kind in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in {known(n) for n in names} - {None, module}:
                where = f"{path.relative_to(ROOT)}:{node.lineno} ({kind})"
                graph[module].setdefault(target, []).append(where)
    for imports in graph.values():
        for wheres in imports.values():
            wheres.sort(key=lambda where: int(where.split(":")[1].split()[0]))
    return graph


def circles(graph):
    """The groups of modules that reach each other (strongly connected, more than one module), each as
    a sorted tuple, in a sorted list."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
                on_stack.discard(group[-1])
            if len(group) > 1:
                found.append(tuple(sorted(group)))

    for v in graph:
        if v not in index:
            visit(v)
    return sorted(found)


def describe(graph, group):
    """One circle through `group` (the shortest from its first module), each step with the import
    statements that make it."""
    start, members = group[0], set(group)
    came_from, todo = {}, deque([start])
    while todo:
        v = todo.popleft()
        for w in sorted(graph[v]):
            if w in members and w not in came_from:
                came_from[w] = v
                todo.append(w)
    path, v = [start], came_from[start]
    while v != start:
        path.append(v)
        v = came_from[v]
    path.append(start)
    path.reverse()
    steps = [f"    {a} -> {b}: {', '.join(graph[a][b])}" for a, b in zip(path, path[1:])]
    return "\n".join([" -> ".join(path), *steps])


def report(graph, groups):
    return "import circles:\n" + "\n".join(describe(graph, g) for g in groups)


def test_the_circle_finder_reports_lazy_and_type_only_imports_that_close_a_circle():
    graph = {"a": {"b": ["a.py:1 (top-level)"]}, "b": {"c": ["b.py:2 (lazy)"]}, "c": {"a": ["c.py:3 (type-only)"]}}
    assert circles(graph) == [("a", "b", "c")]
    assert report(graph, circles(graph)).splitlines() == [
        "import circles:",
        "a -> b -> c -> a",
        "    a -> b: a.py:1 (top-level)",
        "    b -> c: b.py:2 (lazy)",
        "    c -> a: c.py:3 (type-only)",
    ]
    assert circles({"a": {"b": []}, "b": {}}) == []


def test_no_import_circles_among_the_package_modules():
    graph = import_graph()
    assert not circles(graph), report(graph, circles(graph))


# --- module size ----------------------------------------------------------------------------------------

LIMIT = 400  # lines


def test_no_module_over_400_lines_without_its_reason():
    unexplained = set()
    for path in package_modules().values():
        text = path.read_text()
        docstring = ast.get_docstring(ast.parse(text)) or ""
        why = any(paragraph.startswith("Why ") for paragraph in docstring.split("\n\n"))
        if len(text.splitlines()) > LIMIT and not why:
            unexplained.add(str(path.relative_to(ROOT)))
    assert not unexplained, f"over {LIMIT} lines with no 'Why ...' paragraph in the docstring"
