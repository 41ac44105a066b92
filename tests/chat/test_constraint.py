"""Constraints through GrammarEngine.accepts(): every tool_choice mode on every format
accepts outputs that obey the request and rejects outputs that break it."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from chat import (
    ConstraintError,
    GrammarEngine,
    constraint_request_from_openai,
    format_prefill,
    make_constraint,
    spec_for_kind,
    structural_tag,
)
from chat.decode import GrammarConstraint, TokenBanConstraint, mask_words, needs_grammar
from chat.grammar import MAX_WHITESPACE
from tests.chat.render import calls_text, final_text, reasoning_text
from tests.chat.vocab import small_vocab

TOOL_KINDS = ["hermes_json", "qwen_xml", "gemma4", "lfm2_pythonic", "harmony", "mistral_json",
              "mistral_args", "llama3_json"]
# llama3_json's calls begin as a JSON answer may: auto leaves its text free (see below)
AUTO_KINDS = [k for k in TOOL_KINDS if k != "llama3_json"]
CHOSEN = [(k, c) for k in TOOL_KINDS for c in ("auto", "required")
          if k in AUTO_KINDS or c != "auto"]
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"]}}}
TOGGLE = {"type": "function", "function": {"name": "toggle", "parameters": {
    "type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]}}}
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"]}
PARIS = ("get_weather", {"city": "Paris", "days": 3})
OSLO = ("get_weather", {"city": "Oslo"})
ON = ("toggle", {"on": True})


@pytest.fixture(scope="module")
def engine() -> GrammarEngine:
    vocab, stops = small_vocab()
    return GrammarEngine(vocab, stops)


def _prefill(kind: str) -> str:
    return "assistant" if kind == "harmony" else ""


def _accepts(engine, kind, body, text, *, prefill=None) -> tuple[bool, str]:
    spec = spec_for_kind(kind)
    request = constraint_request_from_openai(body)
    return engine.accepts(spec, request, _prefill(kind) if prefill is None else prefill, text)


def _tools(choice="auto", parallel=None, **extra) -> dict:
    body = {"tools": [WEATHER, TOGGLE], "tool_choice": choice, **extra}
    if parallel is not None:
        body["parallel_tool_calls"] = parallel
    return body


# -- accepted ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", TOOL_KINDS)
@pytest.mark.parametrize("choice", ["auto", "required"])
def test_calls_are_accepted(engine, kind: str, choice: str) -> None:
    # gpt-oss stops at <|call|>: one call a turn
    text = calls_text(kind, [PARIS] if kind in ("harmony", "llama3_json") else [PARIS, ON])
    assert _accepts(engine, kind, _tools(choice), text) == (True, "")


@pytest.mark.parametrize("kind", TOOL_KINDS)
def test_reasoning_then_call_is_accepted(engine, kind: str) -> None:
    text = reasoning_text(kind, "I should check.") + calls_text(kind, [OSLO])
    assert _accepts(engine, kind, _tools("required"), text) == (True, "")


@pytest.mark.parametrize("kind", TOOL_KINDS)
def test_named_function_is_accepted(engine, kind: str) -> None:
    body = _tools({"type": "function", "function": {"name": "toggle"}})
    assert _accepts(engine, kind, body, calls_text(kind, [ON])) == (True, "")


@pytest.mark.parametrize("kind", [k for k in TOOL_KINDS if k not in ("harmony", "llama3_json")])
def test_a_named_function_is_called_once_unless_the_request_says_otherwise(engine,
                                                                           kind: str) -> None:
    """Found probing Mistral live: a named function came back as two or three calls of it.
    OpenAI's guide: a forced function is "call exactly one specific function" (vLLM gives
    one); `parallel_tool_calls: true` asks for more."""
    named = {"type": "function", "function": {"name": "toggle"}}
    twice = calls_text(kind, [ON, ON])
    assert not _accepts(engine, kind, _tools(named), twice)[0]
    assert _accepts(engine, kind, _tools(named), calls_text(kind, [ON])) == (True, "")
    assert _accepts(engine, kind, _tools(named, parallel=True), twice) == (True, "")


@pytest.mark.parametrize("kind", [k for k in TOOL_KINDS if k != "harmony"])
def test_auto_allows_text_around_calls(engine, kind: str) -> None:
    text = "Let me look." + calls_text(kind, [OSLO])
    assert _accepts(engine, kind, _tools("auto"), text) == (True, "")
    assert _accepts(engine, kind, _tools("auto"), "No tool needed.") == (True, "")


def test_harmony_auto_allows_a_final_answer_or_a_preamble(engine) -> None:
    ok = final_text("harmony", "Sunny.")
    assert _accepts(engine, "harmony", _tools("auto"), ok) == (True, "")
    pre = "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant"
    assert _accepts(engine, "harmony", _tools("auto"), pre + calls_text("harmony", [OSLO]))[0]


def test_qwen_xml_auto_constrains_a_bare_function_call(engine) -> None:
    """qwen_xml's parser reads `<function=...>` without its `<tool_call>` wrapper as a call:
    in auto mode the grammar holds such a call to the tools' schemas too."""
    wrapped = calls_text("qwen_xml", [OSLO])
    bare = wrapped[wrapped.index("<function="):wrapped.index("</function>") + len("</function>")]
    assert _accepts(engine, "qwen_xml", _tools("auto"), "Checking. " + bare) == (True, "")
    bad = bare.replace("get_weather", "delete_all")
    assert not _accepts(engine, "qwen_xml", _tools("auto"), "Checking. " + bad)[0]
    assert not _accepts(engine, "qwen_xml", _tools("auto"), "I will not <function=x")[0]


