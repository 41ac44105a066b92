"""Responses' routes as the official `openai` client sees them, without Ray: the real app in
front of an Ingress whose worker is the fake of tests/deployments/test_ingress.py. Items
cut by the token limit, every field the SDK's types require, the input items of a stored
response, and `truncation: "auto"`."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from actors.events import Accepted, ChatGenerate, Deltas, Finished, Rejected, Usage
from chat import Delta
from tests.deployments.test_ingress import FakeStream, FakeWorker, _client, _Method

openai = pytest.importorskip("openai")
try:  # the transport of the HTTP library the installed client speaks
    import httpx2 as http
except ImportError:  # openai < 3
    import httpx as http

WEATHER = {"type": "function", "name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CONTEXT = 2048  # the fake worker's context_length


def _cut_call() -> list[list]:
    """A reply cut by the token limit in the middle of a call's arguments."""
    return [[Accepted(request_id="r", model="m", prompt_tokens=3),
             Deltas(index=0, deltas=[Delta(field="reasoning_content", text="Weather.")]),
             Deltas(index=0, deltas=[Delta(field="content", text="Let me look.")]),
             Deltas(index=0, deltas=[Delta(field="tool_call", text='{"city": ', index=0,
                                           id="call_1", name="get_weather")])],
            [Finished(index=0, finish_reason="length", completion_tokens=9)],
            [Usage(prompt_tokens=3, completion_tokens=9)]]


def _done(text: str = "Hello") -> list[list]:
    return [[Accepted(request_id="r", model="m", prompt_tokens=3),
             Deltas(index=0, deltas=[Delta(field="content", text=text)])],
            [Finished(index=0, finish_reason="stop", completion_tokens=1)],
            [Usage(prompt_tokens=3, completion_tokens=1)]]


class CountingWorker(FakeWorker):
    """A FakeWorker whose count_tokens counts a prompt as its messages' characters."""

    def __init__(self, *plays: FakeStream) -> None:
        super().__init__(*plays)
        self.counted: list[ChatGenerate] = []
        self.count_tokens = _Method(self._count)

    async def _count(self, greq: ChatGenerate) -> Accepted:
        self.counted.append(greq)
        n = sum(len(m.get("content") or "") for m in greq.messages)
        return Accepted(request_id=greq.request_id, model="m", prompt_tokens=n)


def _sdk(worker: FakeWorker):
    """The official client, its requests answered by the app in front of `worker`."""
    client, _ = _client(worker)

    def forward(request):
        r = client.request(request.method, str(request.url), content=request.read(),
                           headers={k: v for k, v in request.headers.items()
                                    if k.lower() not in ("host", "content-length")})
        return http.Response(r.status_code, content=r.content,
                             headers={"content-type": r.headers.get("content-type", "")})

    return openai.OpenAI(base_url="http://testserver/v1", api_key="unused", max_retries=0,
                         http_client=http.Client(transport=http.MockTransport(forward))), client


def _missing(obj, path: str = "$") -> list[str]:
    """The fields an SDK type requires that the answer did not have (the SDK builds its
    objects without validating, so a missing one is only an absent attribute)."""
    out: list[str] = []
    if isinstance(obj, BaseModel):
        for name, field in type(obj).model_fields.items():
            if field.is_required() and name not in obj.model_fields_set:
                out.append(f"{path}.{name}")
            out += _missing(getattr(obj, name, None), f"{path}.{name}")
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            out += _missing(value, f"{path}[{i}]")
    return out


def _extra(obj, path: str = "$") -> list[str]:
    """The fields sent that the SDK's types do not declare."""
    out: list[str] = []
    if isinstance(obj, BaseModel):
        out += [f"{path}.{k}" for k in obj.model_extra or {}]
        for name in type(obj).model_fields:
            out += _extra(getattr(obj, name, None), f"{path}.{name}")
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            out += _extra(value, f"{path}[{i}]")
    return out


