"""Ollama's API through HTTP with the official `ollama` client: listing, show, chat and
generate (streamed and not), structured output, tools, thinking, options and errors."""

from __future__ import annotations

import json

import jsonschema
import pytest

from tests.gpt_oss_model import LIGHT
from tests.integration.conftest import SECRET, UNLOADABLE

ollama = pytest.importorskip("ollama")
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SMOL = "smollm2-135m"
CATS = [{"role": "user", "content": "Write one sentence about cats."}]
CITY = {"type": "object", "properties": {"name": {"type": "string"},
                                         "country": {"type": "string"}},
        "required": ["name", "country"]}


@pytest.fixture()
def oc(serve_url):
    return ollama.Client(host=serve_url, timeout=120)


def _fold(parts) -> dict:
    """What a client appending each streamed part ends with, and the final part."""
    out = {"content": "", "thinking": "", "tool_calls": [], "done": None}
    for p in parts:
        out["content"] += p.message.content or ""
        out["thinking"] += p.message.thinking or ""
        out["tool_calls"] += [c.model_dump() for c in p.message.tool_calls or []]
        if p.done:
            out["done"] = p
    return out


def test_list_show_ps_and_version(oc, client) -> None:
    names = {m.model for m in oc.list().models}
    assert {"flm-tiny:latest", f"{SMOL}:latest", "tiny-gpt-oss:latest"} <= names
    smol = next(m for m in oc.list().models if m.model == f"{SMOL}:latest")
    assert smol.details.format == "gguf" and smol.details.quantization_level == "Q4_1"
    assert smol.details.family == "llama" and smol.size > 50_000_000
    shown = oc.show(SMOL)
    assert shown.modelinfo["llama.context_length"] == 8192
    assert shown.modelinfo["general.architecture"] == "llama"
    assert "completion" in shown.capabilities and "tools" in shown.capabilities
    assert "<|im_start|>" in shown.template
    assert "thinking" in oc.show("tiny-gpt-oss:latest").capabilities
    running = {m.model: m for m in oc.ps().models}
    assert running[f"{SMOL}:latest"].context_length == 8192
    assert client.get("/api/version").json()["version"]
    assert client.get("/").text == "Ollama is running"
    assert client.head("/").status_code == 200


def test_chat_is_the_same_pipeline_as_openais(oc) -> None:
    # the same greedy reply as /v1/chat/completions gives (tests/integration/test_smollm2.py)
    # without Ollama's default repeat_penalty
    r = oc.chat(model=SMOL, messages=CATS,
                options={"temperature": 0, "num_predict": 40, "repeat_penalty": 1})
    assert r.message.content == ("A cat is a majestic creature with a fluffy coat, a playful "
                                 "personality, and a loyal companion.")
    assert r.done and r.done_reason == "stop" and r.model == SMOL
    assert r.prompt_eval_count > 5 and 10 < r.eval_count <= 40
    assert 0 < r.prompt_eval_duration < r.total_duration and r.eval_duration > 0


def test_streamed_chat_folds_into_the_whole_answer(oc) -> None:
    opts = {"temperature": 0.8, "seed": 11, "num_predict": 30}
    whole = oc.chat(model=SMOL, messages=CATS, options=opts)
    parts = list(oc.chat(model=f"{SMOL}:latest", messages=CATS, options=opts, stream=True))
    folded = _fold(parts)
    # streamed: text arrives before the one closing part (how many parts depends on the
    # machine's speed: after the first token, tokens go out together every 100 ms)
    assert [p.done for p in parts].count(True) == 1 and parts[-1].done
    assert any(p.message.content for p in parts[:-1])
    assert folded["content"] == whole.message.content
    assert folded["done"].eval_count == whole.eval_count
    assert folded["done"].done_reason == whole.done_reason


def test_generate_with_the_template_and_raw(oc) -> None:
    r = oc.generate(model=SMOL, prompt="The capital of France is", raw=True,
                    options={"temperature": 0, "num_predict": 3})
    assert r.response.startswith(" Paris") and r.done_reason == "length"
    assert r.eval_count == 3
    templated = oc.generate(model=SMOL, prompt="Write one sentence about cats.",
                            options={"temperature": 0, "num_predict": 40})
    assert templated.response.startswith("A cat is a majestic creature")
    parts = list(oc.generate(model=SMOL, prompt="The capital of France is", raw=True,
                             options={"temperature": 0, "num_predict": 3}, stream=True))
    assert "".join(p.response for p in parts) == r.response and parts[-1].done


def test_format_schema_is_the_grammar_constraint(oc) -> None:
    r = oc.chat(model=SMOL, messages=[{"role": "user", "content": "Name a city in France."}],
                format=CITY, options={"temperature": 0, "num_predict": 60})
    jsonschema.validate(json.loads(r.message.content), CITY)
    r = oc.generate(model=SMOL, prompt="Name a city in France as JSON.", format="json",
                    options={"temperature": 0, "num_predict": 60})
    assert r.done_reason == "stop" and isinstance(json.loads(r.response), dict)
    # with `raw`, the continuation itself is the document (as Ollama does)
    prompt = "A city in France as JSON with its name and country: "
    r = oc.generate(model=SMOL, prompt=prompt, raw=True, format=CITY,
                    options={"temperature": 0, "num_predict": 60})
    assert r.done_reason == "stop"
    jsonschema.validate(json.loads(r.response), CITY)


# sampling from the whole distribution (Ollama's API defaults to temperature 0.8, top_k 40,
# top_p 0.9 where the model sets none)
WHOLE = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "repeat_penalty": 1.0}


