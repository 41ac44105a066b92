"""unenforced: the first JSON-schema keyword in a schema that the grammar compiler takes
but does not apply (xgrammar 0.2.9 compiles it and leaves it out: a document breaking it
still matches), with where it is.

A strict schema (`response_format.json_schema.strict`, a tool's `strict: true`) asks for
documents that follow it exactly: one of these is then a 400 naming the keyword, as
OpenAI's structured outputs refuse the keywords they do not support. A non-strict schema
is applied as far as the grammar goes. Checked against the compiler in
tests/chat/test_unenforced.py: each keyword listed here is left out, each one not listed
that a schema commonly carries is applied.
"""

from __future__ import annotations

from typing import Any

from chat.schema_walk import ONE_SCHEMA, subschemas

# keywords the compiler leaves out whenever they are there
_IGNORED = ("not", "if", "then", "else", "dependentRequired", "dependentSchemas", "contains")
# the single sub-schemas walked into (those of _IGNORED are said before)
_ONE = ONE_SCHEMA + ("propertyNames", "unevaluatedProperties")
_LOOKAROUND = ("(?=", "(?!")  # (a look-behind does not compile at all)
# beside one of these, the compiler reads that keyword alone: any other rule is dropped
_ALONE = ("$ref", "allOf", "anyOf", "oneOf")
# keywords that say nothing of a document (kept beside the ones above)
_ANNOTATIONS = frozenset({"description", "title", "default", "examples", "example", "$comment",
                          "deprecated", "readOnly", "writeOnly", "$id", "$schema", "$anchor",
                          "discriminator", "nullable", "$defs", "definitions"})


def unenforced(node: Any, where: str = "schema") -> str | None:
    """The first keyword of `node` the compiler does not apply, said with its place
    (`schema.properties.tags.uniqueItems`), or None."""
    if isinstance(node, list):
        for i, sub in enumerate(node):
            found = unenforced(sub, f"{where}[{i}]")
            if found:
                return found
        return None
    if not isinstance(node, dict):
        return None
    for key in _IGNORED:
        if key in node:
            return f"`{key}` at {where}"
    if node.get("uniqueItems") is True:
        return f"`uniqueItems` at {where}"
    if "multipleOf" in node:  # (dropped beside a range, and every number has one here)
        return f"`multipleOf` at {where}"
    for key in _ALONE:
        if key in node:
            beside = [k for k in node if k != key and k not in _ANNOTATIONS]
            if beside:
                return f"`{beside[0]}` beside `{key}` at {where} (only the `{key}` is read)"
            break
    all_of = node.get("allOf")
    if isinstance(all_of, list) and len(all_of) > 1:
        return f"`allOf` of {len(all_of)} schemas at {where} (none of them is applied there)"
    required, props = node.get("required"), node.get("properties")
    if isinstance(required, list) and "patternProperties" not in node:
        listed = props if isinstance(props, dict) else {}
        missing = next((r for r in required if isinstance(r, str) and r not in listed), None)
        if missing is not None:  # (OpenAI's strict mode: "Extra required key ... supplied")
            return f"the `required` name {missing!r} at {where}, which is not in its `properties`"
    pattern = node.get("pattern")
    if isinstance(pattern, str) and any(m in pattern for m in _LOOKAROUND):
        return f"a look-ahead in `pattern` at {where}"
    ref = node.get("$ref")
    if isinstance(ref, str) and not ref.startswith("#"):
        return f"the `$ref` {ref!r} at {where} (only references into the schema itself are read)"
    for sub, at in subschemas(node, where, _ONE):
        found = unenforced(sub, at)
        if found:
            return found
    return None


def refusal(found: str) -> str:
    """The 400's message for a strict schema holding `found`."""
    return (f"The schema is strict, but this server's grammar cannot apply {found}: a "
            "document breaking it would still be accepted. Remove the keyword, or send the "
            "schema without `strict`: the grammar then applies what it can.")