@pytest.mark.parametrize("stream", [False, True])
def test_the_item_the_token_limit_cut_is_incomplete(stream: bool) -> None:
    """An agent that checks an item's status does not run a half-written call: the call
    being written when max_output_tokens hit is `incomplete`, the items before it are
    `completed`, in the item's done event and in the final response alike."""
    oa, _ = _sdk(FakeWorker(FakeStream(_cut_call())))
    kw = dict(model="m", input="Weather in Oslo?", tools=[WEATHER], max_output_tokens=9)
    if stream:
        with oa.responses.stream(**kw) as s:
            events = list(s)
        done = [e.item for e in events if e.type == "response.output_item.done"]
        assert events[-1].type == "response.incomplete"
        r = events[-1].response
        assert [i.model_dump() for i in done] == [i.model_dump() for i in r.output]
    else:
        r = oa.responses.create(**kw)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert [(i.type, i.status) for i in r.output] == [
        ("reasoning", "completed"), ("message", "completed"), ("function_call", "incomplete")]
    assert r.output[2].arguments == '{"city": '


@pytest.mark.parametrize("stream", [False, True])
def test_every_field_the_sdks_types_require_is_sent(stream: bool) -> None:
    oa, _ = _sdk(FakeWorker(FakeStream(_cut_call())))
    kw = dict(model="m", input="Weather in Oslo?", tools=[WEATHER], max_output_tokens=9)
    if stream:
        with oa.responses.stream(**kw) as s:
            events = list(s)
        assert [m for e in events for m in _missing(e, e.type)] == []
        # beyond the SDK's types: the response's `store` and the call's `name` in its
        # arguments.done event (both in OpenAI's answers and its API reference)
        assert {m for e in events for m in _extra(e, e.type)} == {
            f"{e.type}.response.store" for e in events if hasattr(e, "response")} | {
            "response.function_call_arguments.done.name"}
        r = events[-1].response
    else:
        r = oa.responses.create(**kw)
        assert _missing(r) == [] and _extra(r) == ["$.store"]
    assert r.usage.input_tokens_details.model_dump(exclude_none=True) == {
        "cached_tokens": 0, "cache_write_tokens": 0}


def test_the_input_items_of_a_stored_response_page_as_openai_lists_them() -> None:
    oa, _ = _sdk(FakeWorker(FakeStream(_done("Hi Ada.")), FakeStream(_done("Ada."))))
    first = oa.responses.create(model="m", instructions="Be brief.", input=[
        {"role": "developer", "content": "Use names."},
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "I am Ada."}]}])
    second = oa.responses.create(model="m", input="Who am I?",
                                 previous_response_id=first.id)
    page = oa.responses.input_items.list(second.id)  # newest first, as OpenAI's default
    assert page.object == "list" and page.has_more is False
    assert [(i.type, i.role) for i in page.data] == [
        ("message", "user"), ("message", "assistant"), ("message", "user"),
        ("message", "developer")]
    assert page.data[0].content[0].model_dump(exclude_none=True) == {
        "type": "input_text", "text": "Who am I?"}
    assert page.data[1].id == first.output[0].id  # the earlier output, as it was answered
    assert (page.first_id, page.last_id) == (page.data[0].id, page.data[-1].id)
    assert all(i.id and i.status == "completed" for i in page.data)
    assert [_missing(i) for i in page.data] == [[], [], [], []]
    # a page at a time, oldest first: the client follows `after` while `has_more`
    asc = oa.responses.input_items.list(second.id, order="asc", limit=1)
    assert asc.has_more is True and len(asc.data) == 1
    assert [i.id for i in asc] == [i.id for i in reversed(page.data)]
    assert [i.id for i in oa.responses.input_items.list(first.id, order="asc")] == [
        i.id for i in reversed(page.data[2:])]  # the first response's own input only
    assert oa.responses.input_items.list(
        second.id, include=["message.input_image.image_url"]).data == page.data


def test_the_input_items_of_an_unknown_deleted_or_unstored_response_are_404() -> None:
    oa, _ = _sdk(FakeWorker(FakeStream(_done()), FakeStream(_done())))
    unstored = oa.responses.create(model="m", input="hi", store=False)
    gone = oa.responses.create(model="m", input="hi")
    oa.responses.delete(gone.id)
    for response_id in ("resp_nope", unstored.id, gone.id):
        with pytest.raises(openai.NotFoundError) as err:
            oa.responses.input_items.list(response_id)
        assert err.value.body["code"] == "response_not_found"


@pytest.mark.parametrize("query,param", [
    ("limit=0", "limit"), ("limit=101", "limit"), ("limit=some", "limit"),
    ("order=up", "order"), ("include[]=nope", "include"), ("after=msg_nope", "after")])
def test_input_items_query_errors_name_the_parameter(query: str, param: str) -> None:
    oa, client = _sdk(FakeWorker(FakeStream(_done())))
    r = oa.responses.create(model="m", input="hi")
    got = client.get(f"/v1/responses/{r.id}/input_items?{query}")
    assert got.status_code == 400 and got.json()["error"]["param"] == param


