"""The OpenAI API through HTTP: shapes, stream/non-stream agreement, constraints, errors."""

from __future__ import annotations

import json

import jsonschema
import pytest

from tests.integration.conftest import STORIES
from tests.integration.helpers import fold_chat, message_view, sse_events, stream_chat

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

MSG = [{"role": "user", "content": "What is the weather in Oslo?"}]
MODE_TOOL = {"type": "function", "function": {"name": "set_mode", "parameters": {
    "type": "object", "properties": {"mode": {"type": "string", "enum": ["eco", "turbo"]},
                                     "level": {"type": "integer"}, "on": {"type": "boolean"}},
    "required": ["mode", "on"]}}}
LIGHT_TOOL = {"type": "function", "function": {"name": "light", "parameters": {
    "type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]}}}
SCHEMA = {"type": "object", "properties": {"size": {"type": "string", "enum": ["s", "m", "l"]},
                                           "count": {"type": "integer"},
                                           "ok": {"type": "boolean"}},
          "required": ["size", "count", "ok"]}


def _chat(client, **body):
    return client.post("/v1/chat/completions",
                       json={"model": "flm-tiny", "messages": MSG, **body})


def _without_ids(view: dict) -> dict:
    return {**view, "tool_calls": {i: {k: v for k, v in c.items() if k != "id"}
                                   for i, c in view["tool_calls"].items()}}


def _assert_stream_agrees(client, body: dict, whole: dict) -> None:
    """The same request streamed folds into `whole` (a non-streamed choice), ids aside."""
    folded = fold_chat(stream_chat(client, body)[0])[0]
    assert folded["finish_reason"] == whole["finish_reason"]
    view = message_view(whole["message"])
    assert _without_ids({k: folded[k] for k in view}) == _without_ids(view)


# -- shapes ---------------------------------------------------------------------------------
def test_models_and_health(client) -> None:
    assert client.get("/health").json() == {"status": "ok"}
    ids = [m["id"] for m in client.get("/v1/models").json()["data"]]
    assert "flm-tiny" in ids


def test_a_model_is_looked_up_by_id(client, serve_url) -> None:
    from openai import NotFoundError, OpenAI

    card = client.get("/v1/models/flm-tiny").json()
    assert card["id"] == "flm-tiny" and card["object"] == "model"
    assert card["context_length"] > 0
    missing = client.get("/v1/models/no-such-model")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"
    oc = OpenAI(base_url=f"{serve_url}/v1", api_key="unused")
    assert oc.models.retrieve("flm-tiny").id == "flm-tiny"
    with pytest.raises(NotFoundError):
        oc.models.retrieve("no-such-model")


def test_chat_completion_shape(client) -> None:
    r = _chat(client, max_tokens=8, seed=3)
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "chat.completion" and body["model"] == "flm-tiny"
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 8
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 8


def test_stream_shape_and_usage_only_when_asked(client) -> None:
    chunks, status = stream_chat(client, {"model": "flm-tiny", "messages": MSG,
                                          "max_tokens": 6, "seed": 3})
    assert status == 200 and chunks[-1] == "[DONE]"
    assert all("usage" not in c for c in chunks[:-1])
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    chunks, _ = stream_chat(client, {"model": "flm-tiny", "messages": MSG, "max_tokens": 6,
                                     "seed": 3, "stream_options": {"include_usage": True}})
    body = [c for c in chunks if c != "[DONE]"]
    assert all(c["usage"] is None for c in body[:-1])
    assert body[-1]["choices"] == [] and body[-1]["usage"]["completion_tokens"] == 6


@pytest.mark.parametrize("extra", [
    {},
    {"tools": [MODE_TOOL, LIGHT_TOOL], "tool_choice": "required", "parallel_tool_calls": False},
    # many calls and few tokens: max_tokens cuts a call, which stays a call, streamed or not
    {"tools": [MODE_TOOL, LIGHT_TOOL], "tool_choice": "required", "max_tokens": 40},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}},
], ids=["plain", "tools", "cut-calls", "json_schema"])
def test_stream_and_non_stream_agree_for_the_same_seed(client, extra: dict) -> None:
    body = {"model": "flm-tiny", "messages": MSG, "max_tokens": 120, "seed": 11,
            "temperature": 0.9, **extra}
    whole = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    _assert_stream_agrees(client, body, whole)


@pytest.mark.parametrize("seed", [1, 2])
def test_gpt_oss_harmony_tool_call_through_http(client, seed: int) -> None:
    """A random gpt-oss (experts, sinks, YaRN) in the harmony format: a required call comes
    back as tool_calls with content null, the same streamed and not."""
    body = {"model": "tiny-gpt-oss", "messages": [{"role": "user", "content": "Lights?"}],
            "tools": [LIGHT_TOOL], "tool_choice": "required", "reasoning_effort": "none",
            "max_tokens": 160, "seed": seed}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    whole = r.json()["choices"][0]
    assert whole["finish_reason"] == "tool_calls" and whole["message"]["content"] is None
    [call] = whole["message"]["tool_calls"]
    assert call["function"]["name"] == "light"
    assert isinstance(json.loads(call["function"]["arguments"])["on"], bool)
    _assert_stream_agrees(client, body, whole)


def test_openai_client_streams_and_parses(serve_url) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=serve_url + "/v1", api_key="unused")
    out = client.chat.completions.create(model="flm-tiny", messages=MSG, max_tokens=5, seed=1)
    assert out.choices[0].finish_reason == "length"
    stream = client.chat.completions.create(model="flm-tiny", messages=MSG, max_tokens=5,
                                            seed=1, stream=True)
    reasons = [c.choices[0].finish_reason for c in stream if c.choices]
    assert reasons[-1] == "length"


