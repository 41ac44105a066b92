"""The ingress's one request path, without Ray: the real app (every API's routes) in front
of an Ingress whose worker handle is a fake that plays a script of events, as Serve's
handle would deliver them. What a client sees when the worker accepts, rejects, dies
before answering (and is retried), is overloaded, or fails mid-stream; and that a client
that goes away cancels the request on the worker."""

from __future__ import annotations

import asyncio
import json

import msgspec
import pytest
from starlette.testclient import TestClient

from actors.events import (
    Accepted,
    ChatGenerate,
    Deltas,
    Finished,
    GenerateRequest,
    Rejected,
    Usage,
)
from chat import Delta, FormatKind, spec_for_kind
from deployments.exchange import Call
from deployments.ingress import Ingress, current
from deployments.openai.reply import ChatReply
from deployments.server import make_app


class ActorDiedError(Exception):  # named as Ray's: the replica's actor is gone
    pass


class BackPressureError(Exception):  # named as Serve's: the queue is full
    pass


def _reply(text: str = "Hello") -> list[list]:
    return [[Accepted(request_id="r", model="m", prompt_tokens=3),
             Deltas(index=0, deltas=[Delta(field="content", text=text)])],
            [Finished(index=0, finish_reason="stop", completion_tokens=1)],
            [Usage(prompt_tokens=3, completion_tokens=1)]]


class FakeStream:
    """A request's stream as Serve's handle gives it: batches, then the end; `fail`: an
    exception raised in place of the batch at that index."""

    def __init__(self, batches: list, fail: dict[int, Exception] | None = None) -> None:
        self.batches, self.fail, self.at = batches, fail or {}, 0
        self.cancelled = False

    def __aiter__(self) -> FakeStream:
        return self

    async def __anext__(self) -> list:
        if self.at in self.fail:
            raise self.fail[self.at]
        if self.at >= len(self.batches):
            raise StopAsyncIteration
        self.at += 1
        await asyncio.sleep(0)
        return self.batches[self.at - 1]

    def cancel(self) -> None:
        self.cancelled = True


class _Method:
    def __init__(self, fn) -> None:
        self.fn = fn

    def remote(self, *args):
        return self.fn(*args)


class FakeWorker:
    """A worker deployment handle: each `generate` call takes the next stream of `plays`."""

    def __init__(self, *plays: FakeStream) -> None:
        self.plays = list(plays)
        self.requests: list[GenerateRequest] = []
        self.streams: list[FakeStream] = []
        self.generate = _Method(self._generate)
        self.info = _Method(self._info)

    def options(self, **_: object) -> FakeWorker:
        return self

    def _generate(self, greq: GenerateRequest) -> FakeStream:
        self.requests.append(greq)
        stream = self.plays.pop(0)
        self.streams.append(stream)
        return stream

    async def _info(self, verbose: bool = False) -> dict:
        return {"id": "m", "created": 1, "context_length": 2048}


def _client(worker: FakeWorker, **settings: object) -> tuple[TestClient, Ingress]:
    ingress = Ingress({"m": worker}, dict(settings))
    app = make_app()
    app.dependency_overrides[current] = lambda: ingress
    return TestClient(app), ingress


CHAT = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}


