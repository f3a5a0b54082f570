"""plan.json's published JSON Schema, generated from the plan's records, and validation against it.

``wancompile/schema/plan.schema.json`` is generated: the plan part from `planner.plan.Plan` and the
records it holds (`planner.records.json_schema`), the optional ``report`` section (the per-op trace
of one block, `wancompile.report.trace`) from `TRACE_SCHEMA` below. Regenerate it after changing a
record with ``python -m wancompile.report.schema --write``; tests/test_report.py checks that the
committed file is what this generates. `validate` / `errors` check a plan.json with the
``jsonschema`` package (draft 2020-12) and say where each problem is as a JSON path.
"""

from __future__ import annotations

import json
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

from planner.errors import Error

SCHEMA_PATH = Path(__file__).resolve().parents[1] / "schema" / "plan.schema.json"
_DESCRIPTION = (
    "A sharding plan for a Wan 2.2 model on an XLA mesh (DESIGN.md section 2), generated from planner/plan.py's "
    "records. Plans of an older schema_version are refused with a message to re-plan. Written by `wancompile plan` "
    "and by the wan_autoshard backend's dump_dir; read by the backend's `plan` option and the `wancompile "
    "explain|diff|export` verbs. The optional `report` section is the per-op trace of one block "
    "(wancompile/report/trace.py)."
)


def _object(properties: dict, required: list | None = None, closed: bool = True) -> dict:
    """A JSON object's schema: these properties, all of them required unless `required` says which."""
    out = {"type": "object", "required": list(properties) if required is None else required}
    return out | ({"additionalProperties": False} if closed else {}) | {"properties": properties}


# The trace section's format (written by wancompile/report/trace.py, not a typed record).
TRACE_SCHEMA = {
    "report": _object(
        {
            "version": {"const": 2},
            "hardware": {"type": "string"},
            "blocks": {"type": "integer", "minimum": 0},
            "captured_blocks": {"type": "integer", "minimum": 0},
            "tokens": {"type": "string"},
            "block_module": {"type": "string"},
            "families": {
                "description": "further block stacks beside the main one (VACE's control blocks); their ops are segment 'family', one block each",
                "type": "array",
                "items": _object(
                    {
                        "prefix": {"type": "string"},
                        "blocks": {"type": "integer", "minimum": 0},
                        "block_module": {"type": "string"},
                    }
                ),
            },
            "params": {
                "type": "object",
                "additionalProperties": _object(
                    {
                        "shape": {"type": "array", "items": {"$ref": "#/$defs/dim"}},
                        "dtype": {"type": "string"},
                        "block": {"type": ["integer", "null"]},
                    },
                    required=["shape", "dtype"],
                    closed=False,
                ),
            },
            "ops": {
                "type": "array",
                "items": _object(
                    {
                        "loc": {"type": "string"},
                        "segment": {"enum": ["prologue", "block", "family", "epilogue"]},
                        "family": {
                            "type": ["string", "null"],
                            "description": "a block op's family (stack prefix): blocks, vace_blocks",
                        },
                        "group": {"type": "string"},
                        "module": {"type": "string"},
                        "op": {"type": "string"},
                        "kernel": {"type": "boolean"},
                        "weights": {
                            "type": "array",
                            "items": _object({"param": {"type": "string"}, "spec": {"$ref": "#/$defs/spec"}}),
                        },
                        "in": {"type": "array", "items": {"$ref": "#/$defs/state"}},
                        "out": {"anyOf": [{"$ref": "#/$defs/state"}, {"type": "null"}]},
                        "constraint": {"anyOf": [{"$ref": "#/$defs/spec"}, {"type": "null"}]},
                        "module_output": {"type": "boolean"},
                        "collectives": {"type": "array", "items": {"$ref": "#/$defs/Collective"}},
                        "compute_s": {"type": "number", "minimum": 0},
                        "flops": {"type": "number", "minimum": 0},
                    },
                    required=[
                        "loc",
                        "segment",
                        "group",
                        "op",
                        "kernel",
                        "weights",
                        "in",
                        "out",
                        "constraint",
                        "collectives",
                        "compute_s",
                    ],
                ),
            },
        },
        required=["version", "hardware", "blocks", "ops"],
        closed=False,
    ),
    "state": {
        "description": "a tensor's state: global shape, per-dim partition spec, axes of unreduced partial sums",
        "type": "object",
        "required": ["shape", "spec", "partial"],
        "additionalProperties": False,
        "properties": {
            "shape": {"type": "array", "items": {"$ref": "#/$defs/dim"}},
            "spec": {"$ref": "#/$defs/spec"},
            "partial": {"type": "array", "items": {"type": "string"}},
        },
    },
}


