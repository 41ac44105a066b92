"""Anthropic's replies without Ray: the worker's events to content blocks and to the
stream's events in Anthropic's order; a client folding the stream as the SDK does gets the
non-streamed message; the stream's bytes as the official SDK reads them (usage at
message_start and message_delta, a call cut by max_tokens, pings before message_start)."""

from __future__ import annotations

import json

import pytest

from actors.events import Accepted, Deltas, Failed, Finished, Usage
from chat import Delta
from deployments.anthropic.reply import PING, MessageBuilder, MessagesReply, sse
from deployments.errors import ApiError
from tests.deployments.anthropic.support import response, sdk

BASE = {"id": "msg_1", "model": "m"}
ACCEPTED = Accepted(request_id="1", model="m", prompt_tokens=20, cached_tokens=16)


def _events(*deltas: Delta, reason: str = "stop", stop: str | None = None) -> list:
    return [ACCEPTED, Deltas(index=0, deltas=list(deltas)),
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
    events = b.add(THINK_TEXT_CALL)
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
    assert events[8]["content_block"] == {"type": "tool_use", "id": "toolu_a",
                                          "name": "get_weather", "input": {}}
    assert events[9]["delta"] == {"type": "input_json_delta", "partial_json": '{"city": '}
    assert events[-2]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    message = b.message()
    assert message["content"] == [
        {"type": "thinking", "thinking": "Let me check.", "signature": ""},
        {"type": "text", "text": "Sure."},
        {"type": "tool_use", "id": "toolu_a", "name": "get_weather",
         "input": {"city": "Oslo"}},
        {"type": "tool_use", "id": "toolu_b", "name": "light", "input": {}}]
    assert message["usage"] == {"input_tokens": 4, "output_tokens": 7,
                                "cache_creation_input_tokens": 0,
                                "cache_read_input_tokens": 16, "service_tier": "standard"}
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
    late = MessagesReply(MessageBuilder(BASE, []))  # refused after a late stream started
    assert late.render([Failed(message="no")]) == sse([{"type": "error", "error": {
        "type": "api_error", "message": "no"}}])


# -- what the official SDK reads from the stream's bytes ----------------------------------
def _sdk(body: bytes, whole: dict | None = None):
    """An anthropic client whose server answers `body` as the stream (and `whole` as a
    non-streamed reply)."""
    def answer(request):
        if json.loads(request.read()).get("stream"):
            return response(200, content=body,
                            headers={"content-type": "text/event-stream"})
        return response(200, json=whole)

    return sdk(answer)


ASK = dict(model="m", max_tokens=5, messages=[{"role": "user", "content": "Hi"}])


@pytest.mark.parametrize("late", [False, True], ids=["prompt", "late_first_event"])
def test_message_start_carries_the_prompts_tokens_and_message_delta_the_split(
        late: bool) -> None:
    reply = MessagesReply(MessageBuilder(BASE, []))
    # a stream whose first event is late: the lead, pings while it waits, then the events
    body = reply.lead() + (PING * 2 if late else b"") \
        + reply.render(_events(Delta(field="content", text="Hi")))
    with _sdk(body).messages.stream(**ASK) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert events[0].type == "message_start"
    start = events[0].message.usage  # the prompt's 20 tokens: 4 computed, 16 cached
    assert (start.input_tokens, start.cache_read_input_tokens, start.output_tokens) == (4, 16, 0)
    [delta] = [e for e in events if e.type == "message_delta"]
    assert (delta.usage.input_tokens, delta.usage.cache_read_input_tokens,
            delta.usage.output_tokens) == (4, 16, 7)
    assert (final.usage.input_tokens, final.usage.cache_read_input_tokens) == (4, 16)


@pytest.mark.parametrize("cut,expect", [
    ('{"city": "Os', {}),
    ('{"days": 3, "city": "Os', {"days": 3}),
    ('{"days": 3, "where": {"city": "Oslo", "near": ["a", "b', {
        "days": 3, "where": {"city": "Oslo", "near": ["a"]}}),
])
def test_a_call_cut_by_max_tokens_keeps_what_was_whole_as_the_sdks_stream_does(
        cut: str, expect: dict) -> None:
    events = _events(Delta(field="tool_call", text=cut, id="call_c", name="f"),
                     reason="length")
    streamed = MessagesReply(MessageBuilder(BASE, []))
    body = streamed.lead() + streamed.render(events)
    whole = MessagesReply(MessageBuilder(BASE, []))
    whole.fold(events)
    message = json.loads(whole.answer().body)
    client = _sdk(body, message)
    with client.messages.stream(**ASK) as stream:
        final = stream.get_final_message()
    created = client.messages.create(**ASK)
    assert created.stop_reason == final.stop_reason == "max_tokens"
    [block] = created.content
    assert block.type == "tool_use" and block.id == "toolu_c" and block.input == expect
    assert final.content == created.content


def test_every_answer_has_a_request_id() -> None:
    reply = MessagesReply(MessageBuilder({"id": "msg_abc", "model": "m"}, []))
    assert reply.headers["request-id"] == "req_abc"
    reply.fold(_events(Delta(field="content", text="Hi")))
    assert reply.answer().headers["request-id"] == "req_abc"
    failed = MessagesReply(MessageBuilder({"id": "msg_abc", "model": "m"}, []))
    failed.fold([ACCEPTED, Failed(message="boom")])
    with pytest.raises(ApiError) as err:
        failed.answer()
    assert err.value.headers["request-id"] == "req_abc"