def test_an_accepted_request_is_answered_whole_or_streamed() -> None:
    worker = FakeWorker(FakeStream(_reply()), FakeStream(_reply()))
    client, _ = _client(worker)
    r = client.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 200
    body = r.json()
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Hello"}
    assert body["usage"]["total_tokens"] == 4 and body["id"].startswith("chatcmpl-")
    assert worker.requests[0].messages == CHAT["messages"]
    r = client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert r.headers["content-type"].startswith("text/event-stream")
    lines = [ln[6:] for ln in r.text.splitlines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(ln) for ln in lines[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "Hello"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def _text_of(path: str, r) -> str:
    if path == "/v1/responses":
        return r.json()["output"][0]["content"][0]["text"]
    if path == "/api/chat":
        return r.json()["message"]["content"]
    return r.json()["response"]


@pytest.mark.parametrize("path,body", [
    ("/v1/responses", {"model": "m", "input": "Hi"}),
    ("/api/chat", {**CHAT, "stream": False}),
    ("/api/generate", {"model": "m", "prompt": "Hi", "stream": False}),
])
def test_every_api_folds_the_same_events_into_its_own_answer(path: str, body: dict) -> None:
    client, _ = _client(FakeWorker(FakeStream(_reply())))
    r = client.post(path, json=body)
    assert r.status_code == 200 and _text_of(path, r) == "Hello"


def test_a_rejected_request_is_an_error_in_the_apis_own_shape() -> None:
    rejected = [[Rejected(status=400, message="Bad tool.", param="tools[0]")]]
    worker = FakeWorker(FakeStream(rejected), FakeStream(rejected), FakeStream(rejected))
    client, _ = _client(worker)
    r = client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert r.status_code == 400  # before any byte of a 200 stream
    assert r.json()["error"] == {"message": "Bad tool.", "type": "invalid_request_error",
                                 "param": "tools[0]", "code": None}
    r = client.post("/api/chat", json=CHAT)
    assert r.status_code == 400 and r.json() == {"error": "Bad tool."}
    r = client.post("/v1/responses", json={"model": "m", "input": "Hi"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools[0]"


def test_ollamas_think_refusal_reads_as_ollamas() -> None:
    """The worker's refusal of `think: true` on a model that cannot think, through /api/chat:
    Ollama's words as Ollama says them (the worker names its own field, require_thinking;
    Ollama's errors name none)."""
    from actors.errors import RequestError
    from actors.session import build_session

    class NoReasoning:
        name = "m"

    with pytest.raises(RequestError) as err:  # what the worker refuses it with
        build_session(ChatGenerate(request_id="r", messages=[], require_thinking=True),
                      NoReasoning(), msgspec.structs.replace(spec_for_kind(
                          FormatKind.HERMES_JSON), reasoning=False), lambda: None)
    e = err.value
    rejected = [[Rejected(status=e.status, message=e.message, param=e.param)]]
    client, _ = _client(FakeWorker(FakeStream(rejected)))
    r = client.post("/api/chat", json={**CHAT, "think": True})
    assert r.status_code == 400 and r.json() == {"error": '"m" does not support thinking'}


def test_a_configured_models_name_is_read_in_any_case_and_with_latest() -> None:
    """Ollama reads model names in any case, `:latest` or not (a library model's were
    read so; a configured model's were a 404: found probing live); one name each way."""
    worker = FakeWorker(*[FakeStream(_reply()) for _ in range(3)])
    client, ingress = _client(worker)
    assert ingress.resolve("M") == ingress.resolve("m:LATEST") == "m"
    assert client.post("/v1/chat/completions", json={**CHAT, "model": "M"}).status_code == 200
    r = client.post("/api/chat", json={**CHAT, "model": "M:latest", "stream": False})
    assert r.status_code == 200, r.text
    assert len(worker.requests) == 2
    r = client.post("/api/chat", json={**CHAT, "model": "n", "stream": False})
    assert r.status_code == 404


@pytest.mark.parametrize("path", ["/api/chat", "/api/generate", "/api/show"])
def test_ollamas_empty_model_name_is_ollamas_400(path: str) -> None:
    worker = FakeWorker()
    client, _ = _client(worker)
    r = client.post(path, json={**CHAT, "prompt": "hi", "model": ""})
    assert r.status_code == 400 and r.json() == {"error": "model is required"}
    assert worker.requests == []


def test_a_worker_that_dies_before_answering_is_tried_again() -> None:
    worker = FakeWorker(FakeStream([], {0: ActorDiedError()}), FakeStream(_reply("Again")))
    client, _ = _client(worker)
    r = client.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 200
    assert r.json()["choices"][0]["message"]["content"] == "Again"
    assert len(worker.requests) == 2


def test_workers_that_keep_dying_and_a_full_queue_are_503s_with_retry_after() -> None:
    dead = [FakeStream([], {0: ActorDiedError()}) for _ in range(3)]
    client, _ = _client(FakeWorker(*dead))
    r = client.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["type"] == "server_error"
    client, _ = _client(FakeWorker(FakeStream([], {0: BackPressureError()})))
    r = client.post("/api/generate", json={"model": "m", "prompt": "Hi"})
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert "busy" in r.json()["error"]


def test_a_worker_lost_mid_stream_ends_the_stream_with_an_error() -> None:
    batches = _reply()
    worker = FakeWorker(FakeStream(batches, {1: ActorDiedError()}),
                        FakeStream(batches, {1: ActorDiedError()}))
    client, _ = _client(worker)
    r = client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    lines = [ln[6:] for ln in r.text.splitlines() if ln.startswith("data: ")]
    assert json.loads(lines[-2])["error"]["type"] == "server_error"
    assert lines[-1] == "[DONE]"
    r = client.post("/v1/chat/completions", json=CHAT)  # not streamed: a 503
    assert r.status_code == 503 and r.headers["retry-after"] == "1"


def test_a_client_that_goes_away_cancels_the_request_on_the_worker() -> None:
    stream = FakeStream(_reply())
    worker = FakeWorker(stream)
    ingress = Ingress({"m": worker}, {})
    greq = ChatGenerate(request_id="r", messages=CHAT["messages"])
    call = Call(model="m", request=greq, stream=True,
                reply=ChatReply({"id": "chatcmpl-r", "created": 0, "model": "m"}))

    async def first_bytes_then_leave() -> bytes:
        from deployments.metrics import RequestTrace

        response = await ingress._answer(call, RequestTrace(ingress.metrics, "/x"))
        body = response.body_iterator
        first = await body.__anext__()
        await body.aclose()  # what Starlette does when the client disconnects
        return first

    first = asyncio.run(first_bytes_then_leave())
    assert first.startswith(b"data: ")
    assert stream.cancelled
    assert ingress.metrics.snapshot()["flm_client_disconnects_total"] == [[["/x"], 1.0]]


@pytest.mark.parametrize("path,body,status", [
    ("/v1/chat/completions", {"model": "nope", "messages": CHAT["messages"]}, 404),
    ("/v1/chat/completions", {"model": "m", "messages": "Hi"}, 400),
    ("/v1/completions", {"model": "m"}, 400),
    ("/api/chat", {"model": "nope:latest", "messages": CHAT["messages"]}, 404),
])
def test_bad_input_is_answered_before_any_worker_is_asked(path: str, body: dict,
                                                          status: int) -> None:
    worker = FakeWorker()
    client, _ = _client(worker)
    r = client.post(path, json=body)
    assert r.status_code == status and "error" in r.json()
    assert worker.requests == []


def test_the_api_key_and_the_size_limit_hold_on_every_route() -> None:
    worker = FakeWorker()
    client, _ = _client(worker, api_key="k", max_request_bytes=1000)
    for method, path in [("post", "/v1/chat/completions"), ("get", "/v1/models"),
                         ("post", "/api/chat"), ("get", "/api/tags"), ("get", "/metrics"),
                         ("post", "/v1/responses")]:
        r = getattr(client, method)(path, **({"json": CHAT} if method == "post" else {}))
        assert r.status_code == 401, path
    r = client.post("/v1/chat/completions", headers={"Authorization": "Bearer k"},
                    json={**CHAT, "messages": [{"role": "user", "content": "x" * 2000}]})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    r = client.get("/v1/models", headers={"Authorization": "Bearer k"})
    assert r.json()["data"][0]["id"] == "m"
    assert worker.requests == []


def test_load_requests_and_listings_need_no_generation() -> None:
    worker = FakeWorker()
    client, _ = _client(worker)
    r = client.post("/api/generate", json={"model": "m"})
    assert r.json()["done_reason"] == "load"
    assert client.get("/api/tags").json()["models"][0]["name"] == "m:latest"
    assert client.get("/").text == "Ollama is running"
    r = client.get("/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["message"].startswith("Unknown path")
    r = client.get("/api/nothing")
    assert r.status_code == 404 and isinstance(r.json()["error"], str)
    assert worker.requests == []


def test_a_field_the_worker_names_is_named_as_the_client_sent_it() -> None:
    rejected = [[Rejected(status=400, message="The requested context length is 8 tokens; "
                                              "the prompt has 36.", param="context_limit")]]
    client, _ = _client(FakeWorker(FakeStream(rejected)))
    r = client.post("/api/chat", json={**CHAT, "options": {"num_ctx": 8}})
    assert r.status_code == 400 and "'options.num_ctx'" in r.json()["error"]
    # a field path in the worker's text is the API's too (an Anthropic output schema)
    rejected = [[Rejected(status=400, message="response_format.json_schema.schema: 'zz' is "
                                              "not a type.", param="response_format")]]
    client, _ = _client(FakeWorker(FakeStream(rejected)))
    r = client.post("/v1/messages", json={"model": "m", "max_tokens": 4, "messages": [
        {"role": "user", "content": "Hi"}], "output_config": {"format": {
            "type": "json_schema", "schema": {"type": "object"}}}})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "output_config.format.schema: 'zz' is not a type."


class GatedStream(FakeStream):
    """A FakeStream whose batch at index i waits for `gates[i]` (a worker still prefilling,
    or pausing mid-stream)."""

    def __init__(self, batches: list, gates: dict[int, asyncio.Event]) -> None:
        super().__init__(batches)
        self.gates = gates

    async def __anext__(self) -> list:
        gate = self.gates.get(self.at)
        if gate is not None:
            await gate.wait()
        return await super().__anext__()


KEEP_ALIVE = b": keep-alive\n\n"


def _keep_alive_call(batches: list, gates: dict[int, asyncio.Event]) -> tuple[Ingress, Call]:
    ingress = Ingress({"m": FakeWorker(GatedStream(batches, gates))}, {})
    greq = ChatGenerate(request_id="r", messages=CHAT["messages"])
    call = Call(model="m", request=greq, stream=True,
                reply=ChatReply({"id": "chatcmpl-r", "created": 0, "model": "m"}),
                keep_alive=KEEP_ALIVE, keep_alive_s=0.001)
    return ingress, call


async def _read_until_gate_opens(ingress: Ingress, call: Call, gate: asyncio.Event,
                                 before: bytes | None = None) -> tuple[list, list]:
    """The chunks up to the second keep-alive sent while `gate` is shut (after a chunk
    holding `before`, when given), then the rest once it opens."""
    from deployments.metrics import RequestTrace

    response = await ingress._answer(call, RequestTrace(ingress.metrics, "/x"))
    body = response.body_iterator
    head: list[bytes] = []
    seen = before is None
    while head.count(KEEP_ALIVE) < 2:
        chunk = await body.__anext__()
        seen = seen or before in chunk
        if seen or chunk != KEEP_ALIVE:
            head.append(chunk)
    gate.set()
    return head, [chunk async for chunk in body]


def test_a_stream_whose_first_event_is_late_starts_with_keep_alives() -> None:
    gate = asyncio.Event()
    ingress, call = _keep_alive_call(_reply(), {0: gate})
    head, rest = asyncio.run(_read_until_gate_opens(ingress, call, gate))
    assert head == [KEEP_ALIVE, KEEP_ALIVE]  # nothing else while the worker prefills
    text = b"".join(c for c in rest if c != KEEP_ALIVE).decode()
    assert '"content":"Hello"' in text and text.endswith("data: [DONE]\n\n")


def test_keep_alives_go_out_while_a_stream_waits_between_events() -> None:
    gate = asyncio.Event()
    ingress, call = _keep_alive_call(_reply(), {1: gate})
    head, rest = asyncio.run(_read_until_gate_opens(ingress, call, gate, before=b"Hello"))
    assert b"Hello" in head[0] and head[1:] == [KEEP_ALIVE, KEEP_ALIVE]
    assert b'"finish_reason":"stop"' in b"".join(rest)


def test_a_refusal_after_a_late_start_ends_the_stream_with_its_message() -> None:
    gate = asyncio.Event()
    rejected = [[Rejected(status=400, message="Bad tool.", param="tools[0]")]]
    ingress, call = _keep_alive_call(rejected, {0: gate})
    head, rest = asyncio.run(_read_until_gate_opens(ingress, call, gate))
    assert head == [KEEP_ALIVE, KEEP_ALIVE]
    text = b"".join(c for c in rest if c != KEEP_ALIVE).decode()
    assert "Bad tool." in text and text.endswith("data: [DONE]\n\n")


def test_without_keep_alive_a_stream_sends_only_its_events() -> None:
    gate = asyncio.Event()
    ingress, call = _keep_alive_call(_reply(), {1: gate})
    call.keep_alive = b""

    async def run() -> list[bytes]:
        from deployments.metrics import RequestTrace

        response = await ingress._answer(call, RequestTrace(ingress.metrics, "/x"))
        body = response.body_iterator
        first = await body.__anext__()
        gate.set()
        return [first] + [chunk async for chunk in body]

    chunks = asyncio.run(run())
    assert b"Hello" in chunks[0] and KEEP_ALIVE not in chunks


def test_a_client_that_leaves_before_the_first_event_cancels_the_request() -> None:
    gate = asyncio.Event()
    ingress, call = _keep_alive_call(_reply(), {0: gate})
    stream = ingress.workers["m"].plays[0]

    async def ping_then_leave() -> bytes:
        from deployments.metrics import RequestTrace

        response = await ingress._answer(call, RequestTrace(ingress.metrics, "/x"))
        body = response.body_iterator
        first = await body.__anext__()
        await body.aclose()
        await asyncio.sleep(0)  # (the cancelled request's own task runs its handler)
        assert stream.cancelled  # now, not when asyncio.run cancels what is left
        return first

    assert asyncio.run(ping_then_leave()) == KEEP_ALIVE
    assert ingress.metrics.snapshot()["flm_client_disconnects_total"] == [[["/x"], 1.0]]


class RequestCancelledError(Exception):  # named as Serve's
    pass


class ServeStream(GatedStream):
    """A GatedStream that ends as Serve's handle does when it was cancelled: an await of
    its next batch that is cancelled raises RequestCancelledError, not CancelledError."""

    async def __anext__(self) -> list:
        try:
            return await super().__anext__()
        except asyncio.CancelledError:
            if self.cancelled:
                raise RequestCancelledError("r") from None
            raise


def test_a_client_that_leaves_a_paced_stream_leaves_no_unretrieved_error() -> None:
    """A keep-alive stream (Anthropic's pings) whose client goes away while its next batch
    is awaited: the request is cancelled on the worker, and that batch's task, whose
    await Serve ends in RequestCancelledError, is not logged as an error never retrieved."""
    import gc

    gate = asyncio.Event()
    ingress, call = _keep_alive_call(_reply(), {1: gate})
    stream = ingress.workers["m"].plays[0] = ServeStream(_reply(), {1: gate})
    reported: list[dict] = []

    async def events_then_leave() -> None:
        from deployments.metrics import RequestTrace

        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: reported.append(ctx))
        response = await ingress._answer(call, RequestTrace(ingress.metrics, "/x"))
        body = response.body_iterator
        assert b"Hello" in await body.__anext__()
        assert await body.__anext__() == KEEP_ALIVE  # the next batch is being awaited
        await body.aclose()
        for _ in range(3):  # the dropped task runs its cancellation
            await asyncio.sleep(0)
        gc.collect()  # (asyncio reports an unretrieved exception when the task goes)

    asyncio.run(events_then_leave())
    assert stream.cancelled
    assert [ctx.get("message") for ctx in reported] == []


def test_head_answers_where_ollama_answers_it() -> None:
    """Liveness checks of Ollama's clients and proxies send HEAD to /, /api/version and
    /api/tags (Ollama registers HEAD there); /health too."""
    worker = FakeWorker()
    client, _ = _client(worker)
    for path in ("/", "/api/version", "/health"):
        r = client.head(path)
        assert r.status_code == 200 and r.content == b"", path
    assert client.get("/api/version").json()["version"]
    assert client.head("/v1/chat/completions").status_code == 405


def test_a_client_that_leaves_a_whole_answer_counts_as_a_499_and_a_disconnect() -> None:
    """A non-streamed request whose client goes away (Serve cancels its handler) is in the
    metrics as the access line has it: status 499, a client disconnect; the worker's
    request is cancelled."""
    from starlette.requests import Request

    from deployments.openai.request import chat_call

    gate = asyncio.Event()
    stream = GatedStream(_reply(), {0: gate})
    ingress = Ingress({"m": FakeWorker(stream)}, {})
    body = json.dumps(CHAT).encode()

    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    request = Request({"type": "http", "method": "POST", "path": "/v1/chat/completions",
                       "headers": [], "query_string": b""}, receive)

    async def leave() -> None:
        task = asyncio.ensure_future(ingress.generate(
            request, "/v1/chat/completions", chat_call, lambda err: None))
        while not ingress.workers["m"].streams:  # the worker has the request
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(leave())
    snap = ingress.metrics.snapshot()
    assert snap["flm_requests_total"] == [[["/v1/chat/completions", "499"], 1.0]]
    assert snap["flm_client_disconnects_total"] == [[["/v1/chat/completions"], 1.0]]
    assert stream.cancelled


def test_a_listing_does_not_wait_on_a_model_whose_workers_are_full(monkeypatch) -> None:
    """Serve's max_ongoing_requests counts a description's call beside the requests: with a
    full batch on every worker it would wait for one of them to end (a minute). /v1/models
    then lists the description the workers gave last; the first one is waited for."""
    import deployments.ingress as ingress_module

    monkeypatch.setattr(ingress_module, "INFO_WAIT_S", 0.05)
    worker = FakeWorker()
    full = asyncio.Event()
    answered = []

    async def info(verbose: bool = False) -> dict:
        if answered:
            await full.wait()  # never set: the batch does not end during this test
        answered.append(verbose)
        return {"id": "m", "created": 1, "context_length": 2048 + len(answered)}

    worker.info = _Method(info)
    client, _ = _client(worker)
    first = client.get("/v1/models").json()["data"][0]
    assert first["context_length"] == 2049
    assert client.get("/v1/models").json()["data"][0] == first
    assert answered == [False]


@pytest.mark.parametrize("origin,allowed", [
    ("http://localhost:3000", True), ("http://127.0.0.1", True), ("https://[::1]:8443", True),
    ("vscode-webview://abc", True), ("tauri://localhost", True),
    ("http://localhost.evil.test", False), ("https://example.test", False),
    ("http://127.0.0.1.evil.test:80", False)])
def test_cors_allows_this_machines_pages_as_ollama_does(origin: str, allowed: bool) -> None:
    """Ollama's default origins (found probing live: a browser page on localhost:3000 got
    no CORS answer unless the config listed its origin)."""
    client, _ = _client(FakeWorker())
    r = client.options("/api/chat", headers={"Origin": origin,
                                              "Access-Control-Request-Method": "POST"})
    assert (r.headers.get("access-control-allow-origin") == origin) is allowed
    assert (r.status_code == 200) is allowed
