"""Ollama's API without Ray: its requests become the worker's, the worker's events become
its NDJSON lines and final objects, and its model listings."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.events import ChatGenerate, CompletionGenerate, Deltas, Failed, Finished, Usage
from chat import ChatMsg, ChatStream, Delta, FormatKind, ToolCall, spec_for_kind
from deployments.errors import ApiError
from deployments.ollama import reply as ollama_reply
from deployments.ollama import request


def _chat(**body):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}
    return request.chat_request(request.decode(json.dumps(body).encode(), request.ChatIn))


def _generate(**body):
    body = {"model": "m", "prompt": "hi", **body}
    return request.generate_request(request.decode(json.dumps(body).encode(), request.GenerateIn))


def test_options_become_the_sampling_fields() -> None:
    g = _chat(options={"num_predict": 7, "temperature": 0.2, "top_p": 0.9, "top_k": 5,
                       "min_p": 0.1, "seed": 3, "stop": "END", "repeat_penalty": 1.2,
                       "presence_penalty": 0.5, "frequency_penalty": 0.25, "num_ctx": 512,
                       "num_gpu": 99, "mirostat": 1})
    assert (g.max_tokens, g.temperature, g.top_p, g.top_k, g.min_p, g.seed) == \
        (7, 0.2, 0.9, 5, 0.1, 3)
    assert g.stop == ["END"] and g.repetition_penalty == 1.2
    assert (g.presence_penalty, g.frequency_penalty, g.context_limit) == (0.5, 0.25, 512)
    assert isinstance(g, ChatGenerate) and g.messages == [{"role": "user", "content": "hi"}]
    assert g.drop_history  # past num_ctx, the oldest messages go (as Ollama's)
    assert not _generate(options={"num_ctx": 512}).drop_history  # one prompt: refused


@pytest.mark.parametrize("seed", [42.0, 42.9])
def test_a_seed_number_is_read_into_an_integer(seed: float) -> None:
    """As Ollama reads a JSON number into its integer options (JavaScript clients send
    42.0 as 42, others write 42.0): the same seed, not a 400."""
    assert _chat(options={"seed": seed}).seed == 42
    assert _generate(options={"seed": seed}).seed == 42
    assert _chat(options={"seed": -1}).seed is None  # Ollama's runner: a random seed


@pytest.mark.parametrize("n", [-1, -2])
def test_num_predict_below_zero_is_no_limit(n: int) -> None:
    assert _chat(options={"num_predict": n}).max_tokens is None
    assert _generate(raw=True, options={"num_predict": n}).max_tokens is None


def test_format_and_think_become_the_constraint_and_the_thinking_switch() -> None:
    assert _chat(format="json").constraint.response_format == "json_object"
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    c = _chat(format=schema).constraint
    assert c.response_format == "json_schema" and c.json_schema == schema
    assert _chat(format="").constraint.response_format == "text"
    off = _chat(think=False)
    assert off.thinking is False and not off.constraint.allow_reasoning
    # an effort is thinking on, as Ollama reads it (Gemma 4's template, off by default,
    # stayed off for "high": found probing live)
    high = _chat(think="high")
    assert high.template_kwargs == {"reasoning_effort": "high"} and high.thinking is True


def test_messages_in_ollamas_shape() -> None:
    g = _chat(messages=[
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "thinking": "I should call it",
         "tool_calls": [{"function": {"name": "get", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "content": "12C", "tool_name": "get"}],
        tools=[{"type": "function", "function": {"name": "get", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}}}}])
    assistant, tool = g.messages[1], g.messages[2]
    assert assistant["reasoning_content"] == "I should call it"
    call = assistant["tool_calls"][0]
    assert call["function"] == {"name": "get", "arguments": {"city": "Oslo"}}
    assert call["id"]
    assert tool == {"role": "tool", "content": "12C", "name": "get"}
    assert g.tools[0]["function"]["name"] == "get"
    assert [t.name for t in g.constraint.tools] == ["get"]


def test_an_empty_tool_list_is_no_tools() -> None:
    # the ollama client always sends "tools": []
    g = _chat(tools=[])
    assert g.tools is None and g.constraint.tools == ()


def test_unset_options_take_ollamas_defaults_where_the_model_has_none() -> None:
    """Found probing live: /api/chat without options (Open WebUI's default) sampled SmolLM2
    at temperature 1.0 over its whole vocabulary (60 tokens of rambling to "hi"), and with
    no num_predict ran on to the context's end on 2 seeds of 6; Ollama's defaults are
    temperature 0.8, top_k 40, top_p 0.9, repeat_penalty 1.1 over the last 64 tokens. A
    model's own generation_config, a variant's parameters and the request's options come
    first."""
    from actors.session import sampling_base
    from npu import SamplingParams

    ollamas = {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "repetition_penalty": 1.1}
    for g in (_chat(), _generate(), _generate(raw=True), _chat(options={"temperature": 0})):
        assert g.sampling_fallback == ollamas
        assert g.repeat_last_n == 64  # the API's window, whatever the model
    assert _chat(options={"temperature": 0}).temperature == 0.0  # the request's own first
    assert [_chat(options={"repeat_last_n": n}).repeat_last_n for n in (0, -1, -5, 8.0)] \
        == [0, -1, -1, 8]  # 0: no penalty; -1 (any below): the whole context
    gguf = sampling_base(SamplingParams(), _chat().sampling_fallback)
    assert (gguf.temperature, gguf.top_k, gguf.top_p, gguf.min_p, gguf.repetition_penalty) \
        == (0.8, 40, 0.9, 0.0, 1.1)
    qwen3 = SamplingParams(temperature=0.6, top_k=20, top_p=0.95)  # its generation_config
    assert sampling_base(qwen3, _chat().sampling_fallback) == qwen3
    assert sampling_base(SamplingParams(), None) == SamplingParams()  # the other APIs


def test_options_past_openais_ranges_are_read_as_ollama_reads_them() -> None:
    """Ollama checks no option's range and reads a number into an integer option: values a
    slider or a script sends (temperature 2.5, 20 stop strings, num_predict 6.0) are taken,
    as llama.cpp's samplers read them, not refused."""
    stops = [f"s{i}" for i in range(20)]
    for g in (_chat(options={"temperature": 2.5, "presence_penalty": 3, "frequency_penalty": -3,
                             "repeat_penalty": 12, "stop": stops, "num_predict": 6.0,
                             "top_k": 5.0, "num_ctx": 300.0}),
              _generate(raw=True, options={"temperature": 2.5, "presence_penalty": 3,
                                           "frequency_penalty": -3, "repeat_penalty": 12,
                                           "stop": stops, "num_predict": 6.0, "top_k": 5.0,
                                           "num_ctx": 300.0})):
        assert (g.temperature, g.presence_penalty, g.frequency_penalty,
                g.repetition_penalty) == (2.5, 3, -3, 12)
        assert (g.stop, g.max_tokens, g.top_k, g.context_limit) == (stops, 6, 5, 300)
    low = _chat(options={"temperature": -1, "top_p": 0, "min_p": 2, "repeat_penalty": 0})
    assert (low.temperature, low.top_p, low.min_p, low.repetition_penalty) == \
        (0.0, 1e-9, 1.0, 1.0)  # greedy, the likeliest token, the top's ties, no penalty
    assert _chat(options={"top_k": -1}).top_k == 0  # off, as llama.cpp reads it
    assert _chat(options={"top_p": 5}).top_p == 1.0
    assert _chat(options={"num_predict": 0}).max_tokens == 0  # the prompt alone, no reply


@pytest.mark.parametrize("body,param", [
    ({"options": {"temperature": "hot"}}, "options.temperature"),
    ({"options": {"num_ctx": 0}}, "options.num_ctx"),
    ({"format": "xml"}, "format"),
    ({"think": "a lot"}, "think"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]},
     "messages[0].images"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]},
     "tools[0].function.name"),
    ({"stream": "yes"}, "stream"),
])
def test_bad_requests_name_ollamas_field(body: dict, param: str) -> None:
    with pytest.raises(ApiError) as err:
        _chat(**body)
    assert err.value.status == 400
    assert err.value.param == param, err.value.message
    if " - at `$" in err.value.message:  # the text names Ollama's field too
        assert f"`$.{param}`" in err.value.message, err.value.message
    elif param in ("think", "format"):  # the field quoted in the text is the one sent
        assert f"'{param}'" in err.value.message, err.value.message


