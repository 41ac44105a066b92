"""constraint_request_from_openai: normalisation, every 400 case, and null for every field."""

from __future__ import annotations

import pytest

from chat import ConstraintError, constraint_request_from_openai

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
OTHER = {"type": "function", "function": {"name": "other", "parameters": {"type": "object"}}}


def test_defaults() -> None:
    r = constraint_request_from_openai({})
    assert (r.tools, r.tool_choice, r.parallel_tool_calls, r.response_format,
            r.allow_reasoning) == ((), "auto", True, "text", True)
    assert not r.constrains and not r.parse_tool_calls


@pytest.mark.parametrize("field", ["tools", "tool_choice", "parallel_tool_calls",
                                   "response_format", "think", "reasoning_effort",
                                   "chat_template_kwargs"])
def test_null_reads_as_missing(field: str) -> None:
    assert constraint_request_from_openai({field: None}) == constraint_request_from_openai({})


def test_nested_nulls_read_as_missing() -> None:
    r = constraint_request_from_openai({
        "tools": [TOOL], "response_format": {"type": None},
        "chat_template_kwargs": {"enable_thinking": None},
        "tool_choice": None,
    })
    assert r.response_format == "text" and r.allow_reasoning and r.tool_choice == "auto"
    fn = {"type": "function", "function": {"name": "f", "parameters": None,
                                           "description": None}}
    assert constraint_request_from_openai({"tools": [fn]}).tools[0].parameters["type"] == "object"


def test_named_function_keeps_only_that_tool() -> None:
    r = constraint_request_from_openai({"tools": [TOOL, OTHER], "tool_choice": {
        "type": "function", "function": {"name": "other"}}})
    assert r.tool_choice == "required" and r.named == "other"
    assert [t.name for t in r.tools] == ["other"] and len(r.all_tools) == 2


def test_allowed_tools() -> None:
    r = constraint_request_from_openai({"tools": [TOOL, OTHER], "tool_choice": {
        "type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
            {"type": "function", "function": {"name": "get_weather"}}]}}})
    assert r.tool_choice == "required" and [t.name for t in r.tools] == ["get_weather"]


def test_none_keeps_no_callable_tools() -> None:
    r = constraint_request_from_openai({"tools": [TOOL], "tool_choice": "none"})
    assert r.tools == () and r.all_tools and not r.parse_tool_calls


@pytest.mark.parametrize("body", [
    {"think": False}, {"reasoning_effort": "none"},
    {"chat_template_kwargs": {"enable_thinking": False}},
])
def test_thinking_switch(body: dict) -> None:
    assert constraint_request_from_openai(body).allow_reasoning is False


def test_response_formats() -> None:
    r = constraint_request_from_openai({"response_format": {"type": "json_object"}})
    assert r.response_format == "json_object" and r.json_schema == {"type": "object"}
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    r = constraint_request_from_openai({"response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}})
    assert r.response_format == "json_schema" and r.json_schema == schema


@pytest.mark.parametrize("body,param", [
    ({"tools": {}}, "tools"),
    ({"tools": ["x"]}, "tools[0]"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
    ({"tools": [{"type": "function"}]}, "tools[0].function"),
    ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]},
     "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
     "tools[0].function.parameters"),
    ({"tools": [TOOL, TOOL]}, "tools[1].function.name"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": 3}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, "tool_choice"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {}}},
     "tool_choice.function.name"),
    ({"tools": [TOOL], "tool_choice": {"type": "function"}}, "tool_choice.function.name"),
    ({"tools": [TOOL], "tool_choice": {"type": "magic"}}, "tool_choice.type"),
    ({"tools": [TOOL], "tool_choice": {"type": "allowed_tools"}}, "tool_choice.allowed_tools"),
    ({"tools": [TOOL], "tool_choice": {"type": "allowed_tools", "allowed_tools": {
        "mode": "often", "tools": [TOOL]}}}, "tool_choice.allowed_tools.mode"),
    ({"tools": [TOOL], "tool_choice": {"type": "allowed_tools", "allowed_tools": {
        "mode": "auto", "tools": []}}}, "tool_choice.allowed_tools.tools"),
    ({"tools": [TOOL], "tool_choice": {"type": "allowed_tools", "allowed_tools": {
        "tools": [{"type": "function", "function": {"name": "zz"}}]}}},
     "tool_choice.allowed_tools.tools[0].function.name"),
    ({"parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"parallel_tool_calls": 1}, "parallel_tool_calls"),
    ({"response_format": "json"}, "response_format"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": 3}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": False}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}, "strict": "y"}}},
     "response_format.json_schema.strict"),
    ({"think": "no"}, "think"),
    ({"reasoning_effort": "extreme"}, "reasoning_effort"),
    ({"chat_template_kwargs": []}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"enable_thinking": "off"}},
     "chat_template_kwargs.enable_thinking"),
])
def test_invalid_options_name_their_parameter(body: dict, param: str) -> None:
    with pytest.raises(ConstraintError) as err:
        constraint_request_from_openai(body)
    assert err.value.param == param
    assert err.value.message


def test_body_must_be_an_object() -> None:
    with pytest.raises(ConstraintError):
        constraint_request_from_openai([])  # type: ignore[arg-type]