# -- rejected ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", TOOL_KINDS)
def test_unknown_function_is_rejected(engine, kind: str) -> None:
    text = calls_text(kind, [("delete_all", {"city": "x"})])
    for choice in ("auto", "required") if kind in AUTO_KINDS else ("required",):
        ok, why = _accepts(engine, kind, _tools(choice), text)
        assert not ok, choice


def test_llama3_auto_leaves_a_json_answer_free(engine) -> None:
    """A Llama 3.x call is a bare `{"name": ...}`: a trigger on it would turn a JSON answer
    that begins so into a call of some tool. In auto the text is free (the parser reads a
    call only where it names a tool); required and a named function force the call."""
    answer = '{"name": "Ada", "age": 36}'
    assert _accepts(engine, "llama3_json", _tools("auto"), answer) == (True, "")
    assert not _accepts(engine, "llama3_json", _tools("required"), answer)[0]
    named = _tools({"type": "function", "function": {"name": "toggle"}})
    assert not _accepts(engine, "llama3_json", named, answer)[0]


@pytest.mark.parametrize("kind", TOOL_KINDS)
@pytest.mark.parametrize("declared", [{}, {"parameters": {"type": "object", "properties": {}}}],
                         ids=["omitted", "mcp"])
def test_a_tool_without_parameters_is_called_with_none(engine, kind: str, declared) -> None:
    """Found probing live: such a tool's forced call came back as `{"type": "object"` (its
    arguments free, a small model wrote the schema back). OpenAI: an omitted `parameters`
    is "an empty parameter list"; MCP writes a tool without arguments as no properties."""
    body = {"tools": [{"type": "function", "function": {"name": "ping", **declared}}],
            "tool_choice": "required"}
    assert _accepts(engine, kind, body, calls_text(kind, [("ping", {})])) == (True, "")
    assert not _accepts(engine, kind, body, calls_text(kind, [("ping", {"type": "x"})]))[0]
    free = {"tools": [{"type": "function", "function": {
        "name": "ping", "parameters": {"type": "object"}}}], "tool_choice": "required"}
    assert _accepts(engine, kind, free, calls_text(kind, [("ping", {"type": "x"})])) == (
        True, "")


@pytest.mark.parametrize("kind", TOOL_KINDS)
def test_missing_required_argument_is_rejected(engine, kind: str) -> None:
    text = calls_text(kind, [("get_weather", {"days": 2})])
    assert not _accepts(engine, kind, _tools("required"), text)[0]


@pytest.mark.parametrize("kind", TOOL_KINDS)
def test_text_where_only_calls_may_stand_is_rejected(engine, kind: str) -> None:
    text = "Sure! " + calls_text(kind, [OSLO])
    assert not _accepts(engine, kind, _tools("required"), text)[0]
    assert not _accepts(engine, kind, _tools("required"), final_text(kind, "No."))[0]


@pytest.mark.parametrize("kind", [k for k in TOOL_KINDS if k != "harmony"])
def test_second_call_is_rejected_without_parallel_calls(engine, kind: str) -> None:
    two = calls_text(kind, [PARIS, ON])
    assert not _accepts(engine, kind, _tools("required", parallel=False), two)[0]
    one = calls_text(kind, [PARIS])
    assert _accepts(engine, kind, _tools("required", parallel=False), one)[0]


@pytest.mark.parametrize("kind", TOOL_KINDS)
def test_named_function_rejects_the_other_tool(engine, kind: str) -> None:
    body = _tools({"type": "function", "function": {"name": "toggle"}})
    assert not _accepts(engine, kind, body, calls_text(kind, [OSLO]))[0]


@pytest.mark.parametrize("kind", TOOL_KINDS)
def test_reasoning_is_rejected_when_thinking_is_off(engine, kind: str) -> None:
    text = reasoning_text(kind, "hmm") + calls_text(kind, [OSLO])
    assert not _accepts(engine, kind, _tools("required", think=False), text)[0]
    assert _accepts(engine, kind, _tools("required", think=False), calls_text(kind, [OSLO]))[0]


def test_wrong_argument_type_is_rejected(engine) -> None:
    text = calls_text("hermes_json", [("toggle", {"on": "yes"})])
    assert not _accepts(engine, "hermes_json", _tools("required"), text)[0]