def test_raw_generate_takes_ollamas_boolean_logprobs() -> None:
    g = _generate(raw=True, logprobs=True, top_logprobs=3)
    assert isinstance(g, CompletionGenerate) and g.logprobs and g.top_logprobs == 3
    g = _generate(raw=True, logprobs=True)
    assert g.logprobs and g.top_logprobs == 0
    assert not _generate(raw=True).logprobs
    with pytest.raises(ApiError) as err:  # named as sent, not as completions' field
        _generate(raw=True, logprobs=True, top_logprobs=30)
    assert err.value.param == "top_logprobs" and "`$.top_logprobs`" in err.value.message


@pytest.mark.parametrize("think,required", [(True, True), ("high", True), (False, False),
                                            ("none", False), (None, False)])
def test_think_asks_the_model_to_be_able_to(think, required: bool) -> None:
    assert _chat(think=think).require_thinking is required
    assert _generate(think=think).require_thinking is required
    if not required:  # nothing to switch on: a raw prompt takes it too
        assert not _generate(raw=True, think=think).constraint.allow_reasoning


def test_tools_ask_the_model_to_be_able_to_call_them() -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    assert _chat(tools=[tool]).require_tools and not _chat().require_tools
    assert not _chat(tools=[]).require_tools


def test_a_last_assistant_message_is_continued() -> None:
    hi = [{"role": "user", "content": "hi"}]
    begun = _chat(messages=hi + [{"role": "assistant", "content": "Well,"}])
    assert begun.continue_final and begun.messages[-1]["content"] == "Well,"
    empty = _chat(messages=hi + [{"role": "assistant", "content": ""}])
    assert not empty.continue_final and empty.messages[-1]["role"] == "user"
    assert not _chat().continue_final