class SchemaError(Error, ValueError):
    """plan.json does not match the schema; the message gives the JSON path of the first problem."""


def generate() -> dict:
    """The schema as planner/plan.py's records and `TRACE_SCHEMA` define it."""
    from planner.plan import Plan
    from planner.records import json_schema

    defs: dict[str, Any] = {}
    json_schema(Plan, defs)
    plan = defs.pop("Plan")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://github.com/wancompile/wancompile/blob/main/wancompile/schema/plan.schema.json",
        "title": "wancompile plan.json",
        "description": _DESCRIPTION,
        **{k: v for k, v in plan.items() if k != "description"},
        "properties": {**plan["properties"], "report": {"$ref": "#/$defs/report"}},
        "$defs": {**defs, **TRACE_SCHEMA},
    }


def render() -> str:
    return json.dumps(generate(), indent=1) + "\n"


@lru_cache(maxsize=1)
def plan_schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text())


def _path(parts) -> str:
    out = "$"
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}" if p.isidentifier() else f"[{p!r}]"
    return out


def _message(e) -> str:
    """One line for a jsonschema error, naming the field or value at fault."""
    value, inst = e.validator_value, e.instance
    props = e.schema.get("properties", {})
    say = {
        "required": lambda: _fields("missing required", [k for k in value if k not in inst]),
        "additionalProperties": lambda: _fields("unexpected", [k for k in inst if k not in props]),
        "const": lambda: f"expected {value!r}, got {inst!r}",
        "enum": lambda: f"{inst!r} is not one of {list(value)}",
        "anyOf": lambda: f"{inst!r} matches none of the allowed forms",
        "pattern": lambda: f"{inst!r} does not match {value!r}",
    }
    return say[e.validator]() if e.validator in say else e.message


def _fields(what: str, names: list) -> str:
    return f"{what} field{'s' if len(names) > 1 else ''} " + ", ".join(map(repr, names))


def _inline_refs(schema: dict) -> dict:
    """`schema` with its ``#/$defs/...`` references replaced by the definitions (a reference with
    siblings becomes ``allOf``): the same checks, without a lookup per reference (validating the A14B
    plan.json takes a third less). A recursive definition keeps the schema as it is."""
    defs = schema.get("$defs", {})

    def inline(x, seen: tuple):
        if isinstance(x, list):
            return [inline(v, seen) for v in x]
        if not isinstance(x, dict):
            return x
        ref = x.get("$ref", "")
        if ref.startswith("#/$defs/"):
            name = ref[len("#/$defs/") :]
            if name in seen:
                raise RecursionError(name)
            target = inline(defs[name], (*seen, name))
            rest = {k: v for k, v in x.items() if k != "$ref"}
            return {"allOf": [target, inline(rest, seen)]} if rest else target
        return {k: inline(v, seen) for k, v in x.items() if k != "$defs"}

    try:
        return inline(schema, ())
    except RecursionError:
        return schema


@lru_cache(maxsize=1)
def _plan_validator():
    import jsonschema

    return jsonschema.Draft202012Validator(_inline_refs(plan_schema()))


def errors(value: Any, schema: dict | None = None) -> list[str]:
    """Every mismatch as ``$.path: message`` (empty when `value` is valid), each once: an object that
    lacks required fields is one line naming them all (jsonschema reports each missing field apart)."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema) if schema is not None else _plan_validator()
    return list(dict.fromkeys(f"{_path(e.absolute_path)}: {_message(e)}" for e in validator.iter_errors(value)))


def validate(value: Any, schema: dict | None = None) -> None:
    errs = errors(value, schema)
    if errs:
        more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
        raise SchemaError(f"plan.json does not match plan.schema.json: {errs[0]}{more}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m wancompile.report.schema --write   (regenerates " + str(SCHEMA_PATH) + ")")
    SCHEMA_PATH.write_text(render())
    print(f"wrote {SCHEMA_PATH}")
