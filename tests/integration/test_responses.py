"""OpenAI's Responses API through HTTP with the official client: create, the stream helper
(its final response equals the non-streamed one), function tools with their outputs,
structured output, reasoning, the token limit, stored responses and their input items,
truncation and errors."""

from __future__ import annotations

import json

import jsonschema
import pytest

from tests.gpt_oss_model import LIGHT

openai = pytest.importorskip("openai")
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SMOL = "smollm2-135m"
CATS = "Write one sentence about cats."
LIGHT_TOOL = {"type": "function", **LIGHT["function"]}
CITY = {"type": "object", "properties": {"name": {"type": "string"},
                                         "country": {"type": "string"}},
        "required": ["name", "country"], "additionalProperties": False}


@pytest.fixture()
def oa(serve_url):
    return openai.OpenAI(base_url=serve_url + "/v1", api_key="unused", timeout=120)


def _view(response) -> list[dict]:
    """A response's output without the ids a second run makes anew (nor the stream
    helper's `parsed` fields)."""
    def strip(obj):
        if isinstance(obj, dict):
            return {k: strip(v) for k, v in obj.items() if k not in ("id", "call_id", "parsed")}
        if isinstance(obj, list):
            return [strip(v) for v in obj]
        return obj
    return strip([item.model_dump() for item in response.output])


def test_create_is_the_same_pipeline_as_chat(oa) -> None:
    r = oa.responses.create(model=SMOL, input=CATS, temperature=0, max_output_tokens=40)
    assert r.status == "completed" and r.object == "response" and r.id.startswith("resp_")
    assert r.output_text == ("A cat is a majestic creature with a fluffy coat, a playful "
                             "personality, and a loyal companion.")
    assert [item.type for item in r.output] == ["message"]
    assert r.usage.input_tokens > 5 and 10 < r.usage.output_tokens <= 40
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.usage.input_tokens_details.cache_write_tokens == 0


def test_the_stream_helper_rebuilds_the_same_response(oa) -> None:
    whole = oa.responses.create(model=SMOL, input=CATS, temperature=0, max_output_tokens=40)
    with oa.responses.stream(model=SMOL, input=CATS, temperature=0,
                             max_output_tokens=40) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == final.output_text == whole.output_text
    assert _view(final) == _view(whole)


@pytest.mark.parametrize("stream", [False, True])
def test_function_tool_round_trip(oa, stream: bool) -> None:
    ask = [{"role": "user", "content": "Lights?"}]
    # `seed` (an extension, as in chat completions) picks a call that ends in 60 tokens
    kw = dict(model="tiny-gpt-oss", tools=[LIGHT_TOOL], tool_choice="required",
              max_output_tokens=60, extra_body={"seed": 2})
    if stream:
        with oa.responses.stream(input=ask, **kw) as s:
            list(s)
            r = s.get_final_response()
    else:
        r = oa.responses.create(input=ask, **kw)
    calls = [item for item in r.output if item.type == "function_call"]
    assert calls and calls[0].name == "light" and calls[0].call_id.startswith("call_")
    jsonschema.validate(json.loads(calls[0].arguments), LIGHT["function"]["parameters"])
    # the call and its output sent back as input items
    items = ask + [c.model_dump(exclude_none=True) for c in calls] + [
        {"type": "function_call_output", "call_id": c.call_id, "output": "done"}
        for c in calls]
    follow = oa.responses.create(model="tiny-gpt-oss", input=items, tools=[LIGHT_TOOL],
                                 max_output_tokens=5)
    assert follow.status in ("completed", "incomplete")
    assert follow.usage.input_tokens > r.usage.input_tokens
    # and the same through previous_response_id
    cont = oa.responses.create(model="tiny-gpt-oss", previous_response_id=r.id,
                               input=[{"type": "function_call_output",
                                       "call_id": calls[0].call_id, "output": "done"}],
                               tools=[LIGHT_TOOL], max_output_tokens=5)
    assert cont.previous_response_id == r.id
    assert cont.usage.input_tokens > r.usage.input_tokens


