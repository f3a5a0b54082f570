"""Frozen dataclass records <-> JSON, and the JSON Schema of that JSON, from the fields' type hints.

One definition of a format: the record. `to_json` / `from_json` / `json_schema` read its dataclass
fields and their type hints (``str``, ``int``, ``float``, ``bool``, ``Optional[X]``, ``tuple[X, ...]``,
``tuple[X, Y]``, ``Mapping[str, X]``, nested records, ``Any``), so a new field needs no JSON code.

A record's JSON object has one key per field, in field order (``json_order`` names keys written
first), plus the properties named in ``json_derived`` (written for readers, ignored when reading).
A field without a default is required when reading; one with a default reads as it when absent.
What a field needs beyond its type is said with ``typing.Annotated`` markers:

- `OMIT`: left out of the JSON when equal to its default (the format's optional fields);
- `HIDDEN`: never written nor read (in-memory only);
- `ADDED`: always written, but files written before the field existed lack it: not required by the schema;
- `Key("name")`: the JSON key when it differs from the field's name;
- `Schema(...)`: JSON-Schema keywords for the value (``enum``, ``minimum``, ``pattern``, ``const``, ``description``);
- `Codec(write, read, schema)`: a value with its own encoding (a location as text, a partition spec).

Reading converts scalars as the type says (``int(v)``, ``float(v)``, ``str(v)``): a value that does not
convert raises ``TypeError``/``ValueError``/``KeyError``, which the format's loader turns into its own
message. `Record` gives a dataclass ``to_json`` and ``from_json`` methods.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import types
import typing
from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated, Any, Callable, ClassVar, Mapping, Union

__all__ = ["ADDED", "HIDDEN", "OMIT", "Codec", "Key", "Record", "Schema", "from_json", "json_schema", "to_json"]


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


OMIT, HIDDEN, ADDED = _Marker("OMIT"), _Marker("HIDDEN"), _Marker("ADDED")


@dataclass(frozen=True)
class Key:
    name: str


class Schema(dict):
    """JSON-Schema keywords added to a value's generated schema."""

    def __init__(self, **keywords: Any) -> None:
        super().__init__(keywords)

    def __hash__(self) -> int:  # markers live in type hints, which are hashed
        return id(self)


@dataclass(frozen=True, eq=False)
class Codec:
    """A value with its own JSON encoding; ``name``: its schema is the shared ``#/$defs/<name>``."""

    write: Callable[[Any], Any]
    read: Callable[[Any], Any]
    schema: Union[Mapping[str, Any], Callable[[], dict]]  # a callable: computed when the schema is generated
    name: str = ""


@dataclass(frozen=True)
class _Field:
    name: str
    key: str
    hint: Any
    default: Any  # dataclasses.MISSING when required
    omit: bool
    added: bool


def _markers(hint: Any) -> tuple[Any, tuple]:
    if typing.get_origin(hint) is Annotated:
        return hint.__origin__, hint.__metadata__
    return hint, ()


@lru_cache(maxsize=None)
def _fields(cls: type) -> tuple[_Field, ...]:
    hints = typing.get_type_hints(cls, include_extras=True)
    out = []
    for f in dataclasses.fields(cls):
        _, marks = _markers(hints[f.name])
        if HIDDEN in marks:
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING
        key = next((m.name for m in marks if isinstance(m, Key)), f.name)
        out.append(_Field(f.name, key, hints[f.name], default, OMIT in marks, ADDED in marks))
    return tuple(out)


@lru_cache(maxsize=None)
def _derived(cls: type) -> tuple[tuple[str, Any], ...]:
    """(name, return type hint) of the properties the record writes for readers."""
    out = []
    for name in getattr(cls, "json_derived", ()):
        attr = getattr(cls, name)
        fget = attr.fget if isinstance(attr, property) else attr  # a property, or a method taking no arguments
        out.append(
            (name, typing.get_type_hints(fget, vars(sys.modules[fget.__module__]), include_extras=True)["return"])
        )
    return tuple(out)


def _ordered(cls: type, items: dict) -> dict:
    first = [k for k in getattr(cls, "json_order", ()) if k in items]
    return {k: items[k] for k in first} | {k: v for k, v in items.items() if k not in first}