def test_unbounded_numbers_and_whitespace_are_rejected(engine) -> None:
    long = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "x", "days": ' + \
        "1" * 17 + "}}\n</tool_call>"
    assert not _accepts(engine, "hermes_json", _tools("required"), long)[0]
    padded = '<tool_call>\n{"name":' + " " * (MAX_WHITESPACE + 1) + \
        '"get_weather", "arguments": {"city": "x"}}\n</tool_call>'
    assert not _accepts(engine, "hermes_json", _tools("required"), padded)[0]


@pytest.mark.parametrize("indent", [2, 4])
def test_a_pretty_printed_document_is_accepted(engine, indent: int) -> None:
    """A model that pretty-prints the document it is asked for (a newline and the indent of
    the depth, six levels deep at four spaces) is not cut off inside it; a call's
    arguments keep the tight bound (templates show a model its past calls on one line)."""
    deep: dict = {"leaf": 1}
    for key in "abcde":  # 6 levels of objects
        deep = {key: deep}
    body = {"response_format": {"type": "json_object"}}
    for doc in (json.dumps({"data": {"users": [{"address": {"city": "x"}}]}}, indent=indent),
                json.dumps(deep, indent=indent)):
        assert _accepts(engine, "hermes_json", body, doc)[0]
    doc = json.dumps(deep, indent=indent)
    assert not _accepts(engine, "hermes_json", body, doc.replace("\n", "\n" + " " * 28))[0]
    call = json.dumps({"name": "get_weather", "arguments": {"city": "x"}}, indent=4)
    text = "<tool_call>\n" + call + "\n</tool_call>"
    assert not _accepts(engine, "hermes_json", _tools("required"), text)[0]


# -- response_format ------------------------------------------------------------------------
FMT = {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}}


@pytest.mark.parametrize("kind", TOOL_KINDS + ["content_only"])
def test_json_schema_document(engine, kind: str) -> None:
    doc = json.dumps({"name": "Ann", "age": 31})
    assert _accepts(engine, kind, FMT, final_text(kind, doc)) == (True, "")
    assert _accepts(engine, kind, FMT, reasoning_text(kind, "easy") + final_text(kind, doc))[0]
    bad = json.dumps({"name": "Ann"})
    assert not _accepts(engine, kind, FMT, final_text(kind, bad))[0]
    assert not _accepts(engine, kind, FMT, final_text(kind, "Here: " + doc))[0]


def test_json_object(engine) -> None:
    body = {"response_format": {"type": "json_object"}}
    assert _accepts(engine, "hermes_json", body, '{"a": [1, 2]}')[0]
    assert not _accepts(engine, "hermes_json", body, "[1, 2]")[0]


def test_unusable_schema_is_a_constraint_error(engine) -> None:
    body = {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "tensor"}}}}}}
    with pytest.raises(ConstraintError) as err:
        _accepts(engine, "hermes_json", body, "{}")
    assert err.value.param == "response_format.json_schema.schema"


# Pydantic's nested models, LangChain's tools and MCP servers write their schemas so:
# definitions under $defs (or draft 7's definitions) and references into the tool's own
# schema, a recursive one included
ADDRESS = {"type": "function", "function": {"name": "ship", "parameters": {
    "type": "object", "$defs": {"Addr": {"type": "object",
                                         "properties": {"city": {"type": "string"}},
                                         "required": ["city"]}},
    "properties": {"to": {"$ref": "#/$defs/Addr"}}, "required": ["to"]}}}
TREE = {"type": "function", "function": {"name": "tree", "parameters": {
    "type": "object", "definitions": {"Kind": {"enum": ["leaf", "node"]}},
    "properties": {"kind": {"$ref": "#/definitions/Kind"},
                   "same": {"$ref": "#/properties/kind"},
                   "kids": {"type": "array", "items": {"$ref": "#"}}},
    "required": ["kind"]}}}


@pytest.mark.parametrize("kind,choice", CHOSEN)
def test_schemas_that_refer_into_themselves_constrain_their_calls(engine, kind: str,
                                                                  choice: str) -> None:
    """A reference names a part of its own tool's schema wherever the format puts that
    schema (hermes_json's call object wraps it): the arguments it describes are taken, and
    arguments that break it are not."""
    body = {"tools": [ADDRESS, TREE, WEATHER], "tool_choice": choice}
    ship = calls_text(kind, [("ship", {"to": {"city": "Oslo"}})])
    assert _accepts(engine, kind, body, ship) == (True, "")
    tree = calls_text(kind, [("tree", {"kind": "node", "same": "leaf",
                                       "kids": [{"kind": "leaf"}]})])
    assert _accepts(engine, kind, body, tree) == (True, "")
    if kind == "lfm2_pythonic":  # its own grammar reads no references: any value there
        return
    town = calls_text(kind, [("ship", {"to": {"town": "Oslo"}})])
    assert not _accepts(engine, kind, body, town)[0]
    assert not _accepts(engine, kind, body, calls_text(kind, [("tree", {"kind": "tree"})]))[0]
    assert not _accepts(engine, kind, body, calls_text(
        kind, [("tree", {"kind": "node", "kids": [{"kind": "twig"}]})]))[0]