def test_text_format_is_the_grammar_constraint(oa) -> None:
    pydantic = pytest.importorskip("pydantic")

    class City(pydantic.BaseModel):
        name: str
        country: str

    r = oa.responses.create(model=SMOL, input="Name a city in France.", temperature=0,
                            max_output_tokens=60, text={"format": {
                                "type": "json_schema", "name": "city", "schema": CITY,
                                "strict": True}})
    jsonschema.validate(json.loads(r.output_text), CITY)
    parsed = oa.responses.parse(model=SMOL, input="Name a city in France as JSON.",
                                temperature=0, max_output_tokens=60, text_format=City)
    assert isinstance(parsed.output_parsed, City)


def test_reasoning_items_and_the_switch(oa) -> None:
    kw = dict(model="tiny-gpt-oss", input="hi", temperature=0, max_output_tokens=40,
              text={"format": {"type": "json_object"}})
    on = oa.responses.create(**kw)
    reasoning = [item for item in on.output if item.type == "reasoning"]
    assert reasoning and reasoning[0].content[0].type == "reasoning_text"
    assert reasoning[0].content[0].text
    with oa.responses.stream(**kw) as s:
        events = list(s)
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") \
        == reasoning[0].content[0].text
    off = oa.responses.create(**kw, reasoning={"effort": "none"})
    assert not [item for item in off.output if item.type == "reasoning"]


def test_the_token_limit_makes_an_incomplete_response(oa) -> None:
    r = oa.responses.create(model=SMOL, input=CATS, max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert [item.status for item in r.output] == ["incomplete"]  # the message it cut
    with oa.responses.stream(model=SMOL, input=CATS, max_output_tokens=3) as s:
        events = list(s)
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.usage.output_tokens == 3
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [item.status for item in done] == ["incomplete"]
    assert events[-1].response.output[0].status == "incomplete"


def test_stored_responses(oa) -> None:
    first = oa.responses.create(model=SMOL, input="My name is Ada.", max_output_tokens=10,
                                instructions="Answer briefly.")
    second = oa.responses.create(model=SMOL, input="What is my name?", max_output_tokens=10,
                                 previous_response_id=first.id)
    # the second prompt holds the first turn (its input and output) and the new input
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    got = oa.responses.retrieve(first.id)
    assert got.id == first.id and got.output_text == first.output_text
    # the items the second was made from: the first's input and output, then its own
    items = list(oa.responses.input_items.list(second.id, order="asc", limit=1))
    assert [(i.type, i.role) for i in items] == [("message", "user"),
                                                 ("message", "assistant"),
                                                 ("message", "user")]
    assert items[1].id == first.output[0].id
    assert items[2].content[0].text == "What is my name?"
    oa.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        oa.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        oa.responses.create(model=SMOL, input="hi", previous_response_id=first.id)
    unstored = oa.responses.create(model=SMOL, input="hi", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        oa.responses.retrieve(unstored.id)


def test_truncation_auto_drops_the_oldest_turns(oa) -> None:
    """flm-tiny's context is 4,096 tokens: a first turn of 6,000 words does not fit."""
    talk = [{"role": "user", "content": "cat " * 6000},
            {"role": "assistant", "content": "Cats."},
            {"role": "user", "content": "Hi"}]
    with pytest.raises(openai.BadRequestError) as err:
        oa.responses.create(model="flm-tiny", input=talk, max_output_tokens=2)
    assert err.value.body["code"] == "context_length_exceeded"
    assert err.value.body["param"] == "input"
    r = oa.responses.create(model="flm-tiny", input=talk, max_output_tokens=2,
                            instructions="Be brief.", truncation="auto")
    assert r.truncation == "auto" and r.status in ("completed", "incomplete")
    assert 5 < r.usage.input_tokens < 100  # the instructions and the last turn


@pytest.mark.parametrize("body,param", [
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].type"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "hi", "background": True}, "background"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "hi", "text": {"format": {"type": "xml"}}}, "text.format"),
    ({"input": "hi", "reasoning": {"effort": "a lot"}}, "reasoning.effort"),
    ({"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]},
     "input[0].call_id"),
    ({"input": []}, "input"),
    ({"input": "hi", "tools": [{"type": "function", "name": "bad name!"}]},
     "tools[0].name"),
])
def test_errors_name_the_field(client, body: dict, param: str) -> None:
    r = client.post("/v1/responses", json={"model": SMOL, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_unknown_model_and_response(client) -> None:
    r = client.post("/v1/responses", json={"model": "nope", "input": "hi"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = client.get("/v1/responses/resp_nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "response_not_found"
    assert client.delete("/v1/responses/resp_nope").status_code == 404
