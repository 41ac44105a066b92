"""OpenAI's Responses API without Ray: input items to chat messages, the worker's events to
output items and semantic stream events, and the store."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.events import Deltas, Failed, Finished, TokenLogprob, Usage
from chat import ChatMsg, Delta
from deployments.errors import ApiError
from deployments.responses import reply, request
from deployments.responses.store import ResponseStore, Stored

LIGHT = {"type": "function", "name": "light", "parameters": {
    "type": "object", "properties": {"on": {"type": "boolean"}}}}


def _request(**body):
    body = {"model": "m", "input": "hi", **body}
    return request.chat_request(request.decode(json.dumps(body).encode()), [])


def test_a_string_input_with_instructions() -> None:
    greq, conversation = _request(instructions="Be brief.", max_output_tokens=9,
                                  temperature=0.5, top_p=0.9,
                                  reasoning={"effort": "none"},
                                  text={"format": {"type": "json_object"}})
    assert greq.messages == [{"role": "system", "content": "Be brief."},
                             {"role": "user", "content": "hi"}]
    assert conversation == [{"role": "user", "content": "hi"}]  # instructions not kept
    assert (greq.max_tokens, greq.temperature, greq.top_p) == (9, 0.5, 0.9)
    assert greq.thinking is False and greq.template_kwargs == {"reasoning_effort": "none"}
    assert greq.constraint.response_format == "json_object"


def test_items_become_the_conversation() -> None:
    items = [{"role": "developer", "content": "rules"},
             {"type": "message", "role": "user",
              "content": [{"type": "input_text", "text": "Lights on?"},
                          {"type": "input_text", "text": "Thanks."}]},
             {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "call"}]},
             {"type": "message", "role": "assistant",
              "content": [{"type": "output_text", "text": "Sure."}]},
             {"type": "function_call", "call_id": "c1", "name": "light",
              "arguments": '{"on": true}'},
             {"type": "function_call", "call_id": "c2", "name": "light",
              "arguments": '{"on": false}'},
             {"type": "function_call_output", "call_id": "c1", "output": "on"},
             {"type": "function_call_output", "call_id": "c2",
              "output": [{"type": "input_text", "text": "off"},
                         {"type": "input_text", "text": "22C"}]}]
    greq, _ = _request(input=items, tools=[LIGHT],
                       tool_choice={"type": "function", "name": "light"})
    m = greq.messages
    assert m[0] == {"role": "system", "content": "rules"}
    # parts joined by a newline, as the chat API's (they ran together: "Sunny22C")
    assert m[1] == {"role": "user", "content": "Lights on?\nThanks."}
    assert m[2]["role"] == "assistant" and m[2]["content"] == "Sure."
    assert m[2]["reasoning_content"] == "call"
    assert [c["id"] for c in m[2]["tool_calls"]] == ["c1", "c2"]  # one turn, two calls
    assert m[3] == {"role": "tool", "tool_call_id": "c1", "name": "light", "content": "on"}
    assert m[4]["content"] == "off\n22C"
    assert greq.tools[0]["function"]["name"] == "light"
    c = greq.constraint
    assert c.tool_choice == "required" and c.named == "light"


def test_a_reasoning_item_with_only_openais_summary_is_taken() -> None:
    """OpenAI's reasoning items come back with `summary` parts of type summary_text (and an
    encrypted_content this server ignores): the summary stands for the reasoning."""
    items = [{"role": "user", "content": "Hi"},
             {"type": "reasoning", "id": "rs_1", "encrypted_content": "gAAA",
              "summary": [{"type": "summary_text", "text": "Greet back."},
                          {"type": "summary_text", "text": "Briefly."}]},
             {"type": "message", "role": "assistant",
              "content": [{"type": "output_text", "text": "Hello!"}]},
             {"role": "user", "content": "Bye"}]
    greq, _ = _request(input=items)
    assert greq.messages[1] == {"role": "assistant", "content": "Hello!",
                                "reasoning_content": "Greet back.\n\nBriefly."}
    with pytest.raises(ApiError) as err:
        _request(input=[{"type": "reasoning", "summary": [{"type": "image"}]}])
    assert err.value.param == "input[0].summary[0].type"


def test_a_stored_conversation_comes_first() -> None:
    history = [{"role": "user", "content": "Lights?"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"id": "c1", "type": "function",
                    "function": {"name": "light", "arguments": "{}"}}]}]
    req = request.decode(json.dumps({"model": "m", "input": [
        {"type": "function_call_output", "call_id": "c1", "output": "on"}]}).encode())
    greq, conversation = request.chat_request(req, history)
    assert conversation[:2] == history and conversation[2]["name"] == "light"


def test_a_message_after_a_call_with_no_output_is_refused() -> None:
    """As OpenAI: a stored response's call (or an input's) is answered before the next
    message; a user message in its place is a 400 naming the call."""
    history = [{"role": "user", "content": "Lights?"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"id": "c1", "type": "function",
                    "function": {"name": "light", "arguments": "{}"}}]}]
    req = request.decode(json.dumps({"model": "m", "input": "And now?"}).encode())
    with pytest.raises(ApiError) as err:
        request.chat_request(req, history)
    assert err.value.status == 400 and "c1" in err.value.message
    assert err.value.param == "input"
    calls = [{"type": "function_call", "call_id": c, "name": "light", "arguments": "{}"}
             for c in ("c2", "c3")]
    with pytest.raises(ApiError):
        _request(input=[*calls, {"type": "function_call_output", "call_id": "c2",
                                 "output": "on"}, {"role": "user", "content": "?"}])
    answered = _request(input=[*calls, *({"type": "function_call_output", "call_id": c,
                                          "output": "on"} for c in ("c3", "c2")),
                               {"role": "user", "content": "?"}])[0]
    assert [m["role"] for m in answered.messages] == ["assistant", "tool", "tool", "user"]


@pytest.mark.parametrize("body,param", [
    ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
     "input[0].content[0].type"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]},
     "input[0].arguments"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
    ({"tools": [{"type": "file_search"}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "name": "f", "description": 3}]},
     "tools[0].description"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"temperature": 3}, "temperature"),
    ({"text": {"format": {"type": "yaml"}}}, "text.format"),
    # (found probing live: named response_format.json_schema.schema, chat's field)
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": 3}}},
     "text.format.schema"),
    # found probing live: no schema was any JSON ('null'), no input ran from an empty
    # conversation until the client gave up
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"input": None}, "input"),
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"reasoning": {"effort": "max"}}, "reasoning.effort"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"background": True}, "background"),
    ({"conversation": "conv_123"}, "conversation"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"include": ["bogus.value"]}, "include"),
    ({"top_logprobs": 21}, "top_logprobs"),
    ({"tools": [{"type": "function", "name": "f"}], "tool_choice": "any"}, "tool_choice"),
    ({"model": None}, "model"),
    # found by fuzzing a served model (500s before)
    ({"input": [{"type": "function_call_output", "call_id": ["x"], "output": "x"}]},
     "input[0].call_id"),
    ({"input": [{"type": "function_call_output", "call_id": {"a": 1}, "output": "x"}]},
     "input[0].call_id"),
    ({"tools": [{"type": "function", "name": "f"}],
      "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": 3}},
     "tool_choice.tools"),
])
def test_bad_requests_name_the_field(body: dict, param: str) -> None:
    with pytest.raises(ApiError) as err:
        _request(**body)
    assert err.value.status == 400 and err.value.param == param, err.value.message
    assert '"function": {' not in err.value.message  # chat completions' shape, not this API's


# -- answers --------------------------------------------------------------------------------
def _events(parts: list[tuple[str, str]], reason: str = "stop") -> list:
    """Worker events for a reply made of (field, text) pieces; ("call", name) opens a call."""
    evs, n = [], 0
    for field, text in parts:
        if field == "call":
            evs.append(Deltas(index=0, deltas=[Delta(field="tool_call", text="", index=n,
                                                     id=f"call_{n}", name=text)]))
            n += 1
        elif field == "args":
            evs.append(Deltas(index=0, deltas=[Delta(field="tool_call", text=text,
                                                     index=n - 1)]))
        else:
            evs.append(Deltas(index=0, deltas=[Delta(field=field, text=text)]))
    return evs + [Finished(index=0, finish_reason=reason, completion_tokens=len(evs),
                           message=ChatMsg()),
                  Usage(prompt_tokens=5, completion_tokens=len(evs),
                        reasoning_tokens=sum(f == "reasoning_content" for f, _ in parts))]


def _builder() -> reply.ResponseBuilder:
    req = request.decode(b'{"model": "m", "input": "hi"}')
    return reply.ResponseBuilder(request.response_base(req, "resp_1"))


def test_items_open_and_close_in_order() -> None:
    b = _builder()
    events = b.start() + b.add(_events([("reasoning_content", "hm"), ("content", "Sure"),
                                        ("call", "light"), ("args", '{"on":'),
                                        ("args", " true}")]))
    types = [e["type"] for e in events]
    assert types == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        "response.reasoning_text.delta", "response.reasoning_text.done",
        "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = events[-1]["response"]
    assert [i["type"] for i in final["output"]] == ["reasoning", "message", "function_call"]
    call = final["output"][2]
    assert (call["name"], call["arguments"], call["call_id"]) == ("light", '{"on": true}',
                                                                  "call_0")
    assert final["usage"]["input_tokens"] == 5 and final["status"] == "completed"
    # (it was always 0: found probing live)
    assert final["usage"]["output_tokens_details"] == {"reasoning_tokens": 1}
    assert b.assistant_messages() == [{"role": "assistant", "content": "Sure",
                                       "reasoning_content": "hm", "tool_calls": [
                                           {"id": "call_0", "type": "function", "function": {
                                               "name": "light",
                                               "arguments": '{"on": true}'}}]}]


def test_a_cut_reply_is_incomplete_and_so_is_the_item_it_was_writing() -> None:
    b = _builder()
    events = b.add(_events([("content", "Sure"), ("call", "light"), ("args", '{"on":')],
                           reason="length"))
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    done = [e["item"]["status"] for e in events if e["type"] == "response.output_item.done"]
    assert done == ["completed", "incomplete"]
    assert [i["status"] for i in events[-1]["response"]["output"]] == done
    assert [i["status"] for i in b.response()["output"]] == done
    whole = _builder()
    whole.add(_events([("content", "Sure")]))
    assert whole.response()["output"][0]["status"] == "completed"


def test_output_text_logprobs_where_include_asks_for_them() -> None:
    """`include: ["message.output_text.logprobs"]` with `top_logprobs`: the worker is asked
    for them; each output_text delta carries its tokens' (a token whose text was held
    back, with the next text), the done part all of them; a reasoning token's are not
    output text's."""
    greq, _ = _request(include=["message.output_text.logprobs"], top_logprobs=2)
    assert greq.logprobs and greq.top_logprobs == 2
    assert not _request()[0].logprobs

    def lp(token: str) -> TokenLogprob:
        return TokenLogprob(token=token, logprob=-0.5, bytes=list(token.encode()),
                            top=[(token, -0.5, list(token.encode()))])

    b = _builder()
    events = b.add([
        Deltas(index=0, deltas=[Delta(field="reasoning_content", text="hm")],
               logprobs=[lp("hm")]),
        Deltas(index=0, deltas=[], logprobs=[lp("Su")]),  # held back: no text yet
        Deltas(index=0, deltas=[Delta(field="content", text="Sure")], logprobs=[lp("re")]),
        Deltas(index=0, deltas=[Delta(field="content", text="!")], logprobs=[lp("!")]),
        Finished(index=0, finish_reason="stop", completion_tokens=4, message=ChatMsg()),
        Usage(prompt_tokens=5, completion_tokens=4)])
    deltas = [e["logprobs"] for e in events if e["type"] == "response.output_text.delta"]
    assert [[t["token"] for t in d] for d in deltas] == [["Su", "re"], ["!"]]
    done = [e for e in events if e["type"] == "response.output_text.done"][0]
    assert [t["token"] for t in done["logprobs"]] == ["Su", "re", "!"]
    part = b.response()["output"][1]["content"][0]
    assert part["logprobs"] == done["logprobs"]
    assert part["logprobs"][0]["top_logprobs"] == [{"token": "Su", "logprob": -0.5,
                                                    "bytes": [83, 117]}]


