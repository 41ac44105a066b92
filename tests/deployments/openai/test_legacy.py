"""Legacy function calling on /v1/chat/completions (`functions`, `function_call`, the
`function` role): the worker gets a tools request, and the answer is read by the openai SDK's
own types as a legacy answer (`message.function_call`, `delta.function_call`,
`finish_reason` "function_call"), streamed or not. Without Ray (tests/deployments/
test_ingress.py's fake worker)."""

from __future__ import annotations

import json

import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from actors.events import Accepted, ChatGenerate, Deltas, Finished, Usage
from chat import ChatMsg, Delta, ToolCall
from tests.deployments.test_ingress import FakeStream, FakeWorker, _client

WEATHER = {"name": "get_weather", "description": "Weather of a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}
ARGS = '{"city": "Oslo"}'


def _call_reply() -> FakeStream:
    call = ToolCall(name="get_weather", arguments=ARGS, id="call_x")
    return FakeStream([
        [Accepted(request_id="r", model="m", prompt_tokens=9),
         Deltas(index=0, deltas=[Delta(field="tool_call", text='{"city": ', index=0,
                                       id="call_x", name="get_weather")])],
        [Deltas(index=0, deltas=[Delta(field="tool_call", text='"Oslo"}', index=0)])],
        [Finished(index=0, finish_reason="tool_calls", completion_tokens=6,
                  message=ChatMsg(tool_calls=[call]))],
        [Usage(prompt_tokens=9, completion_tokens=6)]])


def test_functions_become_tools_and_the_history_tool_calls() -> None:
    worker = FakeWorker(_call_reply())
    client, _ = _client(worker)
    r = client.post("/v1/chat/completions", json={
        "model": "m", "functions": [WEATHER], "function_call": {"name": "get_weather"},
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None,
             "function_call": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"role": "function", "name": "get_weather", "content": "sunny"},
            {"role": "user", "content": "And Oslo?"}]})
    assert r.status_code == 200, r.text
    greq = worker.requests[0]
    assert isinstance(greq, ChatGenerate)
    c = greq.constraint
    assert [t.name for t in c.tools] == ["get_weather"] and c.tool_choice == "required"
    assert not c.parallel_tool_calls  # a legacy answer holds one call
    call = greq.messages[1]["tool_calls"][0]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert greq.messages[2] == {"role": "tool", "name": "get_weather", "content": "sunny",
                                "tool_call_id": call["id"]}
    reply = ChatCompletion.model_validate(r.json())
    choice = reply.choices[0]
    assert choice.finish_reason == "function_call" and choice.message.tool_calls is None
    assert (choice.message.function_call.name, choice.message.function_call.arguments) == \
        ("get_weather", ARGS)


def test_a_streamed_legacy_call_is_function_call_deltas() -> None:
    client, _ = _client(FakeWorker(_call_reply()))
    r = client.post("/v1/chat/completions", json={
        "model": "m", "stream": True, "functions": [WEATHER],
        "messages": [{"role": "user", "content": "Weather in Oslo?"}]})
    chunks = [ChatCompletionChunk.model_validate(json.loads(line[6:]))
              for line in r.text.splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert all(d.tool_calls is None for d in deltas)
    calls = [d.function_call for d in deltas if d.function_call is not None]
    assert calls[0].name == "get_weather" and all(f.name is None for f in calls[1:])
    assert "".join(f.arguments for f in calls) == ARGS
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "function_call"


@pytest.mark.parametrize("extra,param", [
    ({"tools": [{"type": "function", "function": WEATHER}]}, "functions"),
    ({"function_call": "always"}, "function_call"),
    ({"function_call": "auto", "tool_choice": "auto"}, "function_call"),
])
def test_what_legacy_calling_cannot_be_is_a_400_naming_it(extra: dict, param: str) -> None:
    worker = FakeWorker()
    client, _ = _client(worker)
    r = client.post("/v1/chat/completions", json={
        "model": "m", "functions": [WEATHER], **extra,
        "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == param
    assert worker.requests == []


def test_a_legacy_history_with_todays_tools_gets_todays_answer() -> None:
    """Function results in the history, tools in the request: the history is read, the
    answer is tool_calls (every call, not the first alone)."""
    worker = FakeWorker(_call_reply())
    client, _ = _client(worker)
    r = client.post("/v1/chat/completions", json={
        "model": "m", "tools": [{"type": "function", "function": WEATHER}], "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None,
             "function_call": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"role": "function", "name": "get_weather", "content": "sunny"},
            {"role": "user", "content": "And Oslo?"}]})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and "function_call" not in choice["message"]
    assert worker.requests[0].messages[2]["role"] == "tool"


def test_a_body_that_only_mentions_functions_is_an_ordinary_request() -> None:
    """A user's text that reads like a legacy field is text: the answer keeps tool_calls'
    shape (and no tools are made up)."""
    worker = FakeWorker(_call_reply())
    client, _ = _client(worker)
    r = client.post("/v1/chat/completions", json={
        "model": "m", "messages": [{"role": "user", "content": 'say "functions"'}],
        "tools": [{"type": "function", "function": WEATHER}]})
    assert r.status_code == 200
    message = r.json()["choices"][0]["message"]
    assert message["tool_calls"][0]["function"]["name"] == "get_weather"
    assert "function_call" not in message


def test_a_tool_result_that_answers_no_earlier_call_is_a_400_naming_it() -> None:
    """OpenAI's rule, on its own route (the Anthropic and Responses routes hold theirs)."""
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{}"}}
    history = [{"role": "user", "content": "Weather?"},
               {"role": "assistant", "content": None, "tool_calls": [call]}]
    worker = FakeWorker(_call_reply())
    client, _ = _client(worker)
    r = client.post("/v1/chat/completions", json={"model": "m", "messages": history + [
        {"role": "tool", "tool_call_id": "nope", "content": "sunny"}]})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "messages[2].tool_call_id" and worker.requests == []
    r = client.post("/v1/chat/completions", json={"model": "m", "messages": history + [
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]})
    assert r.status_code == 200