def test_generate_uses_the_chat_template_unless_raw() -> None:
    g = _generate(system="Be brief.")
    assert isinstance(g, ChatGenerate)
    assert g.messages == [{"role": "system", "content": "Be brief."},
                          {"role": "user", "content": "hi"}]
    raw = _generate(prompt="<|im_start|>user\nhi", raw=True)
    assert isinstance(raw, CompletionGenerate) and raw.prompt == "<|im_start|>user\nhi"
    assert raw.max_tokens is None  # Ollama's default: no limit (OpenAI's 16 is not used)


def test_a_raw_generate_takes_a_format_for_its_continuation() -> None:
    raw = _generate(prompt="{", raw=True, format="json")
    assert isinstance(raw, CompletionGenerate) and raw.constraint.response_format == "json_object"
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    raw = _generate(prompt="x", raw=True, format=schema)
    assert raw.constraint.response_format == "json_schema" and raw.constraint.json_schema == schema
    assert not raw.constraint.allow_reasoning
    assert _generate(prompt="x", raw=True).constraint.response_format == "text"


@pytest.mark.parametrize("body,param", [
    ({"raw": True, "format": "xml"}, "format"),
    ({"raw": True, "think": True}, "think"),
    ({"suffix": "return x", "think": "high"}, "think"),
    ({"template": "{{ .Prompt }}"}, "template"),
    ({"context": [1, 2, 3]}, "context"),
    ({"images": ["aGk="]}, "images"),
])
def test_generate_refuses_what_it_cannot_do(body: dict, param: str) -> None:
    with pytest.raises(ApiError) as err:
        _generate(**body)
    assert err.value.status == 400 and err.value.param == param


def test_model_names_take_the_latest_tag() -> None:
    assert request.model_name("smollm2-135m:latest") == "smollm2-135m"
    assert request.model_name("smollm2-135m") == "smollm2-135m"
    assert request.model_name("a:q4") == "a:q4"


