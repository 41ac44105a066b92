"""Anthropic's replies without Ray: the worker's events to content blocks and to the
stream's events in Anthropic's order; a client folding the stream as the SDK does gets the
non-streamed message."""

from __future__ import annotations

import json

import pytest

from actors.events import Deltas, Failed, Finished, Usage
from chat import Delta
from deployments.anthropic.reply import MessageBuilder, MessagesReply, sse
from deployments.errors import ApiError

BASE = {"id": "msg_1", "model": "m"}


def _events(*deltas: Delta, reason: str = "stop", stop: str | None = None) -> list:
    return [Deltas(index=0, deltas=list(deltas)),
            Finished(index=0, finish_reason=reason, completion_tokens=7, stop=stop),
            Usage(prompt_tokens=20, completion_tokens=7, cached_tokens=16)]


THINK_TEXT_CALL = _events(
    Delta(field="reasoning_content", text="Let me "), Delta(field="reasoning_content",
                                                            text="check."),
    Delta(field="content", text="Sure."),
    Delta(field="tool_call", text='{"city": ', id="call_a", name="get_weather"),
    Delta(field="tool_call", text='"Oslo"}'),
    Delta(field="tool_call", text="{}", index=1, id="call_b", name="light"),
    reason="tool_calls")


def _fold_like_the_sdk(events: list[dict]) -> dict:
    """What anthropic's MessageStream accumulates from the events (its rules)."""
    msg = None
    partial: dict[int, str] = {}
    for ev in events:
        kind = ev["type"]
        if kind == "message_start":
            msg = json.loads(json.dumps(ev["message"]))
        elif kind == "content_block_start":
            msg["content"].append(dict(ev["content_block"]))
        elif kind == "content_block_delta":
            block, d = msg["content"][ev["index"]], ev["delta"]
            if d["type"] == "text_delta":
                block["text"] += d["text"]
            elif d["type"] == "thinking_delta":
                block["thinking"] += d["thinking"]
            elif d["type"] == "input_json_delta":
                partial[ev["index"]] = partial.get(ev["index"], "") + d["partial_json"]
                block["input"] = json.loads(partial[ev["index"]]) \
                    if partial[ev["index"]].endswith("}") else block["input"]
        elif kind == "message_delta":
            msg.update(ev["delta"])
            msg["usage"].update(ev["usage"])
    return msg


def test_events_become_blocks_in_anthropics_order() -> None:
    b = MessageBuilder(BASE, [])
    events = b.start() + b.add(THINK_TEXT_CALL)
    assert [(e["type"], e.get("index")) for e in events] == [
        ("message_start", None),
        ("content_block_start", 0), ("content_block_delta", 0), ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1), ("content_block_delta", 1), ("content_block_stop", 1),
        ("content_block_start", 2), ("content_block_delta", 2), ("content_block_delta", 2),
        ("content_block_stop", 2),
        ("content_block_start", 3), ("content_block_delta", 3), ("content_block_stop", 3),
        ("message_delta", None), ("message_stop", None)]
    assert events[5]["content_block"] == {"type": "text", "text": ""}
    assert events[8]["content_block"] == {"type": "tool_use", "id": "call_a",
                                          "name": "get_weather", "input": {}}
    assert events[9]["delta"] == {"type": "input_json_delta", "partial_json": '{"city": '}
    assert events[-2]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    message = b.message()
    assert message["content"] == [
        {"type": "thinking", "thinking": "Let me check.", "signature": ""},
        {"type": "text", "text": "Sure."},
        {"type": "tool_use", "id": "call_a", "name": "get_weather", "input": {"city": "Oslo"}},
        {"type": "tool_use", "id": "call_b", "name": "light", "input": {}}]
    assert message["usage"] == {"input_tokens": 4, "output_tokens": 7,
                                "cache_creation_input_tokens": 0,
                                "cache_read_input_tokens": 16}
    assert _fold_like_the_sdk(events) == message


@pytest.mark.parametrize("finished,stops,expect", [
    (dict(reason="stop"), [], ("end_turn", None)),
    (dict(reason="length"), [], ("max_tokens", None)),
    (dict(reason="tool_calls"), [], ("tool_use", None)),
    (dict(reason="stop", stop="END"), ["END"], ("stop_sequence", "END")),
    # a stop string of the model's format, not the request's
    (dict(reason="stop", stop="<|im_end|>"), ["END"], ("end_turn", None)),
])
def test_stop_reasons(finished: dict, stops: list, expect: tuple) -> None:
    b = MessageBuilder(BASE, stops)
    b.add(_events(Delta(field="content", text="x"), **finished))
    m = b.message()
    assert (m["stop_reason"], m["stop_sequence"]) == expect


def test_omitted_thinking_keeps_the_block_without_its_text() -> None:
    b = MessageBuilder(BASE, [], omit_thinking=True)
    events = b.add(_events(Delta(field="reasoning_content", text="secret"),
                           Delta(field="content", text="Hi")))
    assert b.message()["content"][0] == {"type": "thinking", "thinking": "", "signature": ""}
    assert "secret" not in json.dumps(events)


def test_a_call_cut_by_max_tokens_has_an_empty_input() -> None:
    b = MessageBuilder(BASE, [])
    b.add(_events(Delta(field="tool_call", text='{"city": "Os', id="c", name="f"),
                  reason="length"))
    m = b.message()
    assert m["stop_reason"] == "max_tokens" and m["content"][0]["input"] == {}


def test_the_reply_streams_sse_with_event_names_and_folds_the_same_message() -> None:
    streamed = MessagesReply(MessageBuilder(BASE, []))
    body = streamed.lead() + streamed.render(THINK_TEXT_CALL) + streamed.tail()
    frames = [f for f in body.decode().split("\n\n") if f]
    names = [f.split("\n")[0] for f in frames]
    data = [json.loads(f.split("\n")[1][len("data: "):]) for f in frames]
    assert names == [f"event: {d['type']}" for d in data]
    whole = MessagesReply(MessageBuilder(BASE, []))
    whole.fold(THINK_TEXT_CALL)
    assert json.loads(whole.answer().body) == _fold_like_the_sdk(data)


def test_a_failure_is_an_error_event_or_an_error() -> None:
    reply = MessagesReply(MessageBuilder(BASE, []))
    out = reply.render([Deltas(index=0, deltas=[Delta(field="content", text="a")]),
                        Failed(message="boom")])
    assert out.endswith(sse([{"type": "error", "error": {"type": "api_error",
                                                        "message": "boom"}}]))
    reply.fold([Failed(message="boom")])
    with pytest.raises(ApiError):
        reply.answer()
    assert reply.broken().startswith(b"event: error\n")
