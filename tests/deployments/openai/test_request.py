"""Every field of a chat and a completion request, given a value of the wrong type or
shape, is a 400 whose `param` is that field's exact path (table-driven, no Ray)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from actors.events import ChatGenerate, CompletionGenerate
from deployments.errors import ApiError
from deployments.openai.request import _usage_options, decode_request, generate_request
from deployments.openai.schemas import ChatRequest, CompletionRequest

TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city.", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
CHAT = {
    "model": "m", "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 5,
    "n": 1, "temperature": 0.5, "top_p": 0.9, "top_k": 5, "min_p": 0.1,
    "repetition_penalty": 1.1, "presence_penalty": 0.1, "frequency_penalty": 0.1, "seed": 1,
    "stop": ["x"], "user": "u", "ignore_eos": False, "max_completion_tokens": 5,
    "logprobs": True, "top_logprobs": 2,
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}],
         "name": "ann"},
        {"role": "assistant", "content": None, "reasoning_content": "r", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ],
    "tools": [TOOL], "tool_choice": "auto", "parallel_tool_calls": True,
    "response_format": {"type": "json_schema", "json_schema": {
        "name": "w", "strict": True, "schema": {"type": "object"}}},
    "think": True, "reasoning_effort": "low", "chat_template_kwargs": {"enable_thinking": True},
}
COMPLETION = {"model": "m", "prompt": "Once", "max_tokens": 5, "logprobs": 2, "echo": False,
              "suffix": "", "stream": False, "temperature": 1.0, "stop": "x",
              "response_format": {"type": "json_schema", "json_schema": {
                  "name": "w", "schema": {"type": "object"}}}}

# (path to set, bad value, the param the 400 names); a path ends in a key or an index
CHAT_CASES: list[tuple[str, Any, str]] = [
    ("model", 3, "model"),
    ("stream", "yes", "stream"),
    ("stream_options", [], "stream_options"),
    ("stream_options.include_usage", "y", "stream_options.include_usage"),
    ("max_tokens", 0, "max_tokens"),
    ("max_tokens", 1.5, "max_tokens"),
    ("n", 9, "n"),
    ("temperature", 3, "temperature"),
    ("top_p", 0, "top_p"),
    ("top_k", -2, "top_k"),
    ("min_p", "a", "min_p"),
    ("repetition_penalty", 0, "repetition_penalty"),
    ("presence_penalty", 5, "presence_penalty"),
    ("logit_bias", {"abc": 5}, "logit_bias"),
    ("logit_bias", {"42": 500}, "logit_bias"),
    ("logit_bias", {"-3": 1}, "logit_bias"),
    ("logit_bias", [1], "logit_bias"),
    ("frequency_penalty", -5, "frequency_penalty"),
    ("seed", "1", "seed"),
    ("stop", 5, "stop"),
    ("stop", ["a"] * 9, "stop"),
    ("user", 1, "user"),
    ("ignore_eos", 1, "ignore_eos"),
    ("max_completion_tokens", -1, "max_completion_tokens"),
    ("logprobs", "true", "logprobs"),
    ("top_logprobs", 21, "top_logprobs"),
    ("messages", [], "messages"),
    ("messages", "hi", "messages"),
    ("messages.0", "hi", "messages[0]"),
    ("messages.0.role", "robot", "messages[0]"),
    ("messages.0.role", 1, "messages[0].role"),
    ("messages.0.content", 5, "messages[0].content"),
    ("messages.1.content.0", "text", "messages[1].content[0]"),
    ("messages.1.content.0.type", "image_url", "messages[1].content[0].type"),
    ("messages.1.content.0.type", 1, "messages[1].content[0].type"),
    ("messages.1.content.0.text", None, "messages[1].content[0].text"),
    ("messages.1.content.0.text", [], "messages[1].content[0].text"),
    ("messages.1.content.0.type", "refusal", "messages[1].content[0].type"),  # a user's
    ("messages.2.content", [{"type": "refusal"}], "messages[2].content[0].refusal"),
    ("messages.1.name", {}, "messages[1].name"),
    ("messages.1.tool_calls", [{"function": {"name": "f"}}], "messages[1].tool_calls"),
    ("messages.2.reasoning_content", 1, "messages[2].reasoning_content"),
    ("messages.2.tool_calls", {}, "messages[2].tool_calls"),
    ("messages.2.tool_calls.0.type", "code", "messages[2].tool_calls[0].type"),
    ("messages.2.tool_calls.0.id", 7, "messages[2].tool_calls[0].id"),
    ("messages.2.tool_calls.0.function", "f", "messages[2].tool_calls[0].function"),
    ("messages.2.tool_calls.0.function.name", None, "messages[2].tool_calls[0].function.name"),
    ("messages.2.tool_calls.0.function.arguments", 3,
     "messages[2].tool_calls[0].function.arguments"),
    ("messages.3.tool_call_id", 1, "messages[3].tool_call_id"),
    ("tools", {}, "tools"),
    ("tools.0", "get_weather", "tools[0]"),
    ("tools.0.type", "retrieval", "tools[0].type"),
    ("tools.0.type", [], "tools[0].type"),
    ("tools.0.function", [], "tools[0].function"),
    ("tools.0.function.name", "", "tools[0].function.name"),
    ("tools.0.function.name", "get weather!", "tools[0].function.name"),
    ("tools.0.function.description", [], "tools[0].function.description"),
    ("tools.0.function.strict", "yes", "tools[0].function.strict"),
    ("tools.0.function.parameters", [], "tools[0].function.parameters"),
    ("tools.0.function.parameters.type", "array", "tools[0].function.parameters"),
    ("tools.0.function.parameters.properties", [], "tools[0].function.parameters.properties"),
    ("tools.0.function.parameters.properties.city", "string",
     "tools[0].function.parameters.properties.city"),
    ("tools.0.function.parameters.required", "city", "tools[0].function.parameters.required"),
    ("tool_choice", "always", "tool_choice"),
    ("tool_choice", 1, "tool_choice"),
    ("tool_choice", {"type": "function", "function": {"name": "nope"}},
     "tool_choice.function.name"),
    ("tool_choice", {"type": "function", "function": {"name": 1}},
     "tool_choice.function.name"),
    ("tool_choice", {"type": "web"}, "tool_choice.type"),
    ("parallel_tool_calls", "no", "parallel_tool_calls"),
    ("response_format", "json", "response_format"),
    ("response_format.type", "xml", "response_format.type"),
    ("response_format.json_schema", "s", "response_format.json_schema"),
    ("response_format.json_schema.name", 1, "response_format.json_schema.name"),
    ("response_format.json_schema.strict", "y", "response_format.json_schema.strict"),
    ("response_format.json_schema.schema", [], "response_format.json_schema.schema"),
    ("think", "no", "think"),
    ("reasoning_effort", "max", "reasoning_effort"),
    ("chat_template_kwargs", [], "chat_template_kwargs"),
    ("chat_template_kwargs.enable_thinking", "no", "chat_template_kwargs.enable_thinking"),
]
COMPLETION_CASES: list[tuple[str, Any, str]] = [
    ("prompt", 5, "prompt"),
    ("prompt", [], "prompt"),
    ("prompt", ["a", "b"], "prompt"),
    ("prompt", [[1, 2], [3]], "prompt"),
    ("prompt", [1.5], "prompt"),
    ("prompt", [-1], "prompt"),
    ("prompt", [[]], "prompt"),
    ("logprobs", 21, "logprobs"),
    ("echo", "no", "echo"),
    ("suffix", 1, "suffix"),
    ("max_tokens", "5", "max_tokens"),
    ("response_format", "json", "response_format"),
    ("response_format.type", "xml", "response_format.type"),
    ("response_format.json_schema", {"name": "x", "schema": "s"},
     "response_format.json_schema.schema"),
    ("best_of", 3, "best_of"),  # more than n: not run (vLLM's V1 refuses it too), not ignored
    ("best_of", 0, "best_of"),
]


def test_best_of_as_many_as_n_is_n() -> None:
    for body in ({"best_of": 1}, {"best_of": 2, "n": 2}):
        greq = generate_request(*decode_request(json.dumps({**COMPLETION, **body}).encode(),
                                                CompletionRequest))
        assert greq.n == body.get("n", 1)
    err = _error({**COMPLETION, "best_of": 1, "n": 2}, "completion")
    assert err.param == "best_of" and "'n' (2)" in err.message


@pytest.mark.parametrize("kind,body", [("chat", {"max_completion_tokens": 30}),
                                       ("completion", {"max_tokens": 30})])
def test_min_tokens_reaches_the_worker_and_no_more_than_the_most(kind: str, body: dict) -> None:
    """vLLM's min_tokens (was ignored); more than the most tokens asked for is a 400."""
    base = {**(CHAT if kind == "chat" else COMPLETION), **body}
    greq = generate_request(*decode_request(json.dumps({**base, "min_tokens": 30}).encode(),
                                            SCHEMAS[kind]))
    assert greq.min_tokens == 30
    err = _error({**base, "min_tokens": 31}, kind)
    assert (err.status, err.param) == (400, "min_tokens") and "(30)" in err.message
    assert _error({**base, "min_tokens": -1}, kind).param == "min_tokens"


