"""A validator for the subset of JSON Schema (draft 2020-12) that docs/schema/*.json use.

Keywords: ``type`` (a name or a list), ``enum``, ``const``, ``properties``, ``required``,
``additionalProperties`` (a boolean or a schema), ``items``, ``minItems``, ``minimum``, ``pattern``,
``anyOf``, ``$ref`` to ``#/$defs/NAME`` and ``$defs``; ``$schema``, ``$id``, ``title``,
``description`` and ``$comment`` are annotations. Any other keyword is an error, so a schema
cannot lean on a constraint this validator would silently skip. When the ``jsonschema``
package is installed the tests validate with it as well.
"""

from __future__ import annotations

import re

ANNOTATIONS = {"$schema", "$id", "title", "description", "$comment", "$defs"}
KEYWORDS = {"type", "enum", "const", "properties", "required", "additionalProperties", "items", "minItems",
            "minimum", "pattern", "anyOf", "$ref"}

_TYPES = {
    "null": lambda x: x is None,
    "boolean": lambda x: isinstance(x, bool),
    "integer": lambda x: isinstance(x, int) and not isinstance(x, bool),
    "number": lambda x: isinstance(x, (int, float)) and not isinstance(x, bool),
    "string": lambda x: isinstance(x, str),
    "array": lambda x: isinstance(x, list),
    "object": lambda x: isinstance(x, dict),
}


class SchemaError(Exception):
    """The schema uses a keyword outside the subset."""


def errors(instance, schema: dict, root: dict | None = None, path: str = "$") -> list[str]:
    """Every violation of ``schema`` by ``instance``, as ``path: message`` (empty when valid)."""
    root = schema if root is None else root
    unknown = set(schema) - KEYWORDS - ANNOTATIONS
    if unknown:
        raise SchemaError(f"{path}: keywords outside the supported subset: {sorted(unknown)}")
    out: list[str] = []
    if "$ref" in schema:
        ref = schema["$ref"]
        if not ref.startswith("#/$defs/"):
            raise SchemaError(f"{path}: only local references #/$defs/NAME are supported, not {ref}")
        out += errors(instance, root["$defs"][ref[len("#/$defs/"):]], root, path)
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_TYPES[t](instance) for t in types):
            return out + [f"{path}: expected {' or '.join(types)}, got {type(instance).__name__} {instance!r:.60}"]
    if "enum" in schema and instance not in schema["enum"]:
        out.append(f"{path}: {instance!r:.60} not one of {schema['enum']}")
    if "const" in schema and instance != schema["const"]:
        out.append(f"{path}: expected {schema['const']!r}, got {instance!r:.60}")
    if "minimum" in schema and _TYPES["number"](instance) and instance < schema["minimum"]:
        out.append(f"{path}: {instance} is below {schema['minimum']}")
    if "pattern" in schema and isinstance(instance, str) and not re.search(schema["pattern"], instance):
        out.append(f"{path}: {instance!r:.60} does not match {schema['pattern']}")
    if "anyOf" in schema:
        results = [errors(instance, s, root, path) for s in schema["anyOf"]]
        if all(results):
            out.append(f"{path}: matches none of anyOf: " + "; ".join(r[0] for r in results))
    if isinstance(instance, dict):
        out += _object_errors(instance, schema, root, path)
    if isinstance(instance, list):
        out += _array_errors(instance, schema, root, path)
    return out


def _object_errors(instance: dict, schema: dict, root: dict, path: str) -> list[str]:
    """The violations of an object's keywords: its required keys, then each key's value in order."""
    out: list[str] = []
    props = schema.get("properties", {})
    for key in schema.get("required", ()):
        if key not in instance:
            out.append(f"{path}: missing required key {key!r}")
    extra = schema.get("additionalProperties", True)
    for key, value in instance.items():
        if key in props:
            out += errors(value, props[key], root, f"{path}.{key}")
        elif extra is False:
            out.append(f"{path}: unexpected key {key!r}")
        elif isinstance(extra, dict):
            out += errors(value, extra, root, f"{path}.{key}")
    return out


def _array_errors(instance: list, schema: dict, root: dict, path: str) -> list[str]:
    """The violations of an array's keywords: its length, then each item in order."""
    out: list[str] = []
    if "minItems" in schema and len(instance) < schema["minItems"]:
        out.append(f"{path}: fewer than {schema['minItems']} items")
    if "items" in schema:
        for i, value in enumerate(instance):
            out += errors(value, schema["items"], root, f"{path}[{i}]")
    return out


def check_schema(schema: dict, root: dict | None = None, path: str = "$") -> None:
    """Raise ``SchemaError`` when the schema (recursively) uses a keyword outside the subset or
    refers to a definition it lacks."""
    root = schema if root is None else root
    unknown = set(schema) - KEYWORDS - ANNOTATIONS
    if unknown:
        raise SchemaError(f"{path}: keywords outside the supported subset: {sorted(unknown)}")
    if "$ref" in schema and schema["$ref"][len("#/$defs/"):] not in root.get("$defs", {}):
        raise SchemaError(f"{path}: undefined reference {schema['$ref']}")
    for key in ("properties", "$defs"):
        for name, sub in schema.get(key, {}).items():
            check_schema(sub, root, f"{path}.{key}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            check_schema(schema[key], root, f"{path}.{key}")
    for i, sub in enumerate(schema.get("anyOf", ())):
        check_schema(sub, root, f"{path}.anyOf[{i}]")
