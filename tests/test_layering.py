"""DESIGN.md §3: planner/ plans without torch_xla or wancompile; rewrites/ never imports the planner."""

import subprocess
import sys

from conftest import ROOT

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