@pytest.mark.parametrize("kind", TOOL_KINDS)
def test_a_tool_schema_the_compiler_refuses_leaves_its_arguments_free(engine, kind: str,
                                                                      caplog) -> None:
    """As OpenAI and Anthropic take non-strict tools: one odd tool among many (an empty
    enum, draft 4's tuple `items`, a look-behind pattern) does not refuse the request; its
    arguments are any object, the other tools stay constrained, and the log says so."""
    odd = {"type": "function", "function": {"name": "odd", "parameters": {
        "type": "object", "properties": {"a": {"enum": []},
                                         "t": {"type": "array", "items": [{"type": "string"}]},
                                         "p": {"type": "string", "pattern": "(?<=a)b"}}}}}
    body = {"tools": [WEATHER, odd], "tool_choice": "auto" if kind in AUTO_KINDS else "required"}
    assert not _accepts(engine, kind, body, calls_text(kind, [("get_weather", {"town": 1})]))[0]
    assert _accepts(engine, kind, body, calls_text(kind, [PARIS]))[0]
    if kind == "lfm2_pythonic":  # its own grammar (Python keywords) takes any schema
        return
    with caplog.at_level(logging.WARNING):
        assert _accepts(engine, kind, body, calls_text(kind, [("odd", {"x": [1, "y"]})]))[0]
    assert "'odd' are not constrained" in caplog.text


def test_a_strict_tool_whose_schema_the_compiler_refuses_is_refused(engine) -> None:
    """`strict: true` asks for the schema exactly: a schema the grammar cannot apply is a 400
    naming the tool (it was loosened to any object, silently)."""
    odd = {"type": "function", "function": {"name": "odd", "strict": True, "parameters": {
        "type": "object", "properties": {"p": {"type": "string", "pattern": "(?<=a)b"}}}}}
    request = constraint_request_from_openai({"tools": [WEATHER, odd], "tool_choice": "auto"})
    with pytest.raises(ConstraintError) as err:
        make_constraint(spec_for_kind("hermes_json"), request, engine)
    assert err.value.param == "tools[1].function.parameters"
    assert "'odd' is strict" in err.value.message


@pytest.mark.parametrize("schema,good,bad", [
    ({"type": "number", "minimum": 0, "exclusiveMinimum": True}, "0.5", "0"),  # draft 4
    ({"type": "number", "maximum": 1, "exclusiveMaximum": False}, "1", "2"),
    ({"type": "integer", "minimum": 0.5, "maximum": 2.5}, "1", "3"),  # (a 400 before)
    ({"type": "integer", "exclusiveMinimum": 0.5, "exclusiveMaximum": 2.5}, "2", "0"),
    ({"type": "integer", "minimum": 5, "exclusiveMinimum": 0.5}, "5", "2"),  # the tighter
    ({"type": "integer", "maximum": 3, "exclusiveMaximum": 10.5}, "3", "4"),
    ({"type": ["integer", "null"], "minimum": 0.5}, "1", "0"),
    ({"type": "integer", "maximum": 1e20}, "5", "1" * 17),  # (past int64: a 400 before)
])
def test_number_keywords_hold_in_a_document(engine, schema: dict, good: str, bad: str) -> None:
    """Found with the SDKs' structured outputs: draft 4's (OpenAPI 3.0's) boolean
    exclusiveMinimum and an integer's fractional bounds were 400s; a side's tightest bound
    holds."""
    body = {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"n": schema}, "required": ["n"],
        "additionalProperties": False}}}}
    assert _accepts(engine, "hermes_json", body, '{"n": %s}' % good) == (True, "")
    assert not _accepts(engine, "hermes_json", body, '{"n": %s}' % bad)[0]


def test_a_schema_that_names_a_marker_can_be_written(engine) -> None:
    """Strings exclude the format's markers (the parser would read them as markup), but a
    schema whose own const, enum or property name holds one asked for it: that grammar had
    no way out, and the constraint gave up (the reply went unconstrained)."""
    def body(schema):
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "x",
                "schema": {"type": "object", "properties": schema,
                           "required": list(schema), "additionalProperties": False}}}}

    assert _accepts(engine, "hermes_json", body({"tag": {"const": "<think>"}}),
                    '{"tag": "<think>"}') == (True, "")
    assert _accepts(engine, "hermes_json", body({"<tool_call>": {"enum": ["a", "</tool_call>"]}}),
                    '{"<tool_call>": "</tool_call>"}') == (True, "")
    assert not _accepts(engine, "hermes_json", body({"s": {"type": "string"}}),
                        '{"s": "<think>"}')[0]  # a free string still never spells one
    said = {"s": {"type": "string", "description": "may hold <think> tags"}}
    assert not _accepts(engine, "hermes_json", body(said), '{"s": "<think>"}')[0]