def test_load_requests_answer_done() -> None:
    body = ollama_reply.load_reply("m", "chat", None)
    assert body["done"] and body["done_reason"] == "load" and body["message"]["content"] == ""
    assert ollama_reply.load_reply("m", "generate", 0)["done_reason"] == "unload"


def test_an_unload_reaches_the_workers_for_a_model_no_longer_listed() -> None:
    """keep_alive 0 for a name the folder no longer lists (its file removed while loaded)
    goes to the workers, who unload it (or answer 404); any other request for it is a 404
    at once."""
    import asyncio

    asked: list[tuple[str, float | None]] = []

    class Ingress:
        streams: dict = {}

        def resolve(self, name: str) -> None:
            return None

        async def load(self, model: str, keep: float | None) -> dict:
            asked.append((model, keep))
            return {"done_reason": "unload"}

    for api, body in [(request.chat_call, {"model": "gone:latest", "messages": []}),
                      (request.generate_call, {"model": "gone:latest"})]:
        call = api(json.dumps({**body, "keep_alive": 0}).encode(), Ingress())
        answer = json.loads(asyncio.run(call.later()).body)
        assert answer["done_reason"] == "unload"
        with pytest.raises(ApiError) as err:
            api(json.dumps(body).encode(), Ingress())
        assert err.value.status == 404
    assert asked == [("gone", 0), ("gone", 0)]


# -- answers --------------------------------------------------------------------------------
def _events(content: list[str], thinking: list[str] = (), calls: list[ToolCall] = (),
            reason: str = "stop", cut: bool = False) -> list:
    evs: list = [Deltas(index=0, deltas=[Delta(field="reasoning_content", text=t)])
                 for t in thinking]
    evs += [Deltas(index=0, deltas=[Delta(field="content", text=t)]) for t in content]
    for i, c in enumerate(calls):
        evs.append(Deltas(index=0, deltas=[Delta(field="tool_call", text=c.arguments, index=i,
                                                 id=c.id, name=c.name)]))
    msg = ChatMsg(reasoning_content="".join(thinking), content="".join(content),
                  tool_calls=list(calls))
    n = len(evs)
    return evs + [Finished(index=0, finish_reason=reason, completion_tokens=n, message=msg,
                           cut=cut),
                  Usage(prompt_tokens=11, completion_tokens=n)]


def _fold_lines(lines: list[dict]) -> dict:
    """What a client folding Ollama's stream ends with."""
    msg = {"content": "", "thinking": "", "tool_calls": []}
    for line in lines:
        m = line["message"]
        msg["content"] += m["content"]
        msg["thinking"] += m.get("thinking", "")
        msg["tool_calls"] += m.get("tool_calls", [])
    return msg


def test_a_stream_is_lines_then_one_done_object() -> None:
    reply = ollama_reply.OllamaReply("m:latest", "chat", started=0.0)
    lines = reply.add(_events(["Hel", "lo"], thinking=["hmm"]))
    assert [line["done"] for line in lines] == [False, False, False, True]
    assert lines[0]["message"] == {"role": "assistant", "content": "", "thinking": "hmm"}
    assert lines[1]["message"] == {"role": "assistant", "content": "Hel"}
    done = lines[-1]
    assert done["model"] == "m:latest" and done["created_at"].endswith("Z")
    assert done["done_reason"] == "stop"
    assert (done["prompt_eval_count"], done["eval_count"]) == (11, 3)
    for key in ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration"):
        assert isinstance(done[key], int) and done[key] >= 0