def _is_record(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _args(tp: Any) -> tuple:
    return typing.get_args(tp)


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


# --- writing -------------------------------------------------------------------------------------------


def to_json(value: Any, hint: Any = None) -> Any:
    """`value` (a record, or anything its fields hold) as JSON data, as its type hint says."""
    tp, marks = _markers(hint) if hint is not None else (type(value), ())
    codec = next((m for m in marks if isinstance(m, Codec)), None)
    if codec is not None:
        return codec.write(value)
    if value is None:
        return None
    if _is_record(type(value)):
        cls = type(value)
        items = {}
        for f in _fields(cls):
            v = getattr(value, f.name)
            if not (f.omit and v == f.default):
                items[f.key] = to_json(v, f.hint)
        for name, h in _derived(cls):
            v = getattr(value, name)
            items[name] = to_json(v() if callable(v) else v, h)
        return _ordered(cls, items)
    if _is_union(tp):
        arms = [a for a in _args(tp) if a is not type(None)]
        return to_json(value, arms[0] if len(arms) == 1 else None)
    origin = typing.get_origin(tp)
    if origin in (tuple, list) or isinstance(value, (tuple, list)):
        args = _args(tp)
        each = args[0] if len(args) == 2 and args[1] is Ellipsis else None
        return [
            to_json(v, each if each is not None else (args[i] if i < len(args) else None)) for i, v in enumerate(value)
        ]
    if isinstance(value, Mapping):
        args = _args(tp)
        return {str(k): to_json(v, args[1] if len(args) == 2 else None) for k, v in value.items()}
    if tp is int:
        return int(value)
    if tp is float and not isinstance(value, (int, float)):
        return float(value)
    return value


# --- reading -------------------------------------------------------------------------------------------


def from_json(hint: Any, data: Any) -> Any:
    """JSON data read back as type `hint` (a record class, or a field's type hint)."""
    tp, marks = _markers(hint)
    codec = next((m for m in marks if isinstance(m, Codec)), None)
    if codec is not None:
        return codec.read(data)
    if _is_record(tp):
        if not isinstance(data, Mapping):
            raise TypeError(f"{tp.__name__} must be a JSON object, got {type(data).__name__}")
        kwargs = {}
        for f in _fields(tp):
            if f.key in data:
                kwargs[f.name] = from_json(f.hint, data[f.key])
            elif f.default is dataclasses.MISSING:
                raise KeyError(f.key)
        return tp(**kwargs)
    if _is_union(tp):
        arms = [a for a in _args(tp) if a is not type(None)]
        if data is None and len(arms) < len(_args(tp)):
            return None
        return from_json(arms[0], data) if len(arms) == 1 else _plain(data)
    origin, args = typing.get_origin(tp), _args(tp)
    if origin is tuple:
        if not isinstance(data, list):
            raise TypeError(f"expected a list, got {type(data).__name__}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(from_json(args[0], v) for v in data)
        if len(data) != len(args):
            raise ValueError(f"expected {len(args)} items, got {len(data)}")
        return tuple(from_json(a, v) for a, v in zip(args, data))
    if origin in (dict, Mapping, typing.get_origin(Mapping[str, int])):
        if not isinstance(data, Mapping):
            raise TypeError(f"expected an object, got {type(data).__name__}")
        return {str(k): from_json(args[1], v) for k, v in data.items()}
    if tp in (int, float, str, bool):
        if tp in (int, float) and isinstance(data, str):
            raise TypeError(f"expected a number, got {data!r}")
        return tp(data)
    return _plain(data)


def _plain(data: Any) -> Any:
    return tuple(_plain(v) for v in data) if isinstance(data, list) else data


class Record:
    """Mixin: ``to_json`` / ``from_json`` for a frozen dataclass, by `to_json` / `from_json` above."""

    json_order: ClassVar[tuple[str, ...]] = ()
    json_derived: ClassVar[tuple[str, ...]] = ()

    def to_json(self) -> dict:
        return to_json(self)

    @classmethod
    def from_json(cls, data: Mapping) -> Any:
        return from_json(cls, data)


# --- JSON Schema -----------------------------------------------------------------------------------------


def _doc(cls: type) -> str:
    """The first paragraph of a record's docstring, on one line."""
    text = (cls.__doc__ or "").strip().split("\n\n")[0]
    return re.sub(r"\s+", " ", text)


def json_schema(hint: Any, defs: dict[str, Any]) -> dict:
    """The JSON Schema (draft 2020-12) of what `to_json` writes for type `hint`; nested records
    become ``#/$defs/<Name>`` entries of `defs`."""
    tp, marks = _markers(hint)
    extra = {k: v for m in marks if isinstance(m, Schema) for k, v in m.items()}
    codec = next((m for m in marks if isinstance(m, Codec)), None)
    if codec is not None:
        schema = codec.schema() if callable(codec.schema) else dict(codec.schema)
        if not codec.name:
            return {**schema, **extra}
        defs[codec.name] = schema
        return {"$ref": f"#/$defs/{codec.name}", **extra}
    if _is_record(tp):
        if tp.__name__ not in defs:
            defs[tp.__name__] = {}  # placeholder: a record nested in itself
            props, required = {}, []
            for f in _fields(tp):
                props[f.key] = json_schema(f.hint, defs)
                if not f.omit and not f.added:
                    required.append(f.key)
            for name, h in _derived(tp):
                props[name] = json_schema(h, defs)
                if ADDED not in _markers(h)[1]:
                    required.append(name)
            props = _ordered(tp, props)
            out: dict[str, Any] = {"type": "object"}
            if _doc(tp):
                out["description"] = _doc(tp)
            required = [k for k in props if k in required]
            defs[tp.__name__] = {**out, "required": required, "additionalProperties": False, "properties": props}
        return {"$ref": f"#/$defs/{tp.__name__}", **extra}
    if _is_union(tp):
        arms = [json_schema(a, defs) for a in _args(tp)]
        return {"anyOf": arms, **extra}
    if tp is type(None):
        return {"type": "null"}
    origin, args = typing.get_origin(tp), _args(tp)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": json_schema(args[0], defs), **extra}
        return {
            "type": "array",
            "prefixItems": [json_schema(a, defs) for a in args],
            "minItems": len(args),
            "maxItems": len(args),
            **extra,
        }
    if origin in (dict, Mapping, typing.get_origin(Mapping[str, int])):
        return {"type": "object", "additionalProperties": json_schema(args[1], defs), **extra}
    scalar = {str: "string", int: "integer", float: "number", bool: "boolean"}.get(tp)
    return {"type": scalar, **extra} if scalar else dict(extra)