def test_a_reference_under_a_property_named_like_a_keyword_is_rebased(engine) -> None:
    """A property may be called "default" or "example": its schema is a schema."""
    tool = {"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "$defs": {"C": {"enum": ["red", "blue"]}},
        "properties": {"default": {"$ref": "#/$defs/C"}}, "required": ["default"]}}}
    body = {"tools": [tool], "tool_choice": "required"}
    ok = calls_text("hermes_json", [("pick", {"default": "red"})])
    assert _accepts(engine, "hermes_json", body, ok) == (True, "")
    bad = calls_text("hermes_json", [("pick", {"default": "green"})])
    assert not _accepts(engine, "hermes_json", body, bad)[0]


@pytest.mark.parametrize("parameters,fault", [
    ({"type": "object", "properties": {"a": {"type": "zz"}}}, "type 'zz'"),
    ({"type": "object", "properties": {"a": {"type": 5}}}, "type 5"),
    ({"type": "object", "properties": {"a": {"type": [{}]}}}, "type {}"),
    ({"type": "object", "properties": {"a": {"anyOf": {"type": "string"}}}},
     "anyOf is not a list"),
])
def test_a_tool_schema_that_is_no_schema_is_refused_naming_it(engine, parameters: dict,
                                                              fault: str) -> None:
    """A type JSON Schema does not have is the client's mistake, not a keyword the compiler
    cannot apply: a 400 naming the tool's parameters (as OpenAI refuses it)."""
    bad = {"type": "function", "function": {"name": "bad", "parameters": parameters}}
    body = {"tools": [WEATHER, bad], "tool_choice": "auto"}
    with pytest.raises(ConstraintError) as err:
        _accepts(engine, "hermes_json", body, "hi")
    assert err.value.param == "tools[1].function.parameters" and fault in str(err.value)


def test_a_response_format_the_compiler_refuses_is_refused_without_its_source_path(
        engine) -> None:
    body = {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"enum": []}}}}}}
    with pytest.raises(ConstraintError) as err:
        _accepts(engine, "hermes_json", body, "{}")
    assert err.value.param == "response_format.json_schema.schema"
    assert ".cc:" not in str(err.value) and "] " not in str(err.value)


@pytest.mark.parametrize("kind", ["hermes_json", "qwen_xml", "harmony"])
def test_string_lengths_are_held_where_strings_exclude_the_formats_markers(engine,
                                                                           kind: str) -> None:
    """Pydantic's min_length / max_length: the grammar holds a string to them in a response
    format and in a tool's arguments (xgrammar drops them under its marker exclusion, which
    such a schema therefore goes without)."""
    schema = {"type": "object", "properties": {"zz": {"type": "string", "minLength": 3,
                                                      "maxLength": 5}}, "required": ["zz"]}
    fmt = {"response_format": {"type": "json_schema", "json_schema": {"name": "x",
                                                                       "schema": schema}}}
    for text, ok in (("abc", True), ("abcde", True), ("a", False), ("abcdef", False)):
        doc = json.dumps({"zz": text})
        assert _accepts(engine, kind, fmt, final_text(kind, doc))[0] is ok, text
    tool = {"type": "function", "function": {"name": "say", "parameters": schema}}
    body = {"tools": [tool], "tool_choice": "required"}
    assert _accepts(engine, kind, body, calls_text(kind, [("say", {"zz": "abcd"})]))[0]
    if kind != "qwen_xml":  # xgrammar's XML style writes a parameter's text unbounded
        assert not _accepts(engine, kind, body, calls_text(kind, [("say", {"zz": "ab"})]))[0]


@pytest.mark.parametrize("bound,value", [({"minimum": 10**17}, 10**17),
                                         ({"exclusiveMinimum": 10**16 - 1}, 10**16),
                                         ({"maximum": -(10**17)}, -(10**17))])
def test_a_schemas_own_bounds_past_16_digits_stand(engine, bound: dict, value: int) -> None:
    """Numbers are held to 16 digits where a schema leaves a side open, never against the
    schema's own bound on the other side (past which the open side is as many digits more:
    still bounded)."""
    schema = {"type": "object", "properties": {"n": {"type": "integer", **bound}},
              "required": ["n"]}
    body = {"response_format": {"type": "json_schema", "json_schema": {"name": "x",
                                                                        "schema": schema}}}
    assert _accepts(engine, "hermes_json", body, json.dumps({"n": value}))[0]
    assert not _accepts(engine, "hermes_json", body, json.dumps({"n": -value}))[0]
    assert not _accepts(engine, "hermes_json", body, json.dumps({"n": value * 100}))[0]


# -- make_constraint --------------------------------------------------------------------------
def test_nothing_to_constrain_costs_nothing(engine) -> None:
    spec = spec_for_kind("hermes_json")
    request = constraint_request_from_openai({"think": False})
    assert structural_tag(spec, request) is None
    assert make_constraint(spec, request, engine) is None
    assert not needs_grammar(spec, request)


