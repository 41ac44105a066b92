"""Anthropic's Messages API through HTTP with the official `anthropic` SDK: create, the
stream (events in Anthropic's order; `get_final_message()` equals the non-streamed reply),
a tool round trip, structured output, the thinking options, count_tokens, the prefix cache
in usage, the API key and errors."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from tests.integration.conftest import SECRET

anthropic = pytest.importorskip("anthropic")
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SMOL = "smollm2-135m"
CATS = [{"role": "user", "content": "Write one sentence about cats."}]
GREEDY = {"temperature": 0}  # older clients' field (the SDK's extra_body)
WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "input_schema": {"type": "object", "properties": {
               "city": {"type": "string", "enum": ["Oslo", "Paris"]}}, "required": ["city"]}}
LIGHT = {"name": "light", "input_schema": {"type": "object", "properties": {
    "on": {"type": "boolean"}}, "required": ["on"]}}
CITY = {"type": "object", "properties": {"name": {"type": "string"},
                                         "country": {"type": "string"}},
        "required": ["name", "country"], "additionalProperties": False}


@pytest.fixture()
def ac(serve_url):
    return anthropic.Anthropic(base_url=serve_url, api_key="unused", timeout=120,
                               max_retries=0)


def _view(message) -> dict:
    """A message without the ids a second run makes anew, its prompt's tokens counted
    whole (a second run finds more of them in the prefix cache)."""
    out = message.model_dump(exclude={"id"})
    for block in out["content"]:
        block.pop("id", None)
    u = out["usage"]
    u["input_tokens"] += u.pop("cache_read_input_tokens")
    return out


def _raw_types(ac, **kw) -> tuple[list[str], set[str]]:
    """The event names of a raw stream (pings aside) and the kinds of its deltas."""
    events = list(ac.messages.create(stream=True, **kw))
    return ([ev.type for ev in events],
            {ev.delta.type for ev in events if ev.type == "content_block_delta"})


def _block_events_ok(types: list[str]) -> None:
    """message_start, then per block start / deltas / stop, then message_delta and
    message_stop."""
    assert types[0] == "message_start" and types[-2:] == ["message_delta", "message_stop"]
    inside = False
    for t in types[1:-2]:
        if t == "content_block_start":
            assert not inside
            inside = True
        elif t == "content_block_stop":
            assert inside
            inside = False
        else:
            assert t == "content_block_delta" and inside
    assert not inside


def test_create_plain_and_with_a_system_prompt(ac) -> None:
    r = ac.messages.create(model=SMOL, max_tokens=40, messages=CATS, extra_body=GREEDY)
    assert r.type == "message" and r.role == "assistant" and r.id.startswith("msg_")
    assert r.model == SMOL and r.stop_reason == "end_turn" and r.stop_sequence is None
    assert [b.type for b in r.content] == ["text"]
    assert r.content[0].text == ("A cat is a majestic creature with a fluffy coat, a playful "
                                 "personality, and a loyal companion.")
    assert 10 < r.usage.output_tokens < 40
    system = "Answer every question in French.\nKeep to one short sentence."
    blocks = [{"type": "text", "text": "Answer every question in French."},  # a line each
              {"type": "text", "text": "Keep to one short sentence.",
               "cache_control": {"type": "ephemeral"}}]
    s1, s2 = (ac.messages.create(model=SMOL, max_tokens=5, messages=CATS, system=sys,
                                 extra_body=GREEDY) for sys in (system, blocks))
    assert s1.content == s2.content and s1.usage.output_tokens == 5
    assert s1.stop_reason == "max_tokens"
    totals = [m.usage.input_tokens + m.usage.cache_read_input_tokens for m in (r, s1, s2)]
    assert totals[1] == totals[2] != totals[0]  # the system prompt replaced the default one
    stopped = ac.messages.create(model=SMOL, max_tokens=40, messages=CATS,
                                 stop_sequences=["majestic"], extra_body=GREEDY)
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == "majestic"
    assert stopped.content[0].text == "A cat is a"  # (content is trimmed)


@pytest.mark.parametrize("extra", [
    {"max_tokens": 30},
    # (a random model's one call, its strings bounded, ends within about 75 tokens)
    {"max_tokens": 120, "tools": [WEATHER, LIGHT],
     "tool_choice": {"type": "any", "disable_parallel_tool_use": True}},
], ids=["text", "tool_use"])
def test_the_stream_rebuilds_the_non_streamed_message(ac, extra: dict) -> None:
    kw = dict(model="flm-tiny", messages=CATS, extra_body={"seed": 2, "temperature": 0.9},
              **extra)
    whole = ac.messages.create(**kw)
    with ac.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    assert _view(final) == _view(whole)
    types, deltas = _raw_types(ac, **kw)
    _block_events_ok(types)
    if "tools" in extra:
        assert whole.stop_reason == "tool_use" and "input_json_delta" in deltas
        [call] = [b for b in whole.content if b.type == "tool_use"]
        schema = {"get_weather": WEATHER, "light": LIGHT}[call.name]["input_schema"]
        jsonschema.validate(call.input, schema)


def test_a_tool_round_trip(ac) -> None:
    ask = [{"role": "user", "content": "What is the weather in Oslo?"}]
    r = ac.messages.create(model=SMOL, max_tokens=60, messages=ask, tools=[WEATHER],
                           tool_choice={"type": "any", "disable_parallel_tool_use": True},
                           extra_body=GREEDY)
    assert r.stop_reason == "tool_use"
    [call] = [b for b in r.content if b.type == "tool_use"]
    assert call.name == "get_weather" and call.input == {"city": "Oslo"}
    turns = ask + [{"role": "assistant", "content": [b.model_dump() for b in r.content]},
                   {"role": "user", "content": [{"type": "tool_result",
                                                 "tool_use_id": call.id,
                                                 "content": "Sunny, 21 degrees."}]}]
    follow = ac.messages.create(model=SMOL, max_tokens=30, messages=turns, tools=[WEATHER],
                                tool_choice={"type": "none"}, extra_body=GREEDY)
    assert [b.type for b in follow.content] == ["text"] and follow.content[0].text
    assert follow.stop_reason in ("end_turn", "max_tokens")


def test_output_config_format_is_the_grammar_constraint(ac) -> None:
    r = ac.messages.create(model=SMOL, max_tokens=60, extra_body=GREEDY,
                           messages=[{"role": "user", "content": "Name a city in France."}],
                           output_config={"format": {"type": "json_schema", "schema": CITY}})
    assert r.stop_reason == "end_turn"
    jsonschema.validate(json.loads(r.content[0].text), CITY)


def test_thinking_enabled_adaptive_and_disabled(ac) -> None:
    # (a random model: the format's grammar keeps its harmony output readable)
    kw = dict(model="tiny-gpt-oss", max_tokens=40, messages=[{"role": "user",
                                                              "content": "hi"}],
              output_config={"format": {"type": "json_schema", "schema": {"type": "object"}}},
              extra_body={"temperature": 0})
    on = ac.messages.create(thinking={"type": "enabled", "budget_tokens": 1024}, **kw)
    assert on.content[0].type == "thinking" and on.content[0].thinking
    with ac.messages.stream(thinking={"type": "enabled", "budget_tokens": 1024},
                            **kw) as stream:
        thinking = "".join(ev.delta.thinking for ev in stream
                           if ev.type == "content_block_delta"
                           and ev.delta.type == "thinking_delta")
    assert thinking == on.content[0].thinking
    adaptive = ac.messages.create(thinking={"type": "adaptive"}, **kw)
    assert adaptive.content[0].type == "thinking"  # gpt-oss's template thinks by default
    off = ac.messages.create(thinking={"type": "disabled"}, **kw)
    assert off.stop_reason in ("end_turn", "max_tokens")
    assert "thinking" not in [b.type for b in off.content]
    omitted = ac.messages.create(thinking={"type": "enabled", "budget_tokens": 2048,
                                           "display": "omitted"}, **kw)
    assert omitted.content[0].type == "thinking" and omitted.content[0].thinking == ""


def test_count_tokens_and_the_prefix_cache_in_usage(ac) -> None:
    system = "You are a helpful assistant. Keep answers short."
    first = ac.messages.create(model=SMOL, max_tokens=12, messages=CATS, system=system,
                               tools=[WEATHER], extra_body=GREEDY)
    count = ac.messages.count_tokens(model=SMOL, messages=CATS, system=system,
                                     tools=[WEATHER])
    assert count.input_tokens == first.usage.input_tokens \
        + first.usage.cache_read_input_tokens
    turns = CATS + [{"role": "assistant", "content": first.content[0].text},
                    {"role": "user", "content": "And one about dogs."}]
    second = ac.messages.create(model=SMOL, max_tokens=5, messages=turns, system=system,
                                tools=[WEATHER], extra_body=GREEDY)
    assert second.usage.cache_read_input_tokens > 0
    counted = ac.messages.count_tokens(model=SMOL, messages=turns, system=system,
                                       tools=[WEATHER]).input_tokens
    assert second.usage.cache_read_input_tokens + second.usage.input_tokens == counted
    assert second._request_id == "req_" + second.id.removeprefix("msg_")
    # streamed: message_start carries the prompt's tokens, split as the final usage
    with ac.messages.stream(model=SMOL, max_tokens=5, messages=turns, system=system,
                            tools=[WEATHER], extra_body=GREEDY) as stream:
        start = next(iter(stream))
        assert start.type == "message_start"
        begun = (start.message.usage.input_tokens,  # as sent, before the rest is folded in
                 start.message.usage.cache_read_input_tokens)
        final = stream.get_final_message()
    assert begun == (final.usage.input_tokens, final.usage.cache_read_input_tokens)
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == counted
    assert final.usage.cache_read_input_tokens > 0


def test_the_api_key_as_x_api_key_or_bearer(serve_url, client) -> None:
    secured = serve_url + "/secured"
    body = {"model": "flm-tiny", "max_tokens": 2, "messages": CATS}
    r = client.post(secured + "/v1/messages", json=body, headers={"x-api-key": SECRET})
    assert r.status_code == 200 and r.json()["usage"]["output_tokens"] == 2
    ok = anthropic.Anthropic(base_url=secured, api_key=SECRET, max_retries=0)
    assert ok.messages.create(**body).usage.output_tokens == 2
    bad = anthropic.Anthropic(base_url=secured, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as err:
        bad.messages.create(**body)
    assert err.value.body["error"]["type"] == "authentication_error"


def test_errors_from_bad_input_are_anthropic_shaped(ac, client) -> None:
    with pytest.raises(anthropic.NotFoundError) as err:
        ac.messages.create(model="nope", max_tokens=2, messages=CATS)
    assert err.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as err:
        ac.messages.create(model=SMOL, max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "AA=="}}]}])
    assert "messages[0].content[0].type" in err.value.body["error"]["message"]
    # the worker's refusal: a prompt over the model's context
    long = [{"role": "user", "content": "cat " * 10000}]
    r = client.post("/v1/messages", json={"model": "flm-tiny", "max_tokens": 2,
                                          "messages": long, "stream": True})
    assert r.status_code == 400, r.text
    assert re.fullmatch(r"prompt is too long: \d+ tokens > \d+ maximum",
                        r.json()["error"]["message"])
