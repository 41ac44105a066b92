"""ChatStream: deltas, call ids, held-back text, and agreement with parse() for any pieces."""

from __future__ import annotations

import logging
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chat import ChatStream, Delta, FormatKind, compute_deltas, parse, spec_for_kind
from chat.message import ChatMsg, ToolCall
from tests.chat.fixtures import CASES
from tests.chat.support import fold, is_prefix_msg, stream_pieces, without_ids

IDS = [c[0] for c in CASES]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_stream_folds_to_the_parse_for_random_pieces(case) -> None:
    _, kind, prefill, raw, _, _, _, tools, partial = case
    spec = spec_for_kind(kind)
    whole = parse(spec, prefill + raw, partial=partial, tools=tools)
    for seed in range(10):
        stream = ChatStream(spec, prefill=prefill, tools=tools)
        deltas = stream_pieces(stream, raw, random.Random(seed), max_piece=5, final=not partial)
        assert without_ids(fold(deltas)) == whole
        assert without_ids(stream.message) == whole


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(CASES), cuts=st.lists(st.integers(0, 400), max_size=12))
def test_any_split_gives_the_same_result(case, cuts) -> None:
    _, kind, prefill, raw, _, _, _, tools, partial = case
    spec = spec_for_kind(kind)
    text = prefill + raw
    points = sorted({c % (len(text) + 1) for c in cuts})
    stream = ChatStream(spec, tools=tools)
    deltas: list[Delta] = []
    last = 0
    seen = stream.message
    for p in points + [len(text)]:
        deltas += stream.update(text[last:p])
        last = p
        now = stream.message
        assert is_prefix_msg(seen, now) is None
        seen = now
    deltas += stream.update("", final=not partial)
    whole = parse(spec, text, partial=partial, tools=tools)
    assert without_ids(fold(deltas)) == whole


def test_held_back_marker_is_released_at_the_end() -> None:
    stream = ChatStream(spec_for_kind("hermes_json"))
    assert [d.text for d in stream.update("Hello <tool")] == ["Hello"]
    assert stream.update("") == []
    assert [d.text for d in stream.update("", final=True)] == [" <tool"]


def test_trailing_whitespace_waits_for_more_text() -> None:
    stream = ChatStream(spec_for_kind("hermes_json"))
    assert [d.text for d in stream.update("a  ")] == ["a"]
    assert [d.text for d in stream.update("b")] == ["  b"]


def test_call_id_is_stable_and_sent_once() -> None:
    stream = ChatStream(spec_for_kind("hermes_json"))
    deltas = stream.update('<tool_call>{"name": "f", "arguments": {"a": "x')
    first = [d for d in deltas if d.field == "tool_call"]
    assert len(first) == 1 and first[0].name == "f" and first[0].id.startswith("call_")
    assert len(first[0].id) == len("call_") + 24
    more = stream.update('yz"}}</tool_call>', final=True)
    assert [(d.text, d.id, d.name) for d in more] == [('yz"}', "", "")]
    assert stream.message.tool_calls[0].id == first[0].id


def test_second_call_gets_the_next_index() -> None:
    stream = ChatStream(spec_for_kind("lfm2_pythonic"))
    deltas = stream.update("<|tool_call_start|>[f(a=1), g(b='x')]<|tool_call_end|>", final=True)
    calls = [(d.index, d.name) for d in deltas if d.field == "tool_call"]
    assert calls == [(0, "f"), (1, "g")]


def test_update_after_final_is_ignored(caplog) -> None:
    stream = ChatStream(spec_for_kind("hermes_json"))
    stream.update("x", final=True)
    with caplog.at_level(logging.WARNING):
        assert stream.update("more") == []
    assert "after the final update" in caplog.text


def test_compute_deltas_gives_suffixes_and_first_call_delta() -> None:
    prev = ChatMsg(reasoning_content="ab", content="", tool_calls=[
        ToolCall(name="f", arguments='{"a": ')])
    cur = ChatMsg(reasoning_content="abc", content="x", tool_calls=[
        ToolCall(name="f", arguments='{"a": 1}'), ToolCall(name="g", arguments="{")])
    out = compute_deltas(prev, cur)
    assert [(d.field, d.text, d.index, d.name) for d in out] == [
        ("reasoning_content", "c", 0, ""), ("content", "x", 0, ""),
        ("tool_call", "1}", 0, ""), ("tool_call", "{", 1, "g")]
    assert out[3].id.startswith("call_")


def test_compute_deltas_skips_a_field_that_was_rewritten(caplog) -> None:
    with caplog.at_level(logging.WARNING):
        out = compute_deltas(ChatMsg(content="abc"), ChatMsg(content="abd", reasoning_content="r"))
    assert [(d.field, d.text) for d in out] == [("reasoning_content", "r")]
    assert "rewrote" in caplog.text


@pytest.mark.parametrize("kind", ["hermes_json", "qwen_xml", "gemma4", "lfm2_pythonic",
                                  "harmony", "content_only"])
def test_a_continued_turn_keeps_the_leading_space_of_what_follows(kind: str) -> None:
    """A turn the client began ("The cat"): the model's " sat" stays " sat", streamed and
    folded, so the client's text and the reply join as written."""
    stream = ChatStream(spec_for_kind(kind), continuing=True)
    deltas = stream.update(" sat", final=False) + stream.update(" on the mat", final=True)
    assert "".join(d.text for d in deltas if d.field == "content") == " sat on the mat"
    assert stream.message.content == " sat on the mat"
    fresh = ChatStream(spec_for_kind(kind))
    fresh.update(" sat on the mat", final=True)
    assert fresh.message.content == "sat on the mat"  # a new turn: trimmed, as before


@pytest.mark.parametrize("kind,text,cut", [
    # a block begun, its call not named yet: the block is the cut text, however it was split
    (FormatKind.HERMES_JSON, 'Sure. <tool_call>{"name": "get', '<tool_call>{"name": "get'),
    (FormatKind.QWEN_XML, "<tool_call>\n<function=get_wea", "<tool_call>\n<function=get_wea"),
    # the call named: it is in the message, nothing is cut text
    (FormatKind.HERMES_JSON, '<tool_call>{"name": "get_weather", "arguments": {"ci', ""),
    (FormatKind.HERMES_JSON, "Just text", ""),
    (FormatKind.HARMONY, "<|channel|>commentary to=functions.get", ""),
])
def test_a_tool_block_cut_before_its_call_is_named_is_held_as_raw_text(
        kind: FormatKind, text: str, cut: str) -> None:
    for seed in range(5):
        stream = ChatStream(spec_for_kind(kind))
        stream_pieces(stream, text, random.Random(seed), max_piece=4, final=False)
        assert stream.cut_block == cut
        assert not any(c.name for c in stream.message.tool_calls) or not cut
    stream.update("", final=True)
    assert stream.cut_block == ""  # a turn that ended: the parse shows everything