def test_tool_choice_none_bans_the_single_token_opener(engine) -> None:
    spec = spec_for_kind("hermes_json")
    request = constraint_request_from_openai({"tools": [WEATHER], "tool_choice": "none"})
    c = make_constraint(spec, request, engine)
    assert isinstance(c, TokenBanConstraint)
    buf = np.zeros(mask_words(engine.vocab_size), dtype=np.uint32)
    assert c.fill_mask(buf)
    opener = engine.token_id("<tool_call>")
    bits = np.unpackbits(buf.view(np.uint8), bitorder="little")
    assert bits[opener] == 0 and bits[:engine.vocab_size].sum() == engine.vocab_size - 1


def test_tool_choice_none_keeps_an_opener_of_several_tokens_out_of_the_text() -> None:
    """SmolLM2 spells <tool_call> in five tokens: no token to ban, so the text is held to
    never spell it (an agent's final turn after a history of calls would copy one)."""
    vocab, stops = small_vocab()
    vocab = [b"<unused>" if t == b"<tool_call>" else t for t in vocab]
    engine = GrammarEngine(vocab, stops)
    assert engine.token_id("<tool_call>") is None
    spec = spec_for_kind("hermes_json")
    request = constraint_request_from_openai({"tools": [WEATHER], "tool_choice": "none"})
    assert isinstance(make_constraint(spec, request, engine), GrammarConstraint)
    assert engine.accepts(spec, request, "", "It is sunny in Oslo.")[0]
    call = calls_text("hermes_json", [OSLO])
    assert not engine.accepts(spec, request, "", "Sure. " + call)[0]


def test_llama3_auto_holds_a_strict_tool_to_its_schema(engine) -> None:
    """`strict: true` holds (docs/api.md): with a strict tool, Llama's auto constrains a call
    it begins, at the price of a JSON answer that begins as a call would."""
    strict = {"type": "function", "function": {**TOGGLE["function"], "strict": True,
              "parameters": {**TOGGLE["function"]["parameters"], "additionalProperties": False}}}
    body = {"tools": [strict], "tool_choice": "auto"}
    bad = '{"name": "toggle", "parameters": {"on": "yes", "x": 1}}'
    assert not _accepts(engine, "llama3_json", body, bad)[0]
    assert _accepts(engine, "llama3_json", body, calls_text("llama3_json", [ON])) == (True, "")
    assert _accepts(engine, "llama3_json", body, "No call needed.") == (True, "")


def test_tool_choice_none_on_llama3_bans_its_marker_and_leaves_json_answers(engine) -> None:
    """llama3_json: a bare call begins as a JSON answer may, so `none` keeps only its
    marker (`<|python_tag|>`, one token) out; the answer parses as content."""
    spec = spec_for_kind("llama3_json")
    request = constraint_request_from_openai({"tools": [WEATHER], "tool_choice": "none"})
    c = make_constraint(spec, request, engine)
    assert isinstance(c, TokenBanConstraint)
    assert engine.accepts(spec, request, "", '{"name": "Ada", "age": 36}') == (True, "")
    assert not engine.accepts(spec, request, "", "<|python_tag|>" + calls_text(
        "llama3_json", [OSLO]))[0]


def test_model_without_tools_in_its_prompt(engine) -> None:
    spec = spec_for_kind("hermes_json")
    required = constraint_request_from_openai(_tools("required"))
    with pytest.raises(ConstraintError) as err:
        make_constraint(spec, required, engine, tools_enabled=False)
    assert err.value.param == "tool_choice"
    named = constraint_request_from_openai(
        _tools({"type": "function", "function": {"name": "toggle"}}))
    with pytest.raises(ConstraintError):
        make_constraint(spec, named, engine, tools_enabled=False)
    auto = constraint_request_from_openai(_tools("auto"))
    assert make_constraint(spec, auto, engine, tools_enabled=False) is None


def test_a_format_without_call_syntax_refuses_a_forced_call(engine) -> None:
    """Found serving Llama 3.x and Mistral templates (content_only here: their templates show
    tools, but their calls are not read): a required or named call was accepted and then
    nothing constrained the reply (plain text, no call). Now a 400; `auto` stays free."""
    spec = spec_for_kind("content_only")
    for choice in ("required", {"type": "function", "function": {"name": "toggle"}}):
        with pytest.raises(ConstraintError) as err:
            make_constraint(spec, constraint_request_from_openai(_tools(choice)), engine)
        assert err.value.param == "tool_choice" and "tool-call syntax" in err.value.message
    assert make_constraint(spec, constraint_request_from_openai(_tools("auto")), engine) is None


def test_prefill_that_opens_reasoning_switches_grammar(engine, caplog) -> None:
    spec = spec_for_kind("hermes_json")
    request = constraint_request_from_openai(_tools("required", think=False))
    c = make_constraint(spec, request, engine)
    assert isinstance(c, GrammarConstraint)
    with caplog.at_level(logging.WARNING):
        c.start(format_prefill(spec, "<|im_start|>assistant\n<think>\n"))
    assert c.active and "disabled" not in caplog.text
    assert c.check_text("ok</think>\n" + calls_text("hermes_json", [OSLO])) == (True, "")