def test_a_completion_takes_a_response_format(serve_url) -> None:
    """vLLM's `response_format` on /v1/completions, through the official client: the
    continuation is the JSON document (it was accepted and ignored before)."""
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=serve_url + "/v1", api_key="unused")
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}
    finished = 0
    for seed in range(4):  # a random model may wander in a string past max_tokens
        out = client.completions.create(model="flm-tiny", prompt="Answer in JSON: ",
                                        max_tokens=200, seed=seed,
                                        extra_body={"response_format": fmt})
        choice = out.choices[0]
        if choice.finish_reason == "stop":
            jsonschema.validate(json.loads(choice.text), SCHEMA)
            finished += 1
    assert finished >= 1
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="flm-tiny", prompt="x", max_tokens=2,
                                  extra_body={"response_format": {"type": "xml"}})
    assert err.value.body["param"] == "response_format.type"


# -- constraints ----------------------------------------------------------------------------
def _tool_calls(client, **extra) -> dict:
    r = _chat(client, tools=[MODE_TOOL, LIGHT_TOOL], max_tokens=200, seed=5, **extra)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def _check_calls(choice: dict) -> list[dict]:
    msg = choice["message"]
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (MODE_TOOL, LIGHT_TOOL)}
    calls = msg.get("tool_calls") or []
    for call in calls:
        assert call["id"].startswith("call_") and len(call["id"]) == 29
        jsonschema.validate(json.loads(call["function"]["arguments"]),
                            schemas[call["function"]["name"]])
    return calls


def test_a_call_cut_by_max_tokens_stays_a_call(client) -> None:
    # many parallel calls and few tokens: the last call is cut where max_tokens fell; it
    # stays in tool_calls (arguments as far as they got), never markup in content
    for seed in range(4):
        choice = _chat(client, tools=[MODE_TOOL, LIGHT_TOOL], tool_choice="required",
                       max_tokens=40, seed=seed).json()["choices"][0]
        calls = choice["message"].get("tool_calls") or []
        assert choice["message"]["content"] is None and calls
        whole = calls if choice["finish_reason"] == "tool_calls" else calls[:-1]
        assert choice["finish_reason"] in ("tool_calls", "length")
        for call in whole:
            json.loads(call["function"]["arguments"])
        assert calls[-1]["function"]["name"] in ("set_mode", "light")


def test_tool_choice_required(client) -> None:
    choice = _tool_calls(client, tool_choice="required")
    calls = _check_calls(choice)
    assert calls and choice["message"]["content"] is None
    assert choice["finish_reason"] == "tool_calls"


def test_tool_choice_named(client) -> None:
    choice = _tool_calls(client, tool_choice={"type": "function", "function": {"name": "light"}})
    calls = _check_calls(choice)
    assert calls and {c["function"]["name"] for c in calls} == {"light"}


def test_parallel_tool_calls_false_gives_one_call(client) -> None:
    for seed in range(3):
        choice = _tool_calls(client, tool_choice="required", parallel_tool_calls=False)
        assert len(_check_calls(choice)) == 1


def test_tool_choice_none_and_auto(client) -> None:
    choice = _tool_calls(client, tool_choice="none")
    assert not choice["message"].get("tool_calls")
    _check_calls(_tool_calls(client, tool_choice="auto"))


@pytest.mark.parametrize("fmt,schema", [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}},
     SCHEMA),
    ({"type": "json_object"}, {"type": "object"}),
])
def test_response_format(client, fmt: dict, schema: dict) -> None:
    # A random model may wander inside a string past max_tokens: every output that ends
    # must be a valid document, and some must end.
    finished = 0
    for seed in range(6):
        r = _chat(client, response_format=fmt, max_tokens=300, seed=seed, think=False)
        choice = r.json()["choices"][0]
        if choice["finish_reason"] == "stop":
            jsonschema.validate(json.loads(choice["message"]["content"]), schema)
            finished += 1
    assert finished >= 2


