"""Anthropic's requests without Ray: content blocks to chat messages, tools / tool_choice /
output_config / thinking to the constraint request and the thinking switch, and a table of
bad fields, each a 400 naming the field."""

from __future__ import annotations

import json

import pytest

from deployments.anthropic import request
from deployments.errors import ApiError, anthropic_error_body

WEATHER = {"name": "get_weather", "description": "The weather.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
HI = [{"role": "user", "content": "Hi"}]


def _request(**body):
    body = {"model": "m", "max_tokens": 9, "messages": HI, **body}
    return request.chat_request(request.decode(json.dumps(body).encode(), request.MessagesIn))


def test_a_plain_request_with_a_system_prompt_and_sampling() -> None:
    greq = _request(system=[{"type": "text", "text": "You are Claude Code."},
                            {"type": "text", "text": "Be brief.", "cache_control": {
                                "type": "ephemeral"}}],
                    stop_sequences=["END"], temperature=0.5, top_p=0.9, top_k=0, seed=3,
                    metadata={"user_id": "u"})
    # blocks are texts of their own, parted as the OpenAI API's text parts are (Claude
    # Code's system prompt comes as two blocks: joined as they came, two sentences ran on)
    assert greq.messages == [{"role": "system", "content": "You are Claude Code.\nBe brief."},
                             {"role": "user", "content": "Hi"}]
    assert (greq.max_tokens, greq.stop, greq.temperature, greq.top_p, greq.top_k,
            greq.seed) == (9, ["END"], 0.5, 0.9, None, 3)
    assert greq.thinking is None and greq.template_kwargs == {}
    assert greq.constraint.tool_choice == "auto" and greq.tools is None


def test_blocks_become_the_conversation() -> None:
    turns = [
        {"role": "user", "content": [{"type": "text", "text": "<system-reminder>Be brief."
                                                              "</system-reminder>"},
                                     {"type": "text", "text": "Weather in Oslo?"}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "call it", "signature": "sig"},
            {"type": "redacted_thinking", "data": "xx"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
             "input": {"city": "Oslo"}},
            {"type": "tool_use", "id": "toolu_2", "name": "get_weather",
             "input": {"city": "Bergen"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
             "content": [{"type": "text", "text": "no data"},
                         {"type": "text", "text": "try Bergen airport"}]},
            {"type": "text", "text": "Thanks."}]},
        {"role": "assistant", "content": "You're welcome."}]
    m = _request(messages=turns, tools=[WEATHER]).messages
    assert m[0] == {"role": "user",
                    "content": "<system-reminder>Be brief.</system-reminder>\nWeather in Oslo?"}
    assert m[1] == {"role": "assistant", "content": "Checking.", "reasoning_content": "call it",
                    "tool_calls": [
                        {"id": "toolu_1", "type": "function", "function": {
                            "name": "get_weather", "arguments": '{"city": "Oslo"}'}},
                        {"id": "toolu_2", "type": "function", "function": {
                            "name": "get_weather", "arguments": '{"city": "Bergen"}'}}]}
    assert m[2] == {"role": "tool", "tool_call_id": "toolu_1", "name": "get_weather",
                    "content": "Sunny"}
    assert m[3] == {"role": "tool", "tool_call_id": "toolu_2", "name": "get_weather",
                    "content": "Error: no data\ntry Bergen airport"}
    assert m[4] == {"role": "user", "content": "Thanks."}
    assert m[5] == {"role": "assistant", "content": "You're welcome."}


def test_consecutive_turns_of_one_role_are_one_turn() -> None:
    """As Anthropic: consecutive user or assistant messages are combined into one turn, so
    a tool result and the user's next words may come as two user messages, and a call after
    the assistant's text as a second assistant message."""
    m = _request(tools=[WEATHER], messages=[
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "user", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "assistant", "content": "Checking."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1",
                                           "name": "get_weather", "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": "Sunny"}]},
        {"role": "user", "content": "Thanks."}]).messages
    assert m == [
        {"role": "user", "content": "Weather in Oslo?\n\nBe brief."},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {
                "name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "name": "get_weather", "content": "Sunny"},
        {"role": "user", "content": "Thanks."}]
    m = _request(messages=[
        {"role": "user", "content": ""}, {"role": "user", "content": "B"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm"},
                                          {"type": "text", "text": "A"}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "more"},
                                          {"type": "text", "text": "C"}]},
        {"role": "assistant", "content": ""}]).messages
    assert m == [{"role": "user", "content": "B"},  # (an empty text adds no seam)
                 {"role": "assistant", "content": "A\n\nC", "reasoning_content": "hm\n\nmore"}]
    with pytest.raises(ApiError) as err:  # a block's place is still the one it was sent at
        _request(messages=HI + [{"role": "user", "content": [
            {"type": "text", "text": "See:"}, IMAGE]}])
    assert err.value.param == "messages[1].content[1].type"