def test_a_cold_requests_prompt_eval_duration_leaves_the_load_out() -> None:
    """As Ollama's: the parts add up within the total (a client's prompt tokens/s is not
    the load's)."""
    import time

    from actors.events import Accepted

    started = time.perf_counter() - 2.0  # the request came 2 s ago, 1.5 of them loading
    reply = ollama_reply.OllamaReply("m", "chat", started=started)
    done = reply.add([Accepted(request_id="r", model="m", prompt_tokens=11, load_s=1.5),
                      *_events(["Hi"])])[-1]
    assert done["load_duration"] == 1_500_000_000
    assert 0 < done["prompt_eval_duration"] <= 0.6e9
    parts = done["load_duration"] + done["prompt_eval_duration"] + done["eval_duration"]
    assert parts <= done["total_duration"]


def test_tool_calls_come_whole_with_arguments_as_an_object() -> None:
    calls = [ToolCall(name="get", arguments='{"city": "Oslo"}', id="call_1"),
             ToolCall(name="get", arguments='{"city": "Rome"}', id="call_2")]
    reply = ollama_reply.OllamaReply("m", "chat", started=0.0)
    lines = reply.add(_events([], calls=calls, reason="tool_calls"))
    with_calls = [line for line in lines if line["message"].get("tool_calls")]
    assert len(with_calls) == 1
    got = with_calls[0]["message"]["tool_calls"]
    assert [c["function"]["arguments"] for c in got] == [{"city": "Oslo"}, {"city": "Rome"}]
    assert [c["function"]["index"] for c in got] == [0, 1]
    assert lines[-1]["done_reason"] == "stop"
    whole = ollama_reply.OllamaReply("m", "chat", started=0.0)
    whole.add(_events([], calls=calls, reason="tool_calls"))
    assert whole.final()["message"]["tool_calls"] == got


@pytest.mark.parametrize("arguments", ['{"city": "Os', ""])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("reason", ["length", "stop"])  # the token limit, or a stop string
def test_a_call_cut_by_the_token_limit_is_text(arguments: str, stream: bool,
                                              reason: str) -> None:
    """Cut with its arguments begun, or before any (the name written): never a call with
    `{}` for arguments an agent would run."""
    done = [ToolCall(name="get", arguments='{"city": "Rome"}', id="call_0")]
    cut = done + [ToolCall(name="get", arguments=arguments, id="call_1")]
    reply = ollama_reply.OllamaReply("m", "chat", started=0.0)
    lines = reply.add(_events([], calls=cut, reason=reason, cut=True))
    final = _fold_lines(lines) if stream else reply.final()["message"]
    assert [c["function"]["arguments"] for c in final.get("tool_calls", [])] == [
        {"city": "Rome"}]  # the whole call before it stays a call
    assert final["content"] == '{"name": "get", "arguments": ' + arguments
    assert lines[-1]["done_reason"] == reason


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_cut_before_its_name_was_whole_is_text(stream: bool) -> None:
    """The parse holds a tool block back until its call is named: cut by the limit there,
    the block comes back as the text the model wrote (not dropped), after what preceded it."""
    chat = ChatStream(spec_for_kind(FormatKind.HERMES_JSON))
    deltas = chat.update('Sure. <tool_call>{"name": "get')
    events = [Deltas(index=0, deltas=deltas),
              Finished(index=0, finish_reason="length", completion_tokens=9,
                       message=chat.message, cut_block=chat.cut_block),
              Usage(prompt_tokens=11, completion_tokens=9)]
    reply = ollama_reply.OllamaReply("m", "chat", started=0.0)
    lines = reply.add(events)
    final = _fold_lines(lines) if stream else reply.final()["message"]
    assert final["content"] == 'Sure.<tool_call>{"name": "get'
    assert not final.get("tool_calls") and lines[-1]["done_reason"] == "length"


def test_a_call_without_arguments_that_ended_is_a_call() -> None:
    calls = [ToolCall(name="now", arguments="", id="call_0")]
    reply = ollama_reply.OllamaReply("m", "chat", started=0.0)
    reply.add(_events([], calls=calls, reason="tool_calls"))
    assert reply.final()["message"]["tool_calls"][0]["function"]["arguments"] == {}


