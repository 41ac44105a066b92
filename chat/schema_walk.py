"""Where a JSON schema's sub-schemas lie: the keywords whose values are data, map names to
schemas, list schemas or are one schema; `schemas_in` gives the values that are (or hold)
schemas, `subschemas` each sub-schema with its place (`where.properties.city`,
`where.anyOf[1]`). Shared by the grammar's schema checks and `chat.unenforced`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

# keywords whose values are data, not schemas: a "$ref" key inside them is not a reference
DATA_KEYWORDS = ("const", "enum", "default", "examples", "example")
# keywords whose values map names (any, "default" included) to schemas, list schemas, or
# are one schema
NAMED_SCHEMAS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
LISTED_SCHEMAS = ("anyOf", "oneOf", "allOf", "prefixItems")
ONE_SCHEMA = ("items", "additionalProperties", "not", "contains")


def schemas_in(node: dict) -> list[Any]:
    """The values of a schema object that are (or hold) schemas: not its data keywords,
    and every schema of a name map whatever its names."""
    out: list[Any] = []
    for key, value in node.items():
        if key in NAMED_SCHEMAS and isinstance(value, dict):
            out += value.values()
        elif key not in DATA_KEYWORDS:
            out.append(value)
    return out


def subschemas(node: dict, where: str, ones: tuple[str, ...] = ONE_SCHEMA
               ) -> Iterator[tuple[Any, str]]:
    """Each sub-schema of `node` (a name map's, a list's, or `ones`' single ones) with its
    place below `where`; values of the wrong kind are passed over."""
    for key, value in node.items():
        if key in NAMED_SCHEMAS and isinstance(value, dict):
            for name, sub in value.items():
                yield sub, f"{where}.{key}.{name}"
        elif key in LISTED_SCHEMAS and isinstance(value, list):
            for i, sub in enumerate(value):
                yield sub, f"{where}.{key}[{i}]"
        elif key in ones and isinstance(value, (dict, bool)):
            yield value, f"{where}.{key}"
