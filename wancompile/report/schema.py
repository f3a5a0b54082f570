"""plan.json's published JSON Schema (``wancompile/schema/plan.schema.json``) and a validator.

`validate` needs no third-party package: it implements the subset of JSON Schema the file uses
(``type``, ``const``, ``enum``, ``properties``, ``required``, ``additionalProperties``, ``items``,
``minItems``, ``minimum``, ``pattern``, ``anyOf``, local ``$ref``). tests/test_report_schema.py
checks that it agrees with the ``jsonschema`` package on valid and broken plans.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

SCHEMA_PATH = Path(__file__).resolve().parents[1] / "schema" / "plan.schema.json"


class SchemaError(ValueError):
    """plan.json does not match the schema; the message gives the JSON path of the first problem."""


@lru_cache(maxsize=1)
def plan_schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text())


_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def errors(value: Any, schema: dict | None = None) -> list[str]:
    """Every mismatch as ``$.path: message`` (empty when `value` is valid)."""
    root = schema or plan_schema()
    out: list[str] = []
    _check(value, root, root, "$", out)
    return out


def validate(value: Any, schema: dict | None = None) -> None:
    errs = errors(value, schema)
    if errs:
        more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
        raise SchemaError(f"plan.json does not match plan.schema.json: {errs[0]}{more}")


def _check(v: Any, s: dict, root: dict, path: str, out: list[str]) -> None:
    if "$ref" in s:
        ref = s["$ref"]
        if not ref.startswith("#/"):
            raise ValueError(f"only local $ref is supported, not {ref!r}")
        target: Any = root
        for part in ref[2:].split("/"):
            target = target[part]
        _check(v, target, root, path, out)
    if "const" in s and v != s["const"]:
        out.append(f"{path}: expected {s['const']!r}, got {v!r}")
    if "enum" in s and v not in s["enum"]:
        out.append(f"{path}: {v!r} is not one of {s['enum']}")
    if "type" in s:
        types = s["type"] if isinstance(s["type"], list) else [s["type"]]
        if not any(_TYPES[t](v) for t in types):
            out.append(f"{path}: expected {' or '.join(types)}, got {type(v).__name__}")
            return
    if "anyOf" in s:
        if not any(not errors(v, {**alt, "$defs": root.get("$defs", {})}) for alt in s["anyOf"]):
            out.append(f"{path}: {v!r} matches none of the allowed forms")
    if "minimum" in s and _TYPES["number"](v) and v < s["minimum"]:
        out.append(f"{path}: {v} is below the minimum {s['minimum']}")
    if "pattern" in s and isinstance(v, str) and not re.search(s["pattern"], v):
        out.append(f"{path}: {v!r} does not match {s['pattern']!r}")
    if isinstance(v, dict):
        props = s.get("properties", {})
        for key in s.get("required", []):
            if key not in v:
                out.append(f"{path}: missing required field {key!r}")
        for key, item in v.items():
            if key in props:
                _check(item, props[key], root, f"{path}.{key}", out)
            elif s.get("additionalProperties") is False:
                out.append(f"{path}: unexpected field {key!r}")
            elif isinstance(s.get("additionalProperties"), dict):
                _check(item, s["additionalProperties"], root, f"{path}[{key!r}]", out)
    if isinstance(v, list):
        if "minItems" in s and len(v) < s["minItems"]:
            out.append(f"{path}: needs at least {s['minItems']} item(s)")
        if "items" in s:
            for i, item in enumerate(v):
                _check(item, s["items"], root, f"{path}[{i}]", out)