@pytest.mark.parametrize("options,want", [
    ({"include_usage": True}, (True, False)),
    ({"continuous_usage_stats": True}, (True, True)),
    ({"include_usage": True, "continuous_usage_stats": True}, (True, True)),
    ({"include_usage": False, "continuous_usage_stats": True}, (False, False)),
    ({}, (False, False))])
def test_a_streams_usage_last_and_on_every_chunk_as_vllms(options: dict, want: tuple) -> None:
    req, _ = decode_request(json.dumps({**CHAT, "stream_options": options}).encode(),
                            ChatRequest)
    assert _usage_options(req) == want


def _set(body: dict, path: str, value: Any) -> dict:
    body = copy.deepcopy(body)
    *head, last = path.split(".")
    node: Any = body
    for key in head:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return body


SCHEMAS = {"chat": ChatRequest, "completion": CompletionRequest}


def _error(body: dict, kind: str) -> ApiError:
    """The ingress's typing of `body` (decode, then the worker's request) fails: how."""
    with pytest.raises(ApiError) as info:
        generate_request(*decode_request(json.dumps(body).encode(), SCHEMAS[kind]))
    return info.value


@pytest.mark.parametrize("kind,body", [("chat", CHAT), ("completion", COMPLETION)])
def test_the_full_request_is_accepted(kind: str, body: dict) -> None:
    req, raw = decode_request(json.dumps(body).encode(), SCHEMAS[kind])
    assert raw == body and req.model == "m"
    greq = generate_request(req, raw)
    assert isinstance(greq, ChatGenerate if kind == "chat" else CompletionGenerate)
    # a completion's response format (vLLM's) constrains its text: no reasoning, no tools
    assert greq.constraint.response_format == "json_schema"
    assert greq.constraint.json_schema == {"type": "object"}
    assert greq.constraint.allow_reasoning is (kind == "chat")


