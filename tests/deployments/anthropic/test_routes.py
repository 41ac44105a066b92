"""Anthropic's routes without Ray: the real app in front of an Ingress whose worker is the
fake of tests/deployments/test_ingress.py. What an anthropic client sees: messages folded
or streamed, count_tokens counted by the worker, the API key as x-api-key, and errors in
Anthropic's shape and statuses (529 for back-pressure); through the official SDK: the
prompt's tokens at message_start, `toolu_` ids that round-trip, a request id on every
answer."""

from __future__ import annotations

import json
import re

import pytest

from actors.events import Accepted, ChatGenerate, Deltas, Finished, Rejected, Usage
from chat import Delta
from deployments.anthropic.reply import PING
from deployments.anthropic.request import messages_call
from deployments.ingress import Ingress
from tests.deployments.anthropic.support import sdk_for
from tests.deployments.test_ingress import (
    BackPressureError,
    FakeStream,
    FakeWorker,
    _client,
    _Method,
    _reply,
)

BODY = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}]}


class CountingWorker(FakeWorker):
    """A FakeWorker that also counts prompts (`first`: what its count_tokens answers)."""

    def __init__(self, *plays: FakeStream, first=None) -> None:
        super().__init__(*plays)
        self.first = first
        self.counted: list[ChatGenerate] = []
        self.count_tokens = _Method(self._count)

    async def _count(self, greq: ChatGenerate):
        self.counted.append(greq)
        return self.first


def test_a_message_whole_and_streamed() -> None:
    worker = FakeWorker(FakeStream(_reply()), FakeStream(_reply()))
    client, _ = _client(worker)
    r = client.post("/v1/messages", json=BODY, headers={"anthropic-version": "2023-06-01"})
    assert r.status_code == 200
    body = r.json()
    assert body["content"] == [{"type": "text", "text": "Hello"}]
    assert body["stop_reason"] == "end_turn" and body["usage"]["output_tokens"] == 1
    r = client.post("/v1/messages", json={**BODY, "stream": True})
    assert r.headers["content-type"].startswith("text/event-stream")
    names = [ln[len("event: "):] for ln in r.text.splitlines() if ln.startswith("event: ")]
    assert names == ["message_start", "content_block_start", "content_block_delta",
                     "content_block_stop", "message_delta", "message_stop"]
    assert worker.requests[1].max_tokens == 5


def test_a_messages_call_sends_pings_while_it_waits() -> None:
    call = messages_call(json.dumps({**BODY, "stream": True}).encode(),
                         Ingress({"m": FakeWorker()}, {}))
    assert call.keep_alive == PING and call.stream
    assert PING.startswith(b"event: ping\ndata: ")
    assert json.loads(PING.split(b"data: ")[1]) == {"type": "ping"}


def test_count_tokens_is_counted_by_a_worker() -> None:
    worker = CountingWorker(first=Accepted(request_id="r", model="m", prompt_tokens=42))
    client, _ = _client(worker)
    tool = {"name": "f", "input_schema": {"type": "object"}}
    body = {"model": "m", "messages": BODY["messages"], "system": "Be brief.", "tools": [tool]}
    r = client.post("/v1/messages/count_tokens", json=body)
    assert r.status_code == 200 and r.json() == {"input_tokens": 42}
    [greq] = worker.counted
    assert greq.messages[0] == {"role": "system", "content": "Be brief."}
    assert greq.tools[0]["function"]["name"] == "f" and worker.requests == []
    worker.first = Rejected(status=400, message="The template failed.", param="messages")
    r = client.post("/v1/messages/count_tokens", json=body)
    assert r.status_code == 400
    assert r.json() == {"type": "error", "error": {"type": "invalid_request_error",
                                                   "message": "messages: The template failed."},
                        "request_id": r.headers["request-id"]}
    r = client.post("/v1/messages/count_tokens", json={**body, "model": "nope"})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


def test_refusals_and_back_pressure_are_anthropic_errors() -> None:
    too_long = [[Rejected(status=400, message="This model's maximum context length is 8 "
                          "tokens; the prompt has 36.", param="messages",
                          code="context_length_exceeded")]]
    client, _ = _client(FakeWorker(FakeStream(too_long),
                                   FakeStream([], {0: BackPressureError()})))
    r = client.post("/v1/messages", json={**BODY, "stream": True})
    assert r.status_code == 400  # before any byte of a stream
    # Anthropic's words, whose numbers Claude Code reads (its compaction's pattern)
    message = r.json()["error"]["message"]
    assert message == "prompt is too long: 36 tokens > 8 maximum"
    assert re.search(r"prompt is too long[^0-9]*(\d+)\s*tokens?\s*>\s*(\d+)", message, re.I)
    r = client.post("/v1/messages", json=BODY)
    assert r.status_code == 529 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["type"] == "overloaded_error"


def test_the_api_key_as_x_api_key_or_bearer_and_the_size_limit() -> None:
    worker = FakeWorker(FakeStream(_reply()), FakeStream(_reply()))
    client, _ = _client(worker, api_key="k", max_request_bytes=1000)
    r = client.post("/v1/messages", json=BODY)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = client.post("/v1/messages", json=BODY, headers={"x-api-key": "wrong"})
    assert r.status_code == 401
    assert client.post("/v1/messages", json=BODY, headers={"x-api-key": "k"}).status_code == 200
    r = client.post("/v1/messages", json=BODY, headers={"Authorization": "Bearer k"})
    assert r.status_code == 200
    r = client.get("/v1/models", headers={"x-api-key": "k"})  # every route takes it
    assert r.status_code == 200
    big = {**BODY, "messages": [{"role": "user", "content": "x" * 2000}]}
    r = client.post("/v1/messages", json=big, headers={"x-api-key": "k"})
    assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"