@given(st.lists(st.text(max_size=5), max_size=6), st.lists(st.text(max_size=5), max_size=3))
def test_stream_and_whole_answers_agree(content: list[str], thinking: list[str]) -> None:
    events = _events(content, thinking)
    streamed = ollama_reply.OllamaReply("m", "chat", started=0.0).add(events)
    whole = ollama_reply.OllamaReply("m", "chat", started=0.0)
    whole.add(events)
    final = whole.final()
    folded = _fold_lines(streamed)
    assert folded["content"] == final["message"]["content"]
    assert folded["thinking"] == final["message"].get("thinking", "")
    assert streamed[-1]["done"] and final["done"]
    assert streamed[-1]["eval_count"] == final["eval_count"]


def test_generate_answers_carry_response_and_thinking() -> None:
    reply = ollama_reply.OllamaReply("m", "generate", started=0.0)
    lines = reply.add(_events(["4"], thinking=["2+2"]))
    assert lines[0]["thinking"] == "2+2" and lines[1]["response"] == "4"
    assert "message" not in lines[0]
    final = reply.final()
    assert final["response"] == "4" and final["thinking"] == "2+2"
    raw = ollama_reply.OllamaReply("m", "generate", started=0.0)
    raw.add([Deltas(index=0, text="once"), Deltas(index=0, text=" upon"),
             Finished(index=0, finish_reason="length", completion_tokens=2),
             Usage(prompt_tokens=1, completion_tokens=2)])
    assert raw.final()["response"] == "once upon" and raw.final()["done_reason"] == "length"


def test_a_worker_failure_is_an_error_line() -> None:
    reply = ollama_reply.OllamaReply("m", "chat", started=0.0)
    assert reply.add([Failed(message="boom")]) == [{"error": "boom"}]
    assert reply.error == "boom"


def test_model_listings() -> None:
    info = {"id": "m", "created": 1_700_000_000, "context_length": 8192,
            "architecture": "llama", "capabilities": ["completion", "tools"],
            "file_format": "gguf", "weight_bytes": 96_438_528, "parameters": 134_480_448,
            "quantization": "Q4_1", "template": "{{ messages }}"}
    tag = ollama_reply.tag("m", info)
    assert tag["name"] == tag["model"] == "m:latest" and tag["size"] == 96_438_528
    assert tag["details"]["parameter_size"] == "134M"
    for params, size in [(7_615_616_512, "7.6B"), (102_400, "102K"), (640, "640"), (0, "")]:
        assert ollama_reply.tag("m", {**info, "parameters": params})["details"][
            "parameter_size"] == size  # a toy model is no "0M"; an unread count none
    assert tag["details"]["quantization_level"] == "Q4_1"
    assert tag["details"]["format"] == "gguf" and tag["modified_at"].startswith("2023-11-14")
    show = ollama_reply.show(info)
    assert show["model_info"]["llama.context_length"] == 8192
    assert "llama.embedding_length" not in show["model_info"]  # not known: not made up
    shown = ollama_reply.show({**info, "embedding_length": 576})["model_info"]
    assert shown["llama.embedding_length"] == 576
    assert show["model_info"]["general.architecture"] == "llama"
    assert show["capabilities"] == ["completion", "tools"]
    assert show["template"] == "{{ messages }}"
    ps = ollama_reply.ps_entry("m", info)
    assert ps["context_length"] == 8192 and ps["size_vram"] == 0
    # every object is JSON (the ingress encodes them with msgspec)
    msgspec.json.encode([tag, show, ps])


@pytest.mark.parametrize("body,param", [
    ({"model": "v", "from": "m", "files": {"a.gguf": "sha256:1"}}, "files"),
    ({"model": "v"}, "from"),
    ({"model": "v", "modelfile": "SYSTEM hi"}, "from"),
    ({"model": "v", "from": "m", "parameters": {"mirostat": 1}}, "parameters.mirostat"),
    ({"model": "v", "from": "m", "parameters": {"temperature": "hot"}}, "parameters"),
    ({"model": "v", "from": "m", "parameters": {"num_ctx": 0}}, "parameters.num_ctx"),
    # every API's requests take a variant's parameters: what they would refuse, create does
    ({"model": "v", "from": "m", "parameters": {"temperature": 3}}, "parameters"),
    ({"model": "v", "modelfile": "FROM m\nADAPTER ./lora.gguf"}, "modelfile"),
    ({"model": "v", "modelfile": "FROM m\nSYSTEM \"\"\"never closed"}, "modelfile"),
    ({"model": "v", "modelfile": "FROM m\nWHATEVER x"}, "modelfile"),
])
def test_create_refuses_what_a_variant_cannot_be_by_name(body: dict, param: str) -> None:
    with pytest.raises(ApiError) as err:
        request.variant_request(request.decode(json.dumps(body).encode(), request.CreateIn))
    assert err.value.status == 400 and err.value.param == param