def test_thinking_off_model_allows_no_reasoning(engine) -> None:
    spec = spec_for_kind("gemma4")
    request = constraint_request_from_openai(FMT)
    c = make_constraint(spec, request, engine, thinking_enabled=False)
    assert not c.check_text(reasoning_text("gemma4", "x") + '{"name": "a", "age": 1}')[0]


def test_forced_token_that_opens_reasoning_switches_grammar(engine) -> None:
    spec = spec_for_kind("hermes_json")
    c = make_constraint(spec, constraint_request_from_openai({**FMT, "think": False}), engine)
    c.start("")
    c.accept_forced(engine.token_id("<think>"))
    assert c.active
    assert c.check_text("x</think>" + '{"name": "a", "age": 1}') == (True, "")


def test_rejected_token_gives_up_once(engine, caplog) -> None:
    spec = spec_for_kind("hermes_json")
    c = make_constraint(spec, constraint_request_from_openai(FMT), engine, request_id="req-7")
    c.start("")
    with caplog.at_level(logging.WARNING):
        c.accept(engine.token_id("<tool_call>"))
        c.accept(engine.token_id("<tool_call>"))
    assert not c.active
    assert caplog.text.count("Constrained decoding disabled for request req-7") == 1
    buf = np.zeros(mask_words(engine.vocab_size), dtype=np.uint32)
    assert c.fill_mask(buf) is False


def test_compiled_grammars_are_cached(engine) -> None:
    spec = spec_for_kind("qwen_xml")
    tag = structural_tag(spec, constraint_request_from_openai(_tools("required")))
    assert engine.compile(tag) is engine.compile(json.loads(json.dumps(tag)))


def test_rollback_undoes_accepted_tokens(engine) -> None:
    spec = spec_for_kind("hermes_json")
    c = make_constraint(spec, constraint_request_from_openai(FMT), engine)
    c.start("")
    brace = engine.token_id("{")
    c.accept(brace)
    assert c.tokens == [brace]
    c.rollback(1)
    assert c.tokens == [] and c.active
    assert c.check_text('{"name": "a", "age": 1}') == (True, "")


def test_admits_counts_the_drafted_tokens_the_grammar_takes_and_changes_nothing(engine) -> None:
    spec = spec_for_kind("hermes_json")
    c = make_constraint(spec, constraint_request_from_openai(FMT), engine)
    c.start("")
    brace, opener = engine.token_id("{"), engine.token_id("<tool_call>")
    before = np.zeros(mask_words(engine.vocab_size), dtype=np.uint32)
    c.fill_mask(before)
    assert c.admits([brace, opener, brace]) == 1  # a JSON document cannot go on with <tool_call>
    assert c.admits([opener]) == 0 and c.admits([]) == 0
    after = np.zeros_like(before)
    c.fill_mask(after)
    assert c.tokens == [] and c.active and np.array_equal(before, after)
    ban = make_constraint(spec, constraint_request_from_openai(
        {"tools": [WEATHER], "tool_choice": "none"}), engine)
    assert ban.admits([brace, brace, opener, brace]) == 2


def test_padded_vocabulary_entries_are_never_allowed() -> None:
    vocab, stops = small_vocab()
    padded = GrammarEngine(list(vocab) + [b""] * 40, stops)
    spec = spec_for_kind("hermes_json")
    c = make_constraint(spec, constraint_request_from_openai(FMT), padded)
    c.start("")
    buf = np.zeros(mask_words(padded.vocab_size), dtype=np.uint32)
    c.fill_mask(buf)
    bits = np.unpackbits(buf.view(np.uint8), bitorder="little")
    assert not bits[len(vocab):padded.vocab_size].any()


UNITS = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "where": {"type": "object", "properties": {"country": {"type": "string"}}}},
    "required": ["city", "unit"]}}}


@pytest.mark.parametrize("text", [
    "<|tool_call_start|>[get_weather(city='Paris', unit='celsius')]<|tool_call_end|>",
    '<|tool_call_start|>[get_weather(city="Paris", unit="celsius")]<|tool_call_end|>',
    "<|tool_call_start|>[get_weather(city=\"Paris\", unit='fahrenheit', "
    "where={\"country\": 'FR'})]<|tool_call_end|>",
])
def test_lfm2_values_and_keys_in_either_quote_style(engine, text: str) -> None:
    body = {"tools": [UNITS], "tool_choice": "required"}
    assert _accepts(engine, "lfm2_pythonic", body, text) == (True, "")


def test_lfm2_enum_rejects_other_values_in_both_quote_styles(engine) -> None:
    body = {"tools": [UNITS], "tool_choice": "required"}
    for q in ("'", '"'):
        text = f"<|tool_call_start|>[get_weather(city='Paris', unit={q}kelvin{q})]<|tool_call_end|>"
        assert not _accepts(engine, "lfm2_pythonic", body, text)[0]


