"""The default model, SmolLM2-135M-Instruct (Q4_1 GGUF), through HTTP with the official
client: the flows a new user runs first complete (structured output parsed into a pydantic
model, a required tool call, the tool's result and a reply, the same streamed)."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.integration.helpers import fold_chat, message_view, stream_chat

MODEL = "smollm2-135m"
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "enum": ["Oslo", "Paris"]}}, "required": ["city"]}}}]


@pytest.fixture()
def openai_client(serve_url):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=serve_url + "/v1", api_key="unused", timeout=120)


def test_greedy_reply_is_the_real_models(client) -> None:
    r = client.post("/v1/chat/completions", json={
        "model": MODEL, "temperature": 0, "max_tokens": 40,
        "messages": [{"role": "user", "content": "Write one sentence about cats."}]})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["message"]["content"] == ("A cat is a majestic creature with a fluffy coat, "
                                            "a playful personality, and a loyal companion.")
    assert choice["finish_reason"] == "stop"


def test_structured_output_parses_into_a_pydantic_model(openai_client) -> None:
    pydantic = pytest.importorskip("pydantic")

    class City(pydantic.BaseModel):
        name: str
        country: str

    done = openai_client.chat.completions.parse(
        model=MODEL, max_tokens=60, temperature=0, response_format=City,
        messages=[{"role": "user", "content": "Name a city in France as JSON."}])
    city = done.choices[0].message.parsed
    assert isinstance(city, City) and city.name and city.country


def test_readme_tool_call_then_result_then_reply(client, openai_client) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Weather in Oslo?"}],
            "tools": WEATHER, "tool_choice": "required", "max_tokens": 100, "seed": 7}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    call = choice["message"]["tool_calls"][0]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"])["city"] in ("Oslo", "Paris")
    # the same request streamed folds into the same reply
    folded = fold_chat(stream_chat(client, body)[0])[0]
    assert folded["finish_reason"] == "tool_calls"
    view = message_view(choice["message"])
    strip = {i: {k: v for k, v in c.items() if k != "id"} for i, c in view["tool_calls"].items()}
    assert {i: {k: v for k, v in c.items() if k != "id"}
            for i, c in folded["tool_calls"].items()} == strip
    # the tool's result goes back, and the model answers in text
    messages = body["messages"] + [choice["message"], {
        "role": "tool", "tool_call_id": call["id"],
        "content": json.dumps({"city": "Oslo", "temperature_c": 4, "sky": "cloudy"})}]
    reply = openai_client.chat.completions.create(
        model=MODEL, messages=messages, tools=WEATHER, tool_choice="none", max_tokens=60,
        temperature=0)
    text = reply.choices[0].message.content
    assert text and "<tool_call>" not in text and not reply.choices[0].message.tool_calls
    assert reply.usage.prompt_tokens > 50


def test_speculative_decoding_gives_the_same_constrained_output_over_http(client) -> None:
    """The served model drafts from the prompt (speculation is on by default): a reply
    under a JSON schema that echoes its input is the one the same model writes without
    drafts, in this process, and the usage counts the drafts kept."""
    from actors.events import ChatGenerate, Deltas
    from actors.speculation import Speculation
    from actors.worker import Worker
    from chat import constraint_request_from_openai
    from npu import load_model

    record = {"id": 4127, "name": "Ada Lovelace", "city": "London",
              "address": {"street": "12 St James's Square", "postcode": "SW1Y 4JH"}}
    schema = {"type": "json_schema", "json_schema": {"name": "record", "schema": {
        "type": "object", "properties": {"id": {"type": "integer"},
                                         "name": {"type": "string"},
                                         "city": {"type": "string"}},
        "required": ["id", "name", "city"]}}}
    messages = [{"role": "user", "content": "Copy this JSON record, with \"city\" set to "
                 "\"Paris\":\n" + json.dumps(record, indent=2)}]
    r = client.post("/v1/chat/completions", json={
        "model": MODEL, "messages": messages, "temperature": 0, "max_tokens": 40,
        "response_format": schema})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] > 0

    model = load_model("smollm2-135m")
    model.engine.set_threads(1)
    worker = Worker(lambda: model, speculation=Speculation(method="off"))
    req = ChatGenerate(request_id="plain", messages=messages, temperature=0.0, max_tokens=40,
                       constraint=constraint_request_from_openai({"response_format": schema}))

    async def plain() -> str:
        return "".join([d.text async for batch in worker.generate(req) for e in batch
                        if isinstance(e, Deltas) for d in e.deltas])

    try:
        text = asyncio.run(asyncio.wait_for(plain(), 120))
    finally:
        worker.close()
    assert body["choices"][0]["message"]["content"] == text


def test_an_echoed_prompt_is_scored_as_lm_eval_scores_it(openai_client) -> None:
    """lm-evaluation-harness's loglikelihood (its `local-completions` model) through the
    official client: the context and a continuation echoed with `logprobs` and nothing
    written; the continuation's tokens' logprobs say which answer the model believes."""
    context = "The capital of France is"

    def score(continuation: str) -> float:
        out = openai_client.completions.create(model=MODEL, prompt=context + continuation,
                                               echo=True, logprobs=1, max_tokens=0,
                                               temperature=0)
        choice, usage = out.choices[0], out.usage
        assert choice.text == context + continuation and choice.finish_reason == "length"
        assert usage.completion_tokens == 0
        lp = choice.logprobs
        assert len(lp.tokens) == usage.prompt_tokens == len(lp.token_logprobs)
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        assert "".join(lp.tokens) == context + continuation
        ours = [i for i, at in enumerate(lp.text_offset) if at >= len(context)]
        assert ours and all(max(lp.top_logprobs[i].values()) >= lp.token_logprobs[i]
                            for i in ours)
        return sum(lp.token_logprobs[i] for i in ours)

    assert score(" Paris.") > score(" London.") + 1.0


def test_lm_eval_scores_token_ids_with_the_servers_own_tokenizer(client) -> None:
    """As lm-evaluation-harness does with its remote tokenizer (tokenized requests): the
    context and the continuation tokenized by /tokenize, sent as token ids with `echo`,
    `logprobs` 1 and `max_tokens` 1; it sums `token_logprobs[ctxlen:-1]` and calls the
    continuation greedy when each of its tokens is the top one."""
    info = client.get("/tokenizer_info", params={"model": MODEL}).json()
    assert info["eos_token"] == "<|im_end|>" and "im_start" in info["chat_template"]

    def ids(text: str) -> list[int]:
        r = client.post("/tokenize", json={"model": MODEL, "prompt": text,
                                           "add_special_tokens": False})
        return r.json()["tokens"]

    context = ids("The capital of France is")

    def score(continuation: str) -> tuple[float, bool]:
        whole = context + ids(continuation)
        r = client.post("/v1/completions", json={
            "model": MODEL, "prompt": [whole], "echo": True, "logprobs": 1, "max_tokens": 1,
            "temperature": 0, "seed": 1234})
        assert r.status_code == 200, r.text
        lp = r.json()["choices"][0]["logprobs"]
        assert len(lp["token_logprobs"]) == len(whole) + 1  # and the one token written
        got = lp["token_logprobs"][len(context):-1]
        tops = lp["top_logprobs"][len(context):-1]
        return sum(got), all(v == max(t.values()) for v, t in zip(got, tops, strict=True))

    (paris, greedy), (london, _) = score(" Paris"), score(" London")
    assert paris > london and greedy