def test_an_open_triple_quote_over_many_lines_is_refused_in_one_pass() -> None:
    """Each line of a multi-line value is looked at once: an unclosed SYSTEM over 500,000
    lines (1 MB) held the event loop for 80 s when the value so far was searched at each
    line. The bound is a hundred times what it takes now."""
    import time

    from deployments.ollama.modelfile import parse_modelfile

    start = time.perf_counter()
    with pytest.raises(ApiError, match="not closed"):
        parse_modelfile('FROM m\nSYSTEM """' + "\n" * 500_000)
    assert time.perf_counter() - start < 5.0
    assert parse_modelfile('FROM m\nSYSTEM """a\n\nb"""\nPARAMETER top_k 3') == {
        "from": "m", "system": "a\n\nb", "parameters": {"top_k": 3}}


def test_create_reads_numbers_into_integer_parameters() -> None:
    body = {"model": "v", "from": "m", "parameters": {"top_k": 40.0, "num_predict": 5.0,
                                                      "repeat_last_n": -3.0}}
    v = request.variant_request(request.decode(json.dumps(body).encode(), request.CreateIn))
    assert v.parameters == {"top_k": 40, "num_predict": 5, "repeat_last_n": -1}
    assert all(isinstance(x, int) for x in v.parameters.values())


def test_create_keeps_the_parameters_it_can_apply() -> None:
    body = {"model": "v", "from": "m", "system": "s", "template": "{{ .Prompt }}",
            "parameters": {"temperature": 0, "num_predict": 5, "stop": ["x"], "num_ctx": 2048}}
    req = request.decode(json.dumps(body).encode(), request.CreateIn)
    v = request.variant_request(req)
    assert v.parameters == body["parameters"] and v.source == "m"
    assert v.system == "s" and v.template == "{{ .Prompt }}"


def test_a_modelfile_is_read_as_ollama_reads_it_and_the_fields_win() -> None:
    modelfile = (
        '# a comment\nFROM qwen3\nSYSTEM """You are terse.\nAlways."""\n'
        'TEMPLATE """{{ if .System }}S:{{ .System }}\n{{ end }}U:{{ .Prompt }}\nA:"""\n'
        'parameter temperature 0.2\nPARAMETER num_predict 8\nPARAMETER stop "<|end|>"\n'
        'PARAMETER stop "User:"\nLICENSE """MIT"""\n')
    v = request.variant_request(request.decode(json.dumps(
        {"model": "v", "modelfile": modelfile, "parameters": {"num_predict": 3}}).encode(),
        request.CreateIn))
    assert v.source == "qwen3" and v.system == "You are terse.\nAlways."
    assert v.template == "{{ if .System }}S:{{ .System }}\n{{ end }}U:{{ .Prompt }}\nA:"
    assert v.parameters == {"temperature": 0.2, "num_predict": 3, "stop": ["<|end|>", "User:"]}


def test_listings_show_the_digest_as_ollama_does() -> None:
    """/api/tags and /api/ps: 64 hex digits, no `sha256:` (clients show its first 12)."""
    info = {"digest": "sha256:" + "ab" * 32, "weight_bytes": 5}
    assert ollama_reply.tag("m", info)["digest"] == "ab" * 32
    assert ollama_reply.ps_entry("m", info)["digest"] == "ab" * 32
    assert ollama_reply.tag("m", {})["digest"] == ""
