"""Malformed and truncated outputs: the parser never raises, never loses agreement between
streamed and non-streamed results, and text fields only ever grow."""

from __future__ import annotations

import logging

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from chat import ChatStream, FormatKind, parse, spec_for_kind
from tests.chat.support import fold, is_prefix_msg, without_ids

FRAGMENTS = {
    "hermes_json": ["<think>", "</think>", "<tool_call>", "</tool_call>", '{"name": "f", ',
                    '"arguments": ', '{"a": ', '"x', '"', "1", "}", "]", "[", "\\", "\\u12",
                    "true", ",", " ", "\n"],
    "qwen_xml": ["<think>", "</think>", "<tool_call>", "</tool_call>", "<function=f>",
                 "</function>", "<parameter=a>", "</parameter>", "\n", "x", "<", "1"],
    "gemma4": ["<|channel>", "thought", "<channel|>", "<|tool_call>", "call:f", "{", "}",
               "<tool_call|>", '<|"|>', "a:", "1", ",", "[", "]", "<|tool_response>", "\n"],
    "lfm2_pythonic": ["<think>", "</think>", "<|tool_call_start|>", "<|tool_call_end|>", "[",
                      "]", "f(", ")", "a=", "'x", "'", '"', "1", ",", "{", "}", ":", "None",
                      "b'", "\\", " "],
    "harmony": ["<|start|>", "assistant", "<|channel|>", "analysis", "final", "commentary",
                " to=functions.f", " to=python", "<|constrain|>json", "<|message|>", "<|end|>",
                "<|call|>", "<|return|>", '{"a": 1}', "{", "text", " "],
    "mistral_json": ["[TOOL_CALLS]", "[", "]", '{"name": "f", ', '"arguments": ', '{"a": ',
                     '"x', '"', "1", "}", ",", " ", "<think>", "</think>", "\\"],
    "mistral_args": ["[TOOL_CALLS]", "f", "[ARGS]", "[CALL_ID]", "abc123xyz", "[AR", '{"a": ',
                     '"x', '"', "1", "}", "{", " ", "<think>", "</think>"],
    "llama3_json": ["<|python_tag|>", '{"name": ', '"f"', ", ", '"parameters": ', '"type": ',
                    '"function"', '{"a": ', '"x', '"', "1", "}", ";", " ", "\n", "{", "text"],
    "content_only": ["<think>", "</think>", "text", " ", "\n"],
}


def _texts(kind: str):
    return st.lists(st.sampled_from(FRAGMENTS[kind]) | st.text(max_size=3),
                    max_size=25).map("".join)


@pytest.mark.parametrize("kind", [k.value for k in FormatKind])
def test_random_markup_never_breaks_the_parser(kind: str, caplog) -> None:
    spec = spec_for_kind(kind)

    @settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(text=_texts(kind), split=st.integers(0, 100), partial=st.booleans())
    def run(text: str, split: int, partial: bool) -> None:
        whole = parse(spec, text, partial=partial)
        cut = split % (len(text) + 1)
        stream = ChatStream(spec)
        deltas = stream.update(text[:cut])
        middle = stream.message
        deltas += stream.update(text[cut:])
        deltas += stream.update("", final=not partial)
        assert without_ids(stream.message) == whole
        folded = without_ids(fold(deltas))
        assert folded.reasoning_content == whole.reasoning_content
        assert folded.content == whole.content
        # calls may be taken back (a block that stops parsing); text only grows
        assert is_prefix_msg(replace(middle, tool_calls=[]), replace(whole, tool_calls=[])) is None

    with caplog.at_level(logging.ERROR):
        run()
    assert "chat parser failed" not in caplog.text


@pytest.mark.parametrize("kind", [k.value for k in FormatKind])
def test_no_text_is_lost_from_plain_output(kind: str) -> None:
    spec = spec_for_kind(kind, reasoning=False)
    text = "A plain answer, with [brackets] and {braces} and <angles>."
    assert parse(spec, text, partial=False).content == text