@pytest.mark.parametrize("path,value,param", CHAT_CASES, ids=[f"{c[0]}={c[1]!r}"[:60]
                                                               for c in CHAT_CASES])
def test_a_bad_chat_field_is_a_400_naming_it(path: str, value: Any, param: str) -> None:
    err = _error(_set(CHAT, path, value), "chat")
    assert (err.status, err.param) == (400, param), err.message
    assert err.type == "invalid_request_error"


@pytest.mark.parametrize("path,value,param", COMPLETION_CASES,
                         ids=[f"{c[0]}={c[1]!r}" for c in COMPLETION_CASES])
def test_a_bad_completion_field_is_a_400_naming_it(path: str, value: Any, param: str) -> None:
    err = _error(_set(COMPLETION, path, value), "completion")
    assert (err.status, err.param) == (400, param), err.message


def test_a_missing_required_field_is_named() -> None:
    body = copy.deepcopy(CHAT)
    del body["messages"][3]["role"]
    assert _error(body, "chat").param == "messages[3].role"
    body = copy.deepcopy(CHAT)
    del body["model"]
    assert _error(body, "chat").param == "model"


def test_options_that_need_each_other() -> None:
    assert _error({**CHAT, "stream": False}, "chat").param == "stream_options"
    assert _error({**CHAT, "logprobs": False}, "chat").param == "top_logprobs"
    assert _error({**CHAT, "tool_choice": "required", "tools": []}, "chat").param == "tool_choice"


def test_not_json_and_not_an_object() -> None:
    with pytest.raises(ApiError) as info:
        decode_request(b"{", ChatRequest)
    assert info.value.status == 400
    assert _error([CHAT], "chat").status == 400  # type: ignore[arg-type]


def test_a_variants_defaults_fill_only_what_the_request_leaves_out() -> None:
    from deployments.openai.request import with_defaults

    raw = {"model": "v", "messages": [{"role": "user", "content": "hi"}], "top_p": 0.5}
    out = with_defaults(raw, "Be brief.", {"temperature": 0.1, "top_p": 0.9,
                                           "num_predict": 7, "stop": "END",
                                           "repeat_penalty": 1.1, "repeat_last_n": 16})
    assert out["messages"][0] == {"role": "system", "content": "Be brief."}
    assert (out["temperature"], out["top_p"], out["max_tokens"]) == (0.1, 0.5, 7)
    assert out["stop"] == ["END"] and out["repetition_penalty"] == 1.1
    assert out["repeat_last_n"] == 16
    own = with_defaults({"messages": [{"role": "system", "content": "mine"}],
                         "max_completion_tokens": 3}, "Be brief.", {"num_predict": 7})
    assert own["messages"] == [{"role": "system", "content": "mine"}]
    assert "max_tokens" not in own
    assert raw == {"model": "v", "messages": [{"role": "user", "content": "hi"}],
                   "top_p": 0.5}  # the request itself is left alone


def test_an_assistants_refusal_part_in_the_history_is_its_text() -> None:
    """The openai SDK replays an assistant message with a refusal as a refusal part."""
    body = {"model": "m", "messages": [
        {"role": "user", "content": "Do the bad thing."},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't."}]},
        {"role": "user", "content": "OK, something else."}]}
    greq = generate_request(*decode_request(json.dumps(body).encode(), ChatRequest))
    assert greq.messages[1]["content"] == [{"type": "text", "text": "I can't."}]