def test_thinking_switch(client) -> None:
    for body in ({"think": False}, {"reasoning_effort": "none"},
                 {"chat_template_kwargs": {"enable_thinking": False}}):
        r = _chat(client, max_tokens=30, seed=4, **body)
        assert not r.json()["choices"][0]["message"].get("reasoning_content")


def test_template_kwargs_cannot_override_the_conversation(client) -> None:
    r = _chat(client, max_tokens=2, reasoning_effort="low",
              chat_template_kwargs={"messages": 1, "tools": "x", "reasoning_effort": "high",
                                    "add_generation_prompt": False})
    assert r.status_code == 200, r.text


def test_content_parts_are_read_and_images_refused(client) -> None:
    parts = [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]
    r = client.post("/v1/chat/completions", json={"model": "flm-tiny", "max_tokens": 2,
                                                  "messages": [{"role": "user", "content": parts}]})
    assert r.status_code == 200, r.text
    # a text-only model does not silently drop an image it was asked about
    parts.append({"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}})
    r = client.post("/v1/chat/completions", json={"model": "flm-tiny", "max_tokens": 2,
                                                  "messages": [{"role": "user", "content": parts}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content[2].type"


def test_input_messages_accept_reasoning_fields(client) -> None:
    history = MSG + [{"role": "assistant", "content": "Sunny.", "reasoning": "check"},
                     {"role": "assistant", "content": "", "reasoning_content": "x",
                      "tool_calls": [{"id": "call_1", "type": "function", "function": {
                          "name": "light", "arguments": "{\"on\": true}"}}]},
                     {"role": "tool", "tool_call_id": "call_1", "content": "done"},
                     {"role": "user", "content": "thanks"}]
    r = client.post("/v1/chat/completions", json={"model": "flm-tiny", "messages": history,
                                                   "max_tokens": 3})
    assert r.status_code == 200, r.text


def test_n_choices_and_logprobs(client) -> None:
    r = _chat(client, max_tokens=4, n=3, seed=9, logprobs=True, top_logprobs=2)
    body = r.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    lp = body["choices"][0]["logprobs"]["content"]
    assert len(lp) == 4 and len(lp[0]["top_logprobs"]) == 2
    assert body["usage"]["completion_tokens"] == 12
    chunks, _ = stream_chat(client, {"model": "flm-tiny", "messages": MSG, "max_tokens": 4,
                                     "n": 2, "seed": 9})
    assert set(fold_chat(chunks)) == {0, 1}


def test_stop_strings(client) -> None:
    r = client.post("/v1/completions", json={"model": "flm-tiny", "prompt": "Numbers:",
                                             "max_tokens": 40, "seed": 1, "stop": [" "]})
    choice = r.json()["choices"][0]
    assert " " not in choice["text"]


# -- errors ---------------------------------------------------------------------------------
@pytest.mark.parametrize("body,status,param", [
    ({"messages": MSG}, 400, "model"),
    ({"model": "flm-tiny"}, 400, "messages"),
    ({"model": "flm-tiny", "messages": []}, 400, "messages"),
    ({"model": "flm-tiny", "messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0]"),
    ({"model": "flm-tiny", "messages": MSG, "max_tokens": 0}, 400, "max_tokens"),
    ({"model": "flm-tiny", "messages": MSG, "temperature": 3}, 400, "temperature"),
    ({"model": "flm-tiny", "messages": MSG, "n": 9}, 400, "n"),
    ({"model": "flm-tiny", "messages": MSG, "top_logprobs": 21, "logprobs": True}, 400,
     "top_logprobs"),
    ({"model": "flm-tiny", "messages": MSG, "top_logprobs": 2}, 400, "top_logprobs"),
    ({"model": "flm-tiny", "messages": MSG, "stream_options": {"include_usage": True}}, 400,
     "stream_options"),
    ({"model": "flm-tiny", "messages": MSG, "tool_choice": "required"}, 400, "tool_choice"),
    ({"model": "flm-tiny", "messages": MSG, "parallel_tool_calls": "no"}, 400,
     "parallel_tool_calls"),
    ({"model": "flm-tiny", "messages": MSG, "tools": [MODE_TOOL],
      "tool_choice": {"type": "function", "function": {"name": "nope"}}}, 400,
     "tool_choice.function.name"),
    ({"model": "flm-tiny", "messages": MSG, "response_format": {"type": "yaml"}}, 400,
     "response_format.type"),
    ({"model": "flm-tiny", "messages": MSG, "response_format": {"type": "json_schema",
      "json_schema": {"name": "x", "schema": {"type": "object", "properties": {
          "a": {"type": "tensor"}}}}}}, 400, "response_format.json_schema.schema"),
    ({"model": "nope", "messages": MSG}, 404, "model"),
    ({"model": "flm-tiny", "messages": [{"role": "assistant", "tool_calls": [
        {"function": "get_weather"}]}]}, 400, "messages[0].tool_calls[0].function"),
    ({"model": "flm-tiny", "messages": [{"role": "user", "content": [{"text": "x"}]}]}, 400,
     "messages[0].content[0].type"),
])
def test_errors_are_openai_shaped(client, body: dict, status: int, param: str) -> None:
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"] and err["type"]


@pytest.mark.parametrize("field", ["stream", "stream_options", "max_tokens", "n",
                                   "temperature", "top_p", "seed", "stop", "tools",
                                   "tool_choice", "parallel_tool_calls", "response_format",
                                   "logprobs", "top_logprobs", "presence_penalty",
                                   "frequency_penalty", "think", "reasoning_effort",
                                   "chat_template_kwargs", "max_completion_tokens", "user"])
def test_null_reads_as_missing(client, field: str) -> None:
    r = _chat(client, max_tokens=2, **{field: None}) if field != "max_tokens" else \
        client.post("/v1/chat/completions", json={"model": "flm-tiny", "messages": MSG,
                                                  "max_tokens": None,
                                                  "max_completion_tokens": 2})
    assert r.status_code == 200, r.text


def test_invalid_json_and_oversized_bodies(client) -> None:
    r = client.post("/v1/chat/completions", content=b"{not json",
                    headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    big = {"model": "flm-tiny", "messages": [{"role": "user", "content": "x" * (2 << 20)}]}
    r = client.post("/v1/chat/completions", json=big)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


def test_unknown_paths_and_methods_are_openai_shaped(client) -> None:
    r = client.post("/v1/audio/speech", json={"model": "flm-tiny", "input": "x"})
    assert r.status_code == 404
    assert "/v1/audio/speech" in r.json()["error"]["message"]
    r = client.get("/v1/chat/completions")
    assert r.status_code == 405 and "GET" in r.json()["error"]["message"]
    assert "POST" in r.headers["allow"]


def test_prompt_over_the_context_length(client) -> None:
    long = [{"role": "user", "content": "Paris " * 6000}]
    r = client.post("/v1/chat/completions", json={"model": "flm-tiny", "messages": long})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded"


# -- the real model -------------------------------------------------------------------------
@pytest.mark.skipif(not STORIES.exists(), reason=f"{STORIES} is absent")
def test_stories260k_greedy_completion_reproduces_its_reference(client) -> None:
    r = client.post("/v1/completions", json={"model": "stories260k", "prompt": "",
                                             "max_tokens": 33, "temperature": 0})
    assert r.json()["choices"][0]["text"] == (
        "Once upon a time, there was a little girl named Lily. She loved to play outside in "
        "the park. One day")
    with client.stream("POST", "/v1/completions", json={
            "model": "stories260k", "prompt": "", "max_tokens": 33, "temperature": 0,
            "stream": True}) as resp:
        chunks = sse_events(resp)
    text = "".join(c["choices"][0]["text"] for c in chunks if c != "[DONE]" and c["choices"])
    assert text.startswith("Once upon a time, there was a little girl named Lily.")


ODD = [
    {"seed": -5}, {"seed": 2**80}, {"stop": [""]}, {"max_tokens": 10**9, "n": 1},
    {"top_k": 10**9}, {"presence_penalty": -2, "frequency_penalty": 2},
    {"logprobs": True, "top_logprobs": 20}, {"n": 8, "stream": True},
    {"messages": [{"role": "user", "content": None}]},
    {"messages": [{"role": "tool", "content": "orphan result"}]},
    {"messages": [{"role": "system", "content": "only a system prompt"}]},
    {"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"$ref": "#/nope"}}}}}], "tool_choice": "required"},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {
        "type": "array", "items": {"type": "integer"}, "maxItems": 2}}}},
    {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "none",
     "response_format": {"type": "json_object"}},
]


@pytest.mark.parametrize("extra", ODD)
def test_odd_inputs_never_give_a_500(client, extra: dict) -> None:
    body = {"model": "flm-tiny", "messages": MSG, "max_tokens": 3, **extra}
    if extra.get("max_tokens") == 10**9:
        body["max_tokens"] = 10**9
        body["stop"] = [" "]
    if body.get("stream"):
        _, status = stream_chat(client, body)
    else:
        status = client.post("/v1/chat/completions", json=body).status_code
    assert status in (200, 400), extra


def test_empty_completion_prompt(client) -> None:
    r = client.post("/v1/completions", json={"model": "flm-tiny", "prompt": "", "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
