"""parse() on our own outputs for every format, and the prefix property at every cut."""

from __future__ import annotations

import json

import pytest

from chat import ChatMsg, parse, spec_for_kind
from tests.chat.fixtures import CASES, WEATHER
from tests.chat.support import is_prefix_msg

IDS = [c[0] for c in CASES]


def _check(msg: ChatMsg, reasoning: str, content: str, calls: list) -> None:
    assert msg.reasoning_content == reasoning
    assert msg.content == content
    assert [c.name for c in msg.tool_calls] == [name for name, _ in calls]
    for got, (_, args) in zip(msg.tool_calls, calls):
        if isinstance(args, str):  # a partial call: the argument text so far
            assert got.arguments == args
        else:
            assert json.loads(got.arguments) == args


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_parse_gives_expected_fields(case) -> None:
    _, kind, prefill, raw, reasoning, content, calls, tools, partial = case
    msg = parse(spec_for_kind(kind), prefill + raw, partial=partial, tools=tools)
    _check(msg, reasoning, content, calls)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_every_partial_parse_is_a_prefix_of_the_final_parse(case) -> None:
    _, kind, prefill, raw, _, _, _, tools, partial = case
    spec = spec_for_kind(kind)
    text = prefill + raw
    final = parse(spec, text, partial=partial, tools=tools)
    for cut in range(len(text) + 1):
        part = parse(spec, text[:cut], partial=True, tools=tools)
        why = is_prefix_msg(part, final)
        assert why is None, f"cut {cut}: {why}"


def test_arguments_stream_as_canonical_json() -> None:
    spec = spec_for_kind("hermes_json")
    text = '<tool_call>{"name":"f","arguments":{"a":"x y","b":[1,2]}}</tool_call>'
    msg = parse(spec, text, partial=False)
    assert msg.tool_calls[0].arguments == '{"a": "x y", "b": [1, 2]}'
    part = parse(spec, text[: text.index("y")], partial=True)
    assert part.tool_calls[0].arguments == '{"a": "x '


def test_bare_scalars_wait_until_they_end() -> None:
    spec = spec_for_kind("hermes_json")
    head = '<tool_call>{"name": "f", "arguments": {"a": tru'
    assert parse(spec, head, partial=True).tool_calls[0].arguments == '{"a": '
    assert parse(spec, head + "e}", partial=True).tool_calls[0].arguments == '{"a": true}'


@pytest.mark.parametrize("kind,raw", [
    ("hermes_json", '<tool_call>{"name": "f", "arguments": {}}</tool_call>'),
    ("qwen_xml", "<tool_call>\n<function=f>\n</function>\n</tool_call>"),
    ("gemma4", "<|tool_call>call:f{}<tool_call|>"),
    ("lfm2_pythonic", "<|tool_call_start|>[f()]<|tool_call_end|>"),
])
def test_tool_markup_stays_content_without_tool_parsing(kind: str, raw: str) -> None:
    msg = parse(spec_for_kind(kind), raw, partial=False, parse_tool_calls=False)
    assert msg.tool_calls == []
    assert msg.content == raw


def test_harmony_call_body_is_content_without_tool_parsing() -> None:
    raw = '<|channel|>commentary to=functions.f<|message|>{"a": 1}<|call|>'
    msg = parse(spec_for_kind("harmony"), "assistant" + raw, partial=False,
                parse_tool_calls=False)
    assert msg.tool_calls == [] and msg.content == '{"a": 1}'


def test_thinking_off_spec_leaves_think_tags_in_content() -> None:
    spec = spec_for_kind("hermes_json", reasoning=False)
    assert parse(spec, "<think>x</think>y", partial=False).content == "<think>x</think>y"


@pytest.mark.parametrize("kind", ["hermes_json", "qwen_xml", "lfm2_pythonic"])
@pytest.mark.parametrize("answer", [
    'Wrap it in {o} and {c}: {o}plan{c}.',  # an answer about the markers
    '{{"html": "{o}x{c}"}}',  # a JSON string holding them (a constraint lets it through)
    'if tag == "{o}":',  # code, an opener alone
])
@pytest.mark.parametrize("reasoned", [False, True])
def test_reasoning_markers_in_the_answer_are_its_text(kind: str, answer: str,
                                                      reasoned: bool) -> None:
    """Reasoning comes first: once it closed, or once the answer began, its markers are
    the answer's text, whole and in place, streamed as they are read (they cut the answer
    and moved its pieces into reasoning). A closer after the answer with no opener before
    it stays dropped. (Gemma 4's channel markers are control tokens, its thought blocks
    read anywhere: the corpus's cases from llama.cpp.)"""
    spec = spec_for_kind(kind)
    o, c = spec.reasoning_start, spec.reasoning_end
    text = answer.format(o=o, c=c)
    raw = (f"{o}think{c}" if reasoned else "") + text
    final = parse(spec, raw, partial=False)
    assert (final.reasoning_content, final.content) == ("think" if reasoned else "", text)
    for cut in range(len(raw) + 1):
        assert is_prefix_msg(parse(spec, raw[:cut], partial=True), final) is None
    if text.count(o) == text.count(c):  # nothing open: a closer more is a stray one
        assert parse(spec, raw + c, partial=False).content == text


def test_a_llama_turn_that_ends_inside_its_second_call_keeps_the_first() -> None:
    """A turn that ends (not cut by a limit: `partial` is False) inside a bare call: the
    calls before it stay calls, the unfinished one is content (as an unfinished block of
    any format is); the whole block fell back before."""
    text = ('{"name": "get_weather", "parameters": {}}; '
            '{"name": "get_weather", "parameters": {"city": "Pa')
    msg = parse(spec_for_kind("llama3_json"), text, partial=False, tools=WEATHER)
    assert [(c.name, c.arguments) for c in msg.tool_calls] == [("get_weather", "{}")]
    assert msg.content == '{"name": "get_weather", "parameters": {"city": "Pa'


def test_a_bounded_string_of_qwen_xml_is_its_value_without_the_grammars_whitespace() -> None:
    """Found probing live: Qwen3.5 under a strict enum wrote `<parameter=city>Oslo
    </parameter>` (the grammar lets whitespace in around a value) and the call came back
    with "Oslo ", outside the enum; free text keeps its own (one newline each side is the
    template's)."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {
            "city": {"type": "string", "enum": ["Oslo", "Paris"]},
            "code": {"type": "string", "maxLength": 5},
            "body": {"type": "string"}}}}}]
    text = ("<tool_call>\n<function=f>\n<parameter=city>Oslo \n</parameter>\n"
            "<parameter=code>\r\rab12\n\n\n</parameter>\n"
            "<parameter=body>\n  x = 1\n\n</parameter>\n</function>\n</tool_call>")
    spec = spec_for_kind("qwen_xml")
    msg = parse(spec, text, partial=False, tools=tools)
    assert json.loads(msg.tool_calls[0].arguments) == {"city": "Oslo", "code": "ab12",
                                                      "body": "  x = 1\n"}
    for cut in range(len(text)):
        part = parse(spec, text[:cut], partial=True, tools=tools)
        assert is_prefix_msg(part, msg) is None, cut