@pytest.mark.parametrize("choice,expect", [
    ({"type": "auto"}, ("auto", None, True)),
    ({"type": "any"}, ("required", None, True)),
    ({"type": "any", "disable_parallel_tool_use": True}, ("required", None, False)),
    ({"type": "tool", "name": "get_weather"}, ("required", "get_weather", True)),
    ({"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
     ("required", "get_weather", False)),
    ({"type": "none"}, ("none", None, True)),
])
def test_tools_and_tool_choice_are_the_constraint(choice: dict, expect: tuple) -> None:
    greq = _request(tools=[WEATHER], tool_choice=choice)
    c = greq.constraint
    assert (c.tool_choice, c.named, c.parallel_tool_calls) == expect
    assert c.all_tools[0].name == "get_weather" and c.all_tools[0].description == "The weather."
    assert greq.tools == [{"type": "function", "function": {
        "name": "get_weather", "parameters": WEATHER["input_schema"],
        "description": "The weather."}}]


def test_output_config_format_is_a_json_schema_constraint() -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}}}
    c = _request(output_config={"format": {"type": "json_schema", "schema": schema}}).constraint
    assert (c.response_format, c.json_schema) == ("json_schema", schema)
    # the structured-outputs beta's top-level form (it was ignored: the reply was free text)
    c = _request(output_format={"type": "json_schema", "schema": schema}).constraint
    assert (c.response_format, c.json_schema) == ("json_schema", schema)


def test_a_strict_tool_stays_strict() -> None:
    tool = {**WEATHER, "strict": True}
    c = _request(tools=[tool, {**WEATHER, "name": "other"}]).constraint
    assert [t.strict for t in c.tools] == [True, False]


@pytest.mark.parametrize("thinking,effort,expect", [
    ({"type": "enabled", "budget_tokens": 1024}, None, (True, "low", True)),
    ({"type": "enabled", "budget_tokens": 10000}, None, (True, "medium", True)),
    ({"type": "enabled", "budget_tokens": 32000}, "low", (True, "low", True)),
    ({"type": "adaptive"}, None, (None, None, True)),
    ({"type": "adaptive"}, "max", (None, "high", True)),
    ({"type": "between_tools"}, None, (None, None, True)),
    ({"type": "disabled"}, None, (False, None, False)),
    (None, "medium", (None, "medium", True)),
])
def test_thinking_and_effort(thinking, effort, expect) -> None:
    body = {}
    if thinking:
        body["thinking"] = thinking
    if effort:
        body["output_config"] = {"effort": effort}
    greq = _request(**body)
    assert (greq.thinking, greq.template_kwargs.get("reasoning_effort"),
            greq.constraint.allow_reasoning) == expect
    # an enabled budget caps the reasoning; other modes leave it uncapped
    budget = thinking.get("budget_tokens") if thinking else None
    assert greq.reasoning_budget == budget


def test_errors_use_anthropics_names() -> None:
    with pytest.raises(ApiError) as err:
        _request(tool_choice={"type": "any"})
    assert err.value.message == "'tool_choice' is 'any' but the request has no 'tools'."
    with pytest.raises(ApiError) as err:
        _request(tools=[{"name": "f", "input_schema": {"type": "object", "required": 3}}])
    assert err.value.param == "tools[0].input_schema.required"
    assert "'tools[0].input_schema.required'" in err.value.message


def test_count_tokens_needs_no_max_tokens() -> None:
    body = {"model": "m", "messages": HI, "tools": [WEATHER]}
    greq = request.chat_request(request.decode(json.dumps(body).encode(), request.CountIn))
    assert greq.max_tokens is None and greq.tools[0]["function"]["name"] == "get_weather"


def test_a_document_of_text_is_read_as_its_text() -> None:
    """Found probing live: a plain-text document (a RAG app's) was refused as 'not text'."""
    doc = {"type": "document", "title": "Notes", "source": {
        "type": "text", "media_type": "text/plain", "data": "The sky is green."}}
    parts = {"type": "document", "source": {"type": "content", "content": [
        {"type": "text", "text": "Line one."}, {"type": "text", "text": "Line two."}]}}
    m = _request(messages=[{"role": "user", "content": [doc, parts, {
        "type": "text", "text": "What colour is the sky?"}]}]).messages
    assert m == [{"role": "user", "content": "Notes\nThe sky is green.\nLine one.\nLine two."
                                            "\nWhat colour is the sky?"}]
    pdf = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
                                          "data": "AA=="}}
    with pytest.raises(ApiError) as err:
        _request(messages=[{"role": "user", "content": [pdf]}])
    assert err.value.param == "messages[0].content[0].type"