def test_continue_final_message_continues_the_last_assistant_message() -> None:
    """vLLM's `continue_final_message`: the model goes on writing the last message."""
    begun = {"model": "m", "messages": [{"role": "user", "content": "hi"},
                                        {"role": "assistant", "content": "Well,"}]}
    plain = generate_request(*decode_request(json.dumps(begun).encode(), ChatRequest))
    assert not plain.continue_final  # OpenAI's default: the turn is closed, a new one starts
    greq = generate_request(*decode_request(json.dumps(
        {**begun, "continue_final_message": True}).encode(), ChatRequest))
    assert greq.continue_final
    err = _error({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                  "continue_final_message": True}, "chat")
    assert err.status == 400 and err.param == "continue_final_message"


@pytest.mark.parametrize("prompt,ids", [([504, 3575], [504, 3575]), ([[7, 8, 9]], [7, 8, 9]),
                                        (["Once"], None)])
def test_a_completion_prompt_may_be_token_ids(prompt: Any, ids: list[int] | None) -> None:
    greq = generate_request(*decode_request(json.dumps(
        {"model": "m", "prompt": prompt}).encode(), CompletionRequest))
    assert isinstance(greq, CompletionGenerate) and greq.prompt_ids == ids
    assert greq.prompt == ("" if ids else "Once")


@pytest.mark.parametrize("extra,scored", [({}, False), ({"logprobs": 1}, True),
                                          ({"prompt": [1, 2], "logprobs": 0}, True),
                                          ({"max_tokens": 0, "logprobs": 1}, True)])
def test_echo_asks_the_worker_for_the_prompt_and_with_logprobs_its_logprobs(
        extra: dict, scored: bool) -> None:
    greq = generate_request(*decode_request(json.dumps(
        {"model": "m", "prompt": "Once", "echo": True, **extra}).encode(), CompletionRequest))
    assert isinstance(greq, CompletionGenerate)
    assert greq.echo_prompt and greq.prompt_logprobs == scored
    assert greq.max_tokens == extra.get("max_tokens", 16)
    plain = generate_request(*decode_request(json.dumps(
        {"model": "m", "prompt": "Once", "logprobs": 1}).encode(), CompletionRequest))
    assert not plain.echo_prompt and not plain.prompt_logprobs


def test_max_tokens_0_is_for_scoring_an_echoed_prompt() -> None:
    err = _error({"model": "m", "prompt": "Once", "max_tokens": 0}, "completion")
    assert err.status == 400 and err.param == "max_tokens" and "echo" in err.message
    err = _error({"model": "m", "prompt": "Once", "max_tokens": -1, "echo": True},
                 "completion")
    assert err.status == 400 and err.param == "max_tokens"


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def _typed(kind: str, fields: dict):
    base = {"model": "m", **({"messages": [{"role": "user", "content": "hi"}]}
                              if kind == "chat" else {"prompt": "hi"})}
    return generate_request(*decode_request(json.dumps({**base, **fields}).encode(),
                                            SCHEMAS[kind]))


@pytest.mark.parametrize("kind", ["chat", "completion"])
@pytest.mark.parametrize("fields", [
    {"guided_json": SCHEMA}, {"guided_json": json.dumps(SCHEMA)}, {"json_schema": SCHEMA},
    {"structured_outputs": {"json": SCHEMA}}])
def test_vllms_and_llama_servers_schema_fields_are_the_response_format(kind, fields) -> None:
    """Found probing live: `extra_body={"guided_json": ...}` (vLLM's) and llama-server's
    `json_schema` were ignored: the output came back unconstrained, without an error."""
    greq = _typed(kind, fields)
    assert greq.constraint.response_format == "json_schema"
    assert greq.constraint.json_schema == SCHEMA


@pytest.mark.parametrize("fields,param", [
    ({"guided_regex": "[ab]"}, "guided_regex"), ({"guided_choice": ["a", "b"]}, "guided_choice"),
    ({"guided_grammar": "root ::= x"}, "guided_grammar"), ({"grammar": "root ::= x"}, "grammar"),
    ({"structured_outputs": {"choice": ["a"]}}, "structured_outputs.choice"),
    ({"guided_json": 3}, "guided_json"), ({"guided_json": "{nope"}, "guided_json"),
    ({"guided_json": SCHEMA, "response_format": {"type": "json_object"}}, "guided_json"),
    ({"guided_json": SCHEMA, "json_schema": SCHEMA}, "guided_json")])
def test_grammars_not_taken_here_are_refused_by_name(fields, param) -> None:
    with pytest.raises(ApiError) as err:
        _typed("chat", fields)
    assert err.value.status == 400 and err.value.param == param, err.value.message