def test_a_strict_gemma4_tool_with_a_string_length_is_refused(engine) -> None:
    """Found probing live: Gemma 4's calls took ~200 characters for maxLength 3 (the
    compiler drops a length where its strings keep their delimiters out, and says so in a
    warning): strict is a 400 naming it; without strict the length is not held (if a new
    xgrammar holds it, the first assertion fails and the refusal can go)."""
    tool = {"type": "function", "function": {"name": "note", "parameters": {
        "type": "object", "properties": {"text": {"type": "string", "maxLength": 3}},
        "required": ["text"]}}}
    body = {"tools": [tool], "tool_choice": "required"}
    long = calls_text("gemma4", [("note", {"text": "abcdef"})])
    assert _accepts(engine, "gemma4", body, long)[0]
    strict = {"type": "function", "function": {**tool["function"], "strict": True}}
    with pytest.raises(ConstraintError) as err:
        make_constraint(spec_for_kind("gemma4"), constraint_request_from_openai(
            {"tools": [strict], "tool_choice": "required"}), engine)
    assert "maxLength" in err.value.message and err.value.param == "tools[0].function.parameters"


BOUNDED = {"type": "function", "function": {"name": "note", "parameters": {
    "type": "object", "properties": {
        "s": {"type": "string", "maxLength": 3},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1,
                 "maxItems": 2}},
    "required": ["s", "tags"]}}}


def test_lfm2_holds_string_lengths_and_array_sizes(engine) -> None:
    """Found probing live: LFM2's calls took a 40-character string for maxLength 3 and any
    number of items."""
    body = {"tools": [BOUNDED], "tool_choice": "required"}

    def call(args: str) -> str:
        return f"<|tool_call_start|>[note({args})]<|tool_call_end|>"

    assert _accepts(engine, "lfm2_pythonic", body, call("s='abc', tags=['x']"))[0]
    assert _accepts(engine, "lfm2_pythonic", body, call('s="a\\nb", tags=["x", "y"]'))[0]
    for bad in ("s='abcd', tags=['x']", "s='ab', tags=[]", "s='ab', tags=['x', 'y', 'z']"):
        assert not _accepts(engine, "lfm2_pythonic", body, call(bad))[0], bad


def test_a_strict_lfm2_tool_with_a_bound_its_grammar_leaves_out_is_refused(engine) -> None:
    """Numbers' bounds, patterns and formats are not in LFM2's call grammar: a strict tool
    holding one is a 400 naming it (its calls came back with 763763763763763 for a maximum
    of 9); without `strict` the grammar applies what it can."""
    strict = {"type": "function", "function": {"name": "n", "strict": True, "parameters": {
        "type": "object", "properties": {"n": {"type": "integer", "maximum": 9}},
        "required": ["n"], "additionalProperties": False}}}
    body = {"tools": [strict], "tool_choice": "required"}
    with pytest.raises(ConstraintError) as err:
        make_constraint(spec_for_kind("lfm2_pythonic"), constraint_request_from_openai(body),
                        engine)
    assert "`maximum` at parameters.properties.n" in err.value.message
    assert err.value.param == "tools[0].function.parameters"
    loose = {"type": "function", "function": {**strict["function"], "strict": False}}
    assert make_constraint(spec_for_kind("lfm2_pythonic"), constraint_request_from_openai(
        {"tools": [loose], "tool_choice": "required"}), engine) is not None


@pytest.mark.parametrize("choice", ["auto", "required"])
@pytest.mark.parametrize("header", [
    "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>",
    "<|channel|>commentary to=functions.get_weather<|message|>",
    " to=functions.get_weather<|channel|>commentary json<|message|>",
    " to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>",
])
def test_harmony_recipient_after_the_channel_or_in_the_role_header(engine, choice,
                                                                    header) -> None:
    text = header + '{"city": "Paris"}<|call|>'
    assert _accepts(engine, "harmony", _tools(choice), text) == (True, "")
    after_analysis = "<|channel|>analysis<|message|>Look it up.<|end|><|start|>assistant" + text
    assert _accepts(engine, "harmony", _tools(choice), after_analysis) == (True, "")
    wrong = header.replace("get_weather", "get_time") + '{"city": "Paris"}<|call|>'
    assert not _accepts(engine, "harmony", _tools(choice), wrong)[0]


def test_admits_takes_nothing_after_the_stop_token(engine, capfd) -> None:
    """Found probing live: drafts past the end of turn were fed to a terminated matcher,
    which logged a warning for each (16-18 lines a short request)."""
    spec = spec_for_kind("hermes_json")
    c = make_constraint(spec, constraint_request_from_openai(
        {"response_format": {"type": "json_object"}}), engine)
    c.start("")
    brace, close = engine.token_id("{"), engine.token_id("}")
    stop = engine.stop_token_ids[0]
    assert c.admits([brace, close, stop, brace, close]) == 3
    assert c.tokens == [] and c.active
    assert "terminated" not in capfd.readouterr().err