@pytest.mark.parametrize("stream", [False, True])
def test_tool_call_round_trip(oc, stream: bool) -> None:
    # the random harmony model calls `light` for this seed (tools constrain its output),
    # sampled from its whole distribution (not Ollama's default top_k / top_p)
    msgs = [{"role": "user", "content": "Lights?"}]
    opts = {"seed": 0, "num_predict": 60, **WHOLE}
    r = oc.chat(model="tiny-gpt-oss", messages=msgs, tools=[LIGHT], options=opts,
                stream=stream)
    if stream:
        folded = _fold(r)
        calls, prompt_tokens = folded["tool_calls"], folded["done"].prompt_eval_count
    else:
        calls, prompt_tokens = [c.model_dump() for c in r.message.tool_calls], \
            r.prompt_eval_count
    assert len(calls) == 1 and calls[0]["function"]["name"] == "light"
    args = calls[0]["function"]["arguments"]
    assert isinstance(args, dict)
    jsonschema.validate(args, LIGHT["function"]["parameters"])
    # the call and its result go back in Ollama's shape
    msgs += [{"role": "assistant", "content": "", "tool_calls": [
                 {"function": {"name": "light", "arguments": args}}]},
             {"role": "tool", "content": "the light is on", "tool_name": "light"}]
    again = oc.chat(model="tiny-gpt-oss", messages=msgs, tools=[LIGHT],
                    options={"seed": 1, "num_predict": 5})
    assert again.done and again.prompt_eval_count > prompt_tokens


def test_think_switch(oc) -> None:
    # the random harmony model reasons for this seed under a JSON constraint
    msgs = [{"role": "user", "content": "hi"}]
    opts = {"seed": 0, "num_predict": 40, **WHOLE}
    on = oc.chat(model="tiny-gpt-oss", messages=msgs, think=True, format="json", options=opts)
    assert on.message.thinking
    streamed = _fold(oc.chat(model="tiny-gpt-oss", messages=msgs, think=True, format="json",
                             options=opts, stream=True))
    assert streamed["thinking"] == on.message.thinking
    off = oc.chat(model="tiny-gpt-oss", messages=msgs, think=False, format="json",
                  options=opts)
    assert not off.message.thinking


def test_num_ctx_bounds_the_context(oc) -> None:
    with pytest.raises(ollama.ResponseError) as err:
        oc.chat(model=SMOL, messages=CATS, options={"num_ctx": 8})
    assert err.value.status_code == 400 and "num_ctx" in err.value.error
    r = oc.chat(model=SMOL, messages=CATS, options={"num_ctx": 40, "temperature": 0})
    assert r.done_reason == "length" and r.prompt_eval_count + r.eval_count <= 40


def test_load_requests_answer_at_once(oc) -> None:
    assert oc.chat(model=SMOL, messages=[]).done_reason == "load"
    assert oc.generate(model=SMOL, keep_alive=0).done_reason == "unload"


@pytest.mark.parametrize("call,status,text", [
    (lambda oc: oc.chat(model="nope", messages=CATS), 404, "nope"),
    (lambda oc: oc.show("nope"), 404, "nope"),
    (lambda oc: oc.chat(model=SMOL, messages=[{"role": "user", "content": "what is this?",
                                               "images": [b"\x89PNG"]}]), 400, "images"),
    # (no range is refused, as Ollama's; a value of the wrong type is)
    (lambda oc: oc.chat(model=SMOL, messages=CATS, options={"temperature": "hot"}), 400,
     "temperature"),
    (lambda oc: oc.generate(model=SMOL, prompt="x", suffix="y"), 400, "suffix"),
    (lambda oc: oc.chat(model=SMOL, messages=CATS, format={"type": "object",
                                                            "properties": 3}), 400, ""),
])
def test_errors_are_ollama_shaped(oc, call, status: int, text: str) -> None:
    with pytest.raises(ollama.ResponseError) as err:
        call(oc)
    assert err.value.status_code == status and text in err.value.error


def test_errors_in_a_stream_request_come_before_the_stream(client) -> None:
    r = client.post("/api/chat", json={"model": SMOL, "messages": CATS,
                                       "options": {"num_ctx": 0}})
    assert r.status_code == 400 and set(r.json()) == {"error"}
    r = client.post("/api/generate", content=b"{not json")
    assert r.status_code == 400 and set(r.json()) == {"error"}


def test_what_is_not_served_is_an_ollama_error(oc, client) -> None:
    with pytest.raises(ollama.ResponseError) as err:
        oc.pull("llama3")  # no registry here: models come from the config
    assert err.value.status_code == 404 and "/api/pull" in err.value.error
    r = client.get("/api/chat")
    assert r.status_code == 405 and isinstance(r.json()["error"], str)


def test_api_key_applies_to_ollamas_routes(serve_url) -> None:
    anonymous = ollama.Client(host=serve_url + "/secured", timeout=60)
    with pytest.raises(ollama.ResponseError) as err:
        anonymous.list()
    assert err.value.status_code == 401
    keyed = ollama.Client(host=serve_url + "/secured", timeout=60,
                          headers={"Authorization": f"Bearer {SECRET}"})
    # (the secured app's other model cannot load: listed all the same, as /v1/models does)
    assert [m.model for m in keyed.list().models] == ["flm-tiny:latest", f"{UNLOADABLE}:latest"]
    r = keyed.chat(model="flm-tiny", messages=CATS, options={"num_predict": 3})
    assert r.eval_count == 3