def test_bad_input_and_unknown_paths_never_reach_a_worker() -> None:
    worker = FakeWorker()
    client, _ = _client(worker)
    r = client.post("/v1/messages", content=b"{not json")
    assert r.status_code == 400 and r.json()["type"] == "error"
    r = client.post("/v1/messages", json={**BODY, "model": "nope"})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = client.get("/v1/messages")
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"
    assert worker.requests == []


CACHED = [[Accepted(request_id="r", model="m", prompt_tokens=12),
           Deltas(index=0, deltas=[Delta(field="content", text="Hello")])],
          [Finished(index=0, finish_reason="stop", completion_tokens=1)],
          [Usage(prompt_tokens=12, completion_tokens=1, cached_tokens=8)]]


def test_the_sdk_reads_the_prompts_tokens_at_message_start() -> None:
    client, _ = _client(FakeWorker(FakeStream(CACHED)))
    with sdk_for(client).messages.stream(**BODY) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert events[0].type == "message_start"
    assert events[0].message.usage.input_tokens == 12
    [delta] = [e for e in events if e.type == "message_delta"]
    assert (delta.usage.input_tokens, delta.usage.cache_read_input_tokens) == (4, 8)
    assert (final.usage.input_tokens, final.usage.cache_read_input_tokens,
            final.usage.output_tokens) == (4, 8, 1)
    assert final.content[0].text == "Hello"


def _call(call_id: str) -> list[list]:
    return [[Accepted(request_id="r", model="m", prompt_tokens=3),
             Deltas(index=0, deltas=[Delta(field="tool_call", text='{"city": "Oslo"}',
                                           id=call_id, name="get_weather")])],
            [Finished(index=0, finish_reason="tool_calls", completion_tokens=4)],
            [Usage(prompt_tokens=3, completion_tokens=4)]]


WEATHER = {"name": "get_weather", "input_schema": {"type": "object"}}


def test_tool_use_ids_are_anthropics_and_come_back_in_tool_results() -> None:
    worker = FakeWorker(FakeStream(_call("call_abc")), FakeStream(_reply("Sunny.")))
    client, _ = _client(worker)
    ac = sdk_for(client)
    r = ac.messages.create(**BODY, tools=[WEATHER])
    [call] = r.content
    assert r.stop_reason == "tool_use" and call.id == "toolu_abc"
    # an earlier turn's call, from a client that kept a `call_` id, goes back as well
    earlier = [{"role": "assistant", "content": [{"type": "tool_use", "id": "call_old",
                                                  "name": "get_weather", "input": {}}]},
               {"role": "user", "content": [{"type": "tool_result",
                                             "tool_use_id": "call_old", "content": "Rain."}]}]
    turns = BODY["messages"] + earlier + [
        {"role": "assistant", "content": [b.model_dump() for b in r.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                      "content": "Sunny."}]}]
    follow = ac.messages.create(model="m", max_tokens=5, messages=turns, tools=[WEATHER])
    assert follow.content[0].text == "Sunny."
    sent = worker.requests[1].messages
    assert [m["tool_calls"][0]["id"] for m in sent if m.get("tool_calls")] \
        == ["call_old", "toolu_abc"]
    assert [m["tool_call_id"] for m in sent if m["role"] == "tool"] \
        == ["call_old", "toolu_abc"]


def test_every_answer_and_error_has_a_request_id() -> None:
    anthropic = pytest.importorskip("anthropic")
    worker = CountingWorker(FakeStream(_reply()), FakeStream(_reply()),
                            FakeStream([], {0: BackPressureError()}),
                            first=Accepted(request_id="r", model="m", prompt_tokens=42))
    client, _ = _client(worker)
    ac = sdk_for(client)
    message = ac.messages.create(**BODY)
    assert message._request_id == "req_" + message.id.removeprefix("msg_")
    with ac.messages.stream(**BODY) as stream:
        final = stream.get_final_message()
    assert stream.request_id == "req_" + final.id.removeprefix("msg_")
    count = ac.messages.count_tokens(model="m", messages=BODY["messages"])
    assert count.input_tokens == 42 and count._request_id.startswith("req_")
    for make, kind in ((lambda: ac.messages.create(**{**BODY, "model": "nope"}),
                        anthropic.NotFoundError),
                       (lambda: ac.messages.create(**BODY), anthropic.InternalServerError)):
        with pytest.raises(kind) as err:
            make()
        assert err.value.request_id.startswith("req_")
        assert err.value.body["request_id"] == err.value.request_id
    assert err.value.status_code == 529


def test_a_strict_tools_refusal_by_the_worker_names_anthropics_field() -> None:
    """A strict tool whose schema the grammar cannot take is refused where the constraint
    is made (the worker), in chat's names: the answer says Anthropic's."""
    refused = [[Rejected(status=400, message="Tool 'f' is strict: the pattern does not "
                         "compile.", param="tools[1].function.parameters")]]
    client, _ = _client(FakeWorker(FakeStream(refused)))
    tools = [{"name": n, "input_schema": {"type": "object"}} for n in ("e", "f")]
    r = client.post("/v1/messages", json={**BODY, "tools": tools})
    assert r.status_code == 400
    assert "tools[1].input_schema" in r.json()["error"]["message"]