def _long_talk() -> list[dict]:
    return [{"role": "user", "content": "a" * 1000},
            {"type": "function_call", "call_id": "c1", "name": "get_weather",
             "arguments": '{"city": "Oslo"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "o" * 500},
            {"role": "assistant", "content": "b" * 300},
            {"role": "user", "content": "c" * 600},
            {"role": "assistant", "content": "d" * 10},
            {"role": "user", "content": "e" * 100}]


def test_truncation_auto_drops_the_oldest_turns_never_the_instructions() -> None:
    worker = CountingWorker(FakeStream(_done()))
    oa, _ = _sdk(worker)
    r = oa.responses.create(model="m", instructions="Be brief.", input=_long_talk(),
                            tools=[WEATHER], truncation="auto")
    assert r.truncation == "auto" and r.output_text == "Hello"
    sent = worker.requests[0].messages  # cut before a user turn: no output without its call
    assert [m["content"][:1] for m in sent] == ["B", "c", "d", "e"]
    assert sent[0] == {"role": "system", "content": "Be brief."}
    assert sum(len(m["content"]) for m in sent) < CONTEXT
    assert len(worker.counted) <= 2  # the whole prompt, then a binary search over 2 cuts


def test_truncation_auto_leaves_a_prompt_that_fits_and_disabled_is_the_default() -> None:
    worker = CountingWorker(FakeStream(_done()), FakeStream(_done()))
    oa, _ = _sdk(worker)
    talk = _long_talk()[4:]
    r = oa.responses.create(model="m", input=talk, truncation="auto")
    assert r.truncation == "auto" and len(worker.requests[0].messages) == 3
    r = oa.responses.create(model="m", input=_long_talk())
    assert r.truncation == "disabled" and len(worker.requests[1].messages) == 7
    assert len(worker.counted) == 1  # only "auto" counts
    with pytest.raises(openai.BadRequestError) as err:
        oa.responses.create(model="m", input="hi", truncation="sometimes")
    assert err.value.body["param"] == "truncation"


def _too_long() -> list:
    """The worker's refusal of a prompt over the context."""
    return [[Rejected(status=400, message="This model's maximum context length is 2048 "
                                          "tokens; the prompt has 3000.",
                      param="messages", code="context_length_exceeded")]]


def test_truncation_auto_that_cannot_fit_is_the_workers_refusal() -> None:
    worker = CountingWorker(FakeStream(_too_long()))
    oa, _ = _sdk(worker)
    with pytest.raises(openai.BadRequestError) as err:
        oa.responses.create(model="m", truncation="auto",
                            input=[{"role": "user", "content": "a" * 100},
                                   {"role": "user", "content": "z" * 3000}])
    assert err.value.body["code"] == "context_length_exceeded"
    assert err.value.body["param"] == "input"
    assert [m["content"][0] for m in worker.requests[0].messages] == ["z"]  # the least


def _agent_loop(rounds: int, output: int = 400) -> list[dict]:
    """One user message, then `rounds` tool rounds (a call, its output) of `output` chars."""
    items: list[dict] = [{"role": "user", "content": "t" * 100}]
    for i in range(rounds):
        items += [{"type": "function_call", "call_id": f"c{i}", "name": "get_weather",
                   "arguments": f'{{"city": "{i}"}}'},
                  {"type": "function_call_output", "call_id": f"c{i}", "output": "o" * output}]
    return items


def _calls_and_outputs(sent: list[dict]) -> tuple[list[str], list[str]]:
    calls = [c["id"] for m in sent for c in m.get("tool_calls") or []]
    return calls, [m["tool_call_id"] for m in sent if m["role"] == "tool"]


def test_truncation_auto_drops_the_oldest_tool_rounds_of_an_agent_loop() -> None:
    """One user message and six rounds of 400 chars: over the context, the two oldest whole
    rounds go; the instructions, the user message and the newest rounds stay."""
    worker = CountingWorker(FakeStream(_done()))
    oa, _ = _sdk(worker)
    r = oa.responses.create(model="m", instructions="Be brief.", input=_agent_loop(6),
                            tools=[WEATHER], truncation="auto")
    assert r.output_text == "Hello"
    sent = worker.requests[0].messages
    assert sent[0] == {"role": "system", "content": "Be brief."}
    assert sent[1] == {"role": "user", "content": "t" * 100}
    assert _calls_and_outputs(sent) == (["c2", "c3", "c4", "c5"], ["c2", "c3", "c4", "c5"])
    assert sum(len(m["content"]) for m in sent) < CONTEXT
    assert len(worker.counted) <= 4  # the whole prompt, then a binary search over 5 cuts


def test_truncation_auto_of_a_loop_keeps_each_output_with_its_call() -> None:
    """A round whose call is answered only after the next round's call is never cut from
    its answer, even when that cut alone would fit: the least is sent instead."""
    items = _agent_loop(1, output=500) + [
        {"role": "assistant", "content": "p" * 1500},
        {"type": "function_call", "call_id": "a", "name": "get_weather", "arguments": "{}"},
        {"role": "assistant", "content": "Now the other one."},
        {"type": "function_call", "call_id": "b", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "a", "output": "x" * 300},
        {"type": "function_call_output", "call_id": "b", "output": "y" * 300}]
    worker = CountingWorker(FakeStream(_done()))
    oa, _ = _sdk(worker)
    oa.responses.create(model="m", input=items, tools=[WEATHER], truncation="auto")
    sent = worker.requests[0].messages
    assert _calls_and_outputs(sent) == (["a", "b"], ["a", "b"])
    assert [m["content"][:1] for m in sent] == ["t", "p", "N", "x", "y"]


def test_truncation_auto_drops_user_turns_before_rounds_after_the_last_user() -> None:
    """An earlier user turn goes first (all rounds stay when that is enough); when it is
    not, the rounds after the last user message go too, never that message."""
    worker = CountingWorker(FakeStream(_done()), FakeStream(_done()))
    oa, _ = _sdk(worker)
    earlier = [{"role": "user", "content": "a" * 900}, {"role": "assistant", "content": "b"}]
    oa.responses.create(model="m", input=earlier + _agent_loop(4), tools=[WEATHER],
                        truncation="auto")
    sent = worker.requests[0].messages
    assert sent[0]["content"] == "t" * 100 and len(_calls_and_outputs(sent)[0]) == 4
    oa.responses.create(model="m", input=earlier + _agent_loop(6), tools=[WEATHER],
                        truncation="auto")
    sent = worker.requests[1].messages
    assert sent[0]["content"] == "t" * 100
    assert _calls_and_outputs(sent)[1] == ["c2", "c3", "c4", "c5"]


def test_truncation_auto_never_drops_the_newest_round() -> None:
    """A newest round over the context on its own: the least that is sent (the user
    message and that round), which the worker refuses for its length."""
    worker = CountingWorker(FakeStream(_too_long()))
    oa, _ = _sdk(worker)
    with pytest.raises(openai.BadRequestError) as err:
        oa.responses.create(model="m", input=_agent_loop(3, output=3000), tools=[WEATHER],
                            truncation="auto")
    assert err.value.body["code"] == "context_length_exceeded"
    sent = worker.requests[0].messages
    assert sent[0]["content"] == "t" * 100
    assert _calls_and_outputs(sent) == (["c2"], ["c2"])


def test_input_tokens_counts_the_prompt_a_response_would_have() -> None:
    """The SDK's responses.input_tokens.count: the instructions, the stored conversation
    and the input, counted by a worker (here: their characters); nothing generated."""
    worker = CountingWorker(FakeStream(_done()))
    oa, _ = _sdk(worker)
    first = oa.responses.create(model="m", input="Hello")
    out = oa.responses.input_tokens.count(model="m", instructions="Be brief.",
                                          input="Again", previous_response_id=first.id)
    assert out.object == "response.input_tokens"
    said = sum(len(m.get("content") or "") for m in worker.counted[0].messages)
    assert out.input_tokens == said > len("Be brief.Again")
    assert [m["role"] for m in worker.counted[0].messages][:2] == ["system", "user"]
    with pytest.raises(openai.NotFoundError):
        oa.responses.input_tokens.count(model="m", input="x", previous_response_id="resp_x")


def test_a_strict_tools_refusal_by_the_worker_names_the_responses_field() -> None:
    refused = [[Rejected(status=400, message="Tool 'f' is strict: the pattern does not "
                         "compile.", param="tools[0].function.parameters")]]
    client, _ = _client(FakeWorker(FakeStream(refused)))
    tool = {"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": True}
    r = client.post("/v1/responses", json={"model": "m", "input": "hi", "tools": [tool]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools[0].parameters"