def test_a_worker_failure_is_an_error_event() -> None:
    b = _builder()
    events = b.add([Failed(message="boom")])
    assert events[0]["type"] == "error" and events[0]["message"] == "boom"
    assert b.error == "boom"


_piece = st.tuples(st.sampled_from(["reasoning_content", "content", "call", "args"]),
                   st.text(min_size=1, max_size=4))


@given(st.lists(_piece, max_size=12))
def test_folding_the_stream_gives_the_final_output(parts) -> None:
    """What a client rebuilds from the events (items added, deltas appended, items done)
    is the final response's output, which is also the non-streamed answer."""
    b = _builder()
    events = b.start() + b.add(_events(parts))
    items: dict[int, dict] = {}
    for e in events:
        if e["type"] == "response.output_item.added":
            items[e["output_index"]] = json.loads(json.dumps(e["item"]))
        elif e["type"] in ("response.output_text.delta", "response.reasoning_text.delta"):
            items[e["output_index"]]["content"] = items[e["output_index"]].get("content") or \
                [{"text": ""}]
            items[e["output_index"]]["content"][0]["text"] += e["delta"]
        elif e["type"] == "response.function_call_arguments.delta":
            items[e["output_index"]]["arguments"] += e["delta"]
        elif e["type"] == "response.output_item.done":
            done = e["item"]
            got = items[e["output_index"]]
            if done["type"] == "function_call":
                assert got["arguments"] == done["arguments"]
            else:
                assert got["content"][0]["text"] == done["content"][0]["text"]
    final = events[-1]["response"]["output"]
    assert len(final) == len(items)
    assert final == b.response()["output"]


def test_the_store_keeps_a_bounded_recent_set() -> None:
    store = ResponseStore(max_items=2, ttl_s=3600)
    for i in range(3):
        store.put(Stored(response={"id": f"resp_{i}"},
                         conversation=[{"role": "user", "content": str(i)}]))
    with pytest.raises(ApiError) as err:
        store.get("resp_0")  # the oldest went first
    assert err.value.status == 404 and err.value.code == "response_not_found"
    assert store.get("resp_2").conversation == [{"role": "user", "content": "2"}]
    store.delete("resp_2")
    with pytest.raises(ApiError):
        store.get("resp_2")
    expired = ResponseStore(ttl_s=0.0)
    expired.put(Stored(response={"id": "resp_x"}, conversation=[]))
    with pytest.raises(ApiError):
        expired.get("resp_x")
