"""Schema keywords the grammar compiler takes but does not apply: each listed one is left
out by the compiler (a document breaking it still matches: if a new xgrammar applies one,
its case here fails and the keyword can leave the list), each applied one a schema commonly
carries is not listed; a strict schema holding one is a 400 naming it, a non-strict one is
applied as far as the grammar goes."""

from __future__ import annotations

import pytest

from chat import (
    ConstraintError,
    GrammarEngine,
    constraint_request_from_openai,
    spec_for_kind,
)
from chat.unenforced import unenforced
from tests.chat.vocab import small_vocab

OBJ = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}

# (schema, where the keyword is said to be, a document that breaks it)
LEFT_OUT = [
    ({"allOf": [{**OBJ, "required": ["a"]}, {**OBJ, "required": ["b"]}]}, "`allOf` of 2", "[1]"),
    ({"type": "string", "not": {"const": "x"}}, "`not`", '"x"'),
    ({**OBJ, "if": {"properties": {"a": {"const": 1}}}, "then": {"required": ["b"]}}, "`if`",
     '{"a": 1}'),
    ({**OBJ, "dependentRequired": {"a": ["b"]}}, "`dependentRequired`", '{"a": 1}'),
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "`uniqueItems`",
     "[1, 1]"),
    ({"type": "array", "items": {"type": "integer"}, "contains": {"const": 5}}, "`contains`",
     "[1]"),
    ({"type": "object", "properties": {"s": {"type": "string", "pattern": "^(?=a).*$"}}},
     "look-ahead in `pattern` at schema.properties.s", '{"s": "b"}'),
    ({"$ref": "https://example.com/s.json"}, "`$ref`", "[1]"),
    ({"type": "integer", "minimum": 0, "multipleOf": 5}, "`multipleOf`", "7"),  # pydantic's
    ({"type": "integer", "multipleOf": 5}, "`multipleOf`", "7"),  # (our 16-digit range)
    ({"type": "number", "multipleOf": 0.5}, "`multipleOf`", "0.3"),
    ({"$defs": {"B": {**OBJ, "required": ["b"]}}, **OBJ, "required": ["a"],
      "allOf": [{"$ref": "#/$defs/B"}]}, "`type` beside `allOf`", '{"b": 1}'),
    ({"$defs": {"B": {**OBJ, "required": ["b"]}}, "required": ["a"], "$ref": "#/$defs/B"},
     "`required` beside `$ref`", '{"b": 1}'),
    ({"type": "string", "maxLength": 2, "allOf": [{"type": "string"}]}, "beside `allOf`",
     '"xxxxx"'),
    ({**OBJ, "required": ["a"], "anyOf": [{"required": ["b"]}]}, "beside `anyOf`", '{"b": 1}'),
    # found probing live: a strict schema whose required key is not a property
    ({**OBJ, "required": ["a", "c"], "additionalProperties": False},
     "`required` name 'c' at schema,", '{"a": 1}'),
    ({**OBJ, "required": ["c"]}, "`required` name 'c'", '{"a": 1}'),
    ({"type": "object", "required": ["c"]}, "`required` name 'c'", '{"a": 1}'),
]
# (schema, a document that breaks it): applied, so not listed
APPLIED = [
    ({"allOf": [{**OBJ, "required": ["a"]}]}, "[1]"),
    ({"type": "object", "patternProperties": {"^x": {"type": "integer"}},
      "additionalProperties": False}, '{"x1": "s"}'),
    ({"type": "object", "propertyNames": {"pattern": "^x"}}, '{"y": 1}'),
    ({**OBJ, "unevaluatedProperties": False}, '{"c": 1}'),
    ({"$defs": {"A": {"type": "integer"}}, "$ref": "#/$defs/A", "description": "a number"},
     '"x"'),
    ({"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None, "title": "N"}, '"x"'),
    ({"$defs": {"A": {"type": "integer"}}, "$ref": "#/$defs/A"}, '"x"'),
    ({"type": "string", "pattern": "^a+$"}, '"b"'),
    ({"oneOf": [{"type": "integer"}, {"type": "string"}]}, "[]"),
]


@pytest.fixture(scope="module")
def engine() -> GrammarEngine:
    vocab, stops = small_vocab()
    return GrammarEngine(vocab, stops)


def _body(schema: dict, strict: bool | None = None) -> dict:
    spec = {"name": "x", "schema": schema, **({} if strict is None else {"strict": strict})}
    return {"response_format": {"type": "json_schema", "json_schema": spec}}


def _accepts(engine: GrammarEngine, schema: dict, doc: str) -> bool:
    request = constraint_request_from_openai(_body(schema))
    return engine.accepts(spec_for_kind("hermes_json"), request, "", doc)[0]


@pytest.mark.parametrize("schema,said,doc", LEFT_OUT)
def test_a_listed_keyword_is_left_out_by_the_compiler(engine, schema, said, doc) -> None:
    assert said in (unenforced(schema) or "")
    assert _accepts(engine, schema, doc)  # the document breaks the keyword, yet matches


@pytest.mark.parametrize("schema,doc", APPLIED)
def test_an_applied_keyword_is_not_listed(engine, schema, doc) -> None:
    assert unenforced(schema) is None
    assert not _accepts(engine, schema, doc)


def test_a_strict_schema_holding_one_is_refused_naming_it() -> None:
    schema = {"type": "object", "properties": {"tags": {
        "type": "array", "items": {"type": "string"}, "uniqueItems": True}}}
    with pytest.raises(ConstraintError) as err:
        constraint_request_from_openai(_body(schema, strict=True))
    assert err.value.param == "response_format.json_schema.schema"
    assert "`uniqueItems` at response_format.json_schema.schema.properties.tags" in \
        err.value.message
    assert constraint_request_from_openai(_body(schema)).json_schema == schema  # not strict
    tool = {"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        "type": "object", "properties": {"x": {"type": "string", "not": {"const": ""}}}}}}
    with pytest.raises(ConstraintError) as err:
        constraint_request_from_openai({"tools": [tool]})
    assert err.value.param == "tools[0].function.parameters"
    assert "`not` at tools[0].function.parameters.properties.x" in err.value.message