DROP = object()  # a field left out
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": "AA=="}}


@pytest.mark.parametrize("block", [{"type": "search_result", "source": "x"},
                                   {"type": "server_tool_use", "id": "a", "name": "web_search",
                                    "input": {}}])
def test_a_block_type_not_read_here_is_named_in_plain_words(block: dict) -> None:
    body = {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": [block]}]}
    with pytest.raises(ApiError) as err:
        request.decode(json.dumps(body).encode(), request.MessagesIn)
    assert err.value.param == "messages[0].content[0].type"
    assert f"is '{block['type']}': this server reads text, tool_use" in err.value.message


@pytest.mark.parametrize("body,param", [
    ({"max_tokens": DROP}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"model": 3}, "model"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [IMAGE]}]}, "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
     "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "video"}]}]},
     "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_9", "content": "x"}]}]},
     "messages[0].content[0].tool_use_id"),
    ({"messages": [{"role": "user", "content": [
        {"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]},
     "messages[0].content[0].type"),
    ({"messages": [{"role": "assistant", "content": [
        {"type": "tool_use", "id": "a", "name": "get_weather", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a",
                                      "content": [IMAGE]}]}]},
     "messages[1].content[0].content[0].type"),
    ({"messages": [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "a", "name": "get_weather", "input": {}},
        {"type": "tool_use", "id": "b", "name": "get_weather", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a",
                                      "content": "x"}]}]},
     "messages[2].content"),  # as Anthropic: every call answered in the next turn
    ({"messages": [{"role": "assistant", "content": [
        {"type": "tool_use", "id": "a", "name": "get_weather", "input": {}}]},
        {"role": "user", "content": "And now?"}]}, "messages[1].content"),
    ({"system": [IMAGE]}, "system[0].type"),
    ({"tools": [{"name": "f"}]}, "tools[0].input_schema"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
    ({"tools": [{"name": "bad name!", "input_schema": {"type": "object"}}]}, "tools[0].name"),
    ({"tools": [{"name": "f", "input_schema": {"type": "array"}}]}, "tools[0].input_schema"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].name"),
    ({"tool_choice": {"type": "any"}}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice.name"),
    ({"tools": [WEATHER], "tool_choice": {"type": "tool"}}, "tool_choice.name"),
    ({"tools": [WEATHER], "tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
    ({"output_config": {"format": {"type": "json_schema", "schema": 3}}},
     "output_config.format.schema"),
    ({"output_config": {"format": {"type": "xml", "schema": {}}}},
     "output_config.format.type"),
    ({"output_config": {"format": {"type": "json_schema", "schema": {  # always strict
        "type": "array", "uniqueItems": True}}}}, "output_config.format.schema"),
    ({"output_config": {"effort": "extreme"}}, "output_config.effort"),
    ({"thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "enabled", "budget_tokens": 100}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "sometimes"}}, "thinking.type"),
    ({"temperature": 1.5}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_k": -1}, "top_k"),
    ({"stop_sequences": "END"}, "stop_sequences"),
])
def test_bad_fields_are_400s_naming_the_field(body: dict, param: str) -> None:
    body = {"model": "m", "max_tokens": 9, "messages": HI, **body}
    body = {k: v for k, v in body.items() if v is not DROP}
    with pytest.raises(ApiError) as err:
        request.chat_request(request.decode(json.dumps(body).encode(), request.MessagesIn))
    assert err.value.status == 400 and err.value.param == param, err.value.message
    shown = anthropic_error_body(err.value)
    assert shown["type"] == "error" and shown["error"]["type"] == "invalid_request_error"
    assert param in shown["error"]["message"]


def test_a_last_assistant_turn_is_a_prefill_the_model_continues() -> None:
    begun = HI + [{"role": "assistant", "content": [{"type": "text", "text": '{"a":'}]}]
    greq = _request(messages=begun)
    assert greq.continue_final and greq.messages[-1] == {"role": "assistant",
                                                         "content": '{"a":'}
    assert not _request().continue_final
    for text in ("Sure, ", "   "):  # as Anthropic: no trailing whitespace there
        with pytest.raises(ApiError) as err:
            _request(messages=HI + [{"role": "assistant", "content": text}])
        assert err.value.status == 400 and "trailing whitespace" in err.value.message
    counted = request.chat_request(request.decode(json.dumps(
        {"model": "m", "messages": begun}).encode(), request.CountIn))
    assert counted.continue_final  # count_tokens counts the same prompt
