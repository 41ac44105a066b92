"""The ingress: HTTP, validation, model routing, streaming and errors, for OpenAI's API
(chat, completions, Responses) and Ollama's (deployments.ollama and
deployments.responses_api translate their requests and render their answers), and the
server's own /metrics (deployments.metrics).

Every generating handler reads the body (`_body`: authenticate, size-check), decodes it
with msgspec (400 on anything malformed), and opens the request on the model's worker
(`_open`: a peek at the worker's first event, so a 400 is still a plain JSON error before
any byte of a 200 stream is sent). Serve's back-pressure becomes a 503 with Retry-After.
Streams are SSE (OpenAI) or NDJSON (Ollama).
"""

# No `from __future__ import annotations`: FastAPI reads these handlers' annotations on the
# replica, where the class (defined in make_ingress) arrives by value without its module.

import asyncio
import logging
import time
from typing import Any

import msgspec
from fastapi import FastAPI, Request
from ray import serve
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from actors.events import Accepted, Deltas, Failed, Finished, GenerateRequest, Rejected, Usage
from actors.metrics import Metrics
from deployments import ollama, responses_api
from deployments.errors import ApiError, error_body, error_response, ollama_error_response
from deployments.metrics import RequestTrace, render
from deployments.responses import (
    DONE,
    ChoiceFold,
    chat_delta,
    chat_logprobs,
    completion_logprobs,
    sse,
    usage_body,
)
from deployments.validate import decode_request, generate_request

log = logging.getLogger(__name__)
RETRY_AFTER_S = "1"
# tries of a request whose worker dies before answering (each on a replica the router
# still believes alive; the router drops a replica it saw die)
START_ATTEMPTS = 3


def _is_backpressure(exc: BaseException) -> bool:
    return type(exc).__name__ in ("BackPressureError",)


_REPLICA_GONE = ("RayActorError", "ActorDiedError", "ActorUnavailableError")


def _is_replica_death(exc: BaseException) -> bool:
    """The replica's actor is gone (not an error raised by our code)."""
    return type(exc).__name__ in _REPLICA_GONE


def _is_worker_death(exc: BaseException) -> bool:
    return type(exc).__name__ in (*_REPLICA_GONE, "RayTaskError", "DeploymentUnavailableError")


class _Traced:
    """A request's event stream from its worker, showing each batch to the request's trace."""

    def __init__(self, gen: Any, trace: RequestTrace) -> None:
        self.gen, self.trace = gen, trace

    def __aiter__(self) -> "_Traced":
        return self

    async def __anext__(self) -> list:
        batch = await self.gen.__anext__()
        self.trace.saw(batch)
        return batch

    def cancel(self) -> None:
        self.gen.cancel()


def make_ingress(config: dict[str, Any]):
    """The ingress deployment class for an app config (see deployments.app.AppConfig)."""
    app = FastAPI(title="flm-serve", docs_url=None, redoc_url=None)
    if config.get("cors_origins"):
        app.add_middleware(CORSMiddleware, allow_origins=config["cors_origins"],
                           allow_methods=["*"], allow_headers=["*"])

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        """An unknown path (404) or method (405): the routing's errors, in OpenAI's shape
        (Ollama's under /api/: its clients read `error` as a string)."""
        path = request.url.path
        ollama_route = path.startswith("/api/")
        text = {404: f"Unknown path {path!r}; see " + ("/api/tags." if ollama_route
                                                      else "/v1/models."),
                405: f"{request.method} is not allowed on {path!r}."}
        err = ApiError(exc.status_code, text.get(exc.status_code, exc.detail),
                       headers=dict(exc.headers or {}))
        return ollama_error_response(err) if ollama_route else error_response(err)

    @serve.deployment
    @serve.ingress(app)
    class OpenAIIngress:
        def __init__(self, workers: dict[str, Any], settings: dict[str, Any],
                     hub: Any = None) -> None:
            self.hub = hub  # the MetricsHub deployment's handle
            self.metrics = Metrics()
            replica = getattr(serve.get_replica_context(), "replica_id", None)
            self.replica = str(getattr(replica, "unique_id", replica))
            self.workers = workers
            self.streams = {name: h.options(stream=True, _by_reference=False)
                            for name, h in workers.items()}
            self.store = responses_api.ResponseStore()  # this replica's stored responses
            self.api_key = settings.get("api_key")
            self.max_bytes = int(settings.get("max_request_bytes") or 4 << 20)

        @app.get("/health")
        async def health(self) -> dict:
            return {"status": "ok"}

        @app.get("/v1/models")
        async def models(self, request: Request) -> Response:
            try:
                self._authenticate(request)
            except ApiError as err:
                return error_response(err)
            infos = await self._infos()
            return JSONResponse({"object": "list",
                                 "data": [self._model_card(n, i) for n, i in infos.items()]})

        @app.get("/v1/models/{model_id:path}")
        async def model(self, model_id: str, request: Request) -> Response:
            try:
                self._authenticate(request)
                self._check_model(model_id)
            except ApiError as err:
                return error_response(err)
            return JSONResponse(self._model_card(model_id, await self._info(model_id)))

        @staticmethod
        def _model_card(name: str, info: dict) -> dict:
            return {"id": name, "object": "model", "created": info.get("created", 0),
                    "owned_by": "flm-serve", "context_length": info.get("context_length")}

        async def _info(self, name: str) -> dict:
            """A model's description from one of its workers (a bare one when its workers
            are all down: the model is still listed)."""
            try:
                return await self.workers[name].info.remote()
            except Exception:
                return {"id": name, "created": 0}

        async def _infos(self) -> dict[str, dict]:
            names = list(self.workers)
            return dict(zip(names, await asyncio.gather(*(self._info(n) for n in names))))

        @app.post("/v1/chat/completions")
        async def chat_completions(self, request: Request) -> Response:
            return await self._traced("/v1/chat/completions",
                                      lambda trace: self._serve(request, "chat", trace))

        @app.post("/v1/completions")
        async def completions(self, request: Request) -> Response:
            return await self._traced("/v1/completions",
                                      lambda trace: self._serve(request, "completion", trace))

        # -- OpenAI's Responses API --------------------------------------------------------
        @app.post("/v1/responses")
        async def responses(self, request: Request) -> Response:
            return await self._traced("/v1/responses",
                                      lambda trace: self._serve_responses(request, trace))

        @app.get("/v1/responses/{response_id}")
        async def get_response(self, response_id: str, request: Request) -> Response:
            try:
                self._authenticate(request)
                return JSONResponse(self.store.get(response_id)[0])
            except ApiError as err:
                return error_response(err)

        @app.delete("/v1/responses/{response_id}")
        async def delete_response(self, response_id: str, request: Request) -> Response:
            try:
                self._authenticate(request)
                self.store.delete(response_id)
            except ApiError as err:
                return error_response(err)
            return JSONResponse({"id": response_id, "object": "response", "deleted": True})

        # -- Ollama's API ------------------------------------------------------------------
        @app.api_route("/", methods=["GET", "HEAD"])
        async def root(self) -> Response:
            return PlainTextResponse("Ollama is running")

        @app.get("/api/version")
        async def ollama_version(self) -> dict:
            return {"version": ollama.OLLAMA_VERSION}

        @app.get("/api/tags")
        async def ollama_tags(self, request: Request) -> Response:
            return await self._ollama_list(request, ollama.tag)

        @app.get("/api/ps")
        async def ollama_ps(self, request: Request) -> Response:
            return await self._ollama_list(request, ollama.ps_entry)

        async def _ollama_list(self, request: Request, entry) -> Response:
            """Every model as `entry(name, info)` renders it, under "models"."""
            try:
                self._authenticate(request)
            except ApiError as err:
                return ollama_error_response(err)
            infos = await self._infos()
            return JSONResponse({"models": [entry(n, i) for n, i in infos.items()]})

        @app.post("/api/show")
        async def ollama_show(self, request: Request) -> Response:
            try:
                req = ollama.decode(await self._body(request), ollama.ShowIn)
                name = self._ollama_model(req.model or req.name or "")
                try:
                    info = await self.workers[name].info.remote(True)
                except Exception:
                    raise ApiError(503, "The model's workers are unavailable; retry shortly.",
                                   headers={"Retry-After": RETRY_AFTER_S}) from None
            except ApiError as err:
                return ollama_error_response(err)
            return JSONResponse(ollama.show(info))

        @app.post("/api/chat")
        async def ollama_chat(self, request: Request) -> Response:
            return await self._traced("/api/chat",
                                      lambda trace: self._serve_ollama(request, "chat", trace),
                                      ollama_error_response)

        @app.post("/api/generate")
        async def ollama_generate(self, request: Request) -> Response:
            return await self._traced(
                "/api/generate", lambda trace: self._serve_ollama(request, "generate", trace),
                ollama_error_response)

        # -- metrics ---------------------------------------------------------------------
        @app.get("/metrics")
        async def prometheus_metrics(self, request: Request) -> Response:
            """Prometheus text of every replica's metrics (this one's as of now)."""
            try:
                self._authenticate(request)
            except ApiError as err:
                return error_response(err)
            snapshot = self.metrics.snapshot()
            text = (render([snapshot]) if self.hub is None
                    else await self.hub.text.remote(self.replica, snapshot))
            return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

        async def check_health(self) -> None:
            if self.hub is not None:  # not awaited: a slow hub never fails a check
                self.hub.push.remote(self.replica, self.metrics.snapshot())

        async def _traced(self, route: str, run, errors=error_response) -> Response:
            """`run(trace)`'s response, its errors as `errors` renders them (OpenAI's shape
            or Ollama's), and its status, duration and tokens recorded."""
            trace = RequestTrace(self.metrics, route)
            try:
                response = await run(trace)
            except ApiError as err:
                response = errors(err)
            except Exception:  # a bug, never user input: still an error body of the API's
                log.exception("request failed")
                response = errors(ApiError(500, "Internal error.", type="server_error"))
            trace.answered(response.status_code, isinstance(response, StreamingResponse))
            return response

        # -- the shared path ---------------------------------------------------------------
        def _authenticate(self, request: Request) -> None:
            if not self.api_key:
                return
            auth = request.headers.get("authorization", "")
            if auth != f"Bearer {self.api_key}":
                raise ApiError(401, "Incorrect API key provided.", code="invalid_api_key")

        async def _body(self, request: Request) -> bytes:
            self._authenticate(request)
            body = await request.body()
            if len(body) > self.max_bytes:
                raise ApiError(413, f"The request body is larger than {self.max_bytes} "
                                    "bytes.", code="request_too_large")
            return body

        async def _open(self, model: str, greq: GenerateRequest,
                        trace: RequestTrace) -> tuple[Any, list]:
            """The request's stream on `model`'s worker (each batch shown to `trace`) and
            what came after its Accepted.

            Raises:
                ApiError: the worker rejected the request (its status), or answered out of
                    order (503).
            """
            trace.model = model
            gen, head = await self._start(self.streams[model], greq)
            gen = _Traced(gen, trace)
            trace.saw(head)
            first = head[0] if head else None
            if isinstance(first, Rejected):
                raise ApiError(first.status, first.message, param=first.param,
                               code=first.code, type=first.type)
            if not isinstance(first, Accepted):
                raise ApiError(503, "The model worker answered out of order.")
            return gen, head[1:]

        async def _serve(self, request: Request, kind: str, trace: RequestTrace) -> Response:
            req, raw = decode_request(await self._body(request), kind)
            self._check_model(req.model)
            greq = generate_request(req, raw, kind)
            gen, head = await self._open(req.model, greq, trace)
            meta = {"id": ("chatcmpl-" if kind == "chat" else "cmpl-") + greq.request_id,
                    "created": int(time.time()), "model": req.model}
            if not req.stream:
                return await self._collect(gen, head, kind, meta)
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
            started: set[int] = set()
            offsets: dict[int, int] = {}

            def render(batch: list) -> bytes:
                return b"".join(self._chunks(batch, kind, obj, meta, started, offsets,
                                             include_usage))

            broken = sse(error_body("The model worker failed during the stream.",
                                    type="server_error"))
            return StreamingResponse(self._stream(gen, head, render, broken, DONE),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})

        async def _serve_responses(self, request: Request, trace: RequestTrace) -> Response:
            req = responses_api.decode(await self._body(request))
            self._check_model(req.model)
            history: list[dict] = []
            if req.previous_response_id:
                try:
                    _, history = self.store.get(req.previous_response_id)
                except ApiError as err:
                    err.param = "previous_response_id"
                    raise
            greq, conversation = responses_api.chat_request(req, history)
            gen, head = await self._open(req.model, greq, trace)
            builder = responses_api.ResponseBuilder(
                responses_api.response_base(req, "resp_" + greq.request_id))
            store = req.store is not False

            def keep() -> None:  # once the response is finished (idempotent)
                if store and builder.usage is not None and builder.error is None:
                    self.store.put(builder.response(),
                                   conversation + builder.assistant_messages())

            if not req.stream:
                await self._drain(gen, head, builder.add)
                if builder.error is not None:
                    raise ApiError(503, builder.error, type="server_error")
                keep()
                return JSONResponse(builder.response())

            def render(batch: list) -> bytes:
                events = builder.add(batch)
                if builder.usage is not None:
                    keep()
                return responses_api.sse(events)

            broken = responses_api.sse([{"type": "error", "code": "server_error",
                                         "message": "The model worker failed during "
                                                    "the stream.", "param": None,
                                         "sequence_number": -1}])
            # response.created and .in_progress go out before the first token
            return StreamingResponse(self._stream(gen, head, render, broken, b"",
                                                  responses_api.sse(builder.start())),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})

        def _check_model(self, name: str) -> None:
            if name not in self.streams:
                raise ApiError(404, f"The model '{name}' does not exist; see /v1/models.",
                               param="model", code="model_not_found")

        def _ollama_model(self, name: str) -> str:
            model = ollama.model_name(name)
            if model not in self.streams:
                raise ApiError(404, f"model '{name}' not found; see /api/tags.")
            return model

        async def _serve_ollama(self, request: Request, endpoint: str,
                                trace: RequestTrace) -> Response:
            body = await self._body(request)
            if endpoint == "chat":
                req = ollama.decode(body, ollama.ChatIn)
                empty = not req.messages
            else:
                req = ollama.decode(body, ollama.GenerateIn)
                empty = not req.prompt and not req.system
            model = self._ollama_model(req.model)
            if empty:  # Ollama's way to load a model: nothing to generate
                return JSONResponse(ollama.load_reply(req.model, endpoint,
                                                      req.keep_alive))
            greq = (ollama.chat_request(req) if endpoint == "chat"
                    else ollama.generate_request(req))
            gen, head = await self._open(model, greq, trace)
            reply = ollama.OllamaReply(req.model, endpoint, trace.started)
            if req.stream is False:
                await self._drain(gen, head, reply.add)
                if reply.error is not None:
                    raise ApiError(503, reply.error, type="server_error")
                return Response(ollama.ndjson([reply.final()]).rstrip(),
                                media_type="application/json")

            def render(batch: list) -> bytes:
                return ollama.ndjson(reply.add(batch))

            broken = ollama.ndjson([{"error": "The model worker failed during the "
                                              "stream."}])
            return StreamingResponse(self._stream(gen, head, render, broken, b""),
                                     media_type="application/x-ndjson")

        @staticmethod
        async def _start(handle, greq: GenerateRequest) -> tuple[Any, list]:
            """The request's stream and its first batch: [Rejected], or Accepted and what
            came with it. A worker that died before answering has produced nothing, so the
            request goes again, to a replica the router still believes alive."""
            attempts = START_ATTEMPTS
            while True:
                gen = handle.generate.remote(greq)
                try:
                    return gen, await gen.__anext__()
                except StopAsyncIteration:
                    raise ApiError(503, "The model worker closed the request.") from None
                except Exception as exc:
                    if _is_backpressure(exc):
                        raise ApiError(503, "The server is busy; retry shortly.",
                                       code="overloaded",
                                       headers={"Retry-After": RETRY_AFTER_S}) from None
                    if not _is_worker_death(exc):
                        raise
                    attempts -= 1
                    if not attempts or not _is_replica_death(exc):
                        raise ApiError(503, "The model worker is unavailable; retry shortly.",
                                       headers={"Retry-After": RETRY_AFTER_S}) from None

        @staticmethod
        async def _batches(head: list, gen):
            if head:
                yield head
            async for batch in gen:
                yield batch

        async def _stream(self, gen, head: list, render, broken: bytes, tail: bytes,
                          lead: bytes = b""):
            """The response body of a stream: `lead`, then each batch of events rendered;
            `broken` if the worker fails mid-stream; `tail` at the end. A client that goes
            away cancels the request on the worker."""
            finished = False
            try:
                if lead:
                    yield lead
                async for batch in self._batches(head, gen):
                    out = render(batch)
                    if out:
                        yield out
                finished = True
            except asyncio.CancelledError:  # the client went away
                raise
            except Exception as exc:
                log.warning("stream broke: %r", exc)
                yield broken
                finished = True
            finally:
                if not finished:
                    gen.cancel()
                gen.trace.ended(disconnected=not finished)
            if tail:
                yield tail

        @staticmethod
        def _chunks(batch, kind, obj, meta, started, offsets, include_usage):
            def chunk(choices: list, usage: Any = None) -> bytes:
                body = {**meta, "object": obj, "choices": choices}
                if include_usage:
                    body["usage"] = usage
                return sse(body)

            for ev in batch:
                if isinstance(ev, Deltas):
                    if kind == "chat":
                        choice = {"index": ev.index,
                                  "delta": chat_delta(ev, first=ev.index not in started),
                                  "logprobs": chat_logprobs(ev.logprobs),
                                  "finish_reason": None}
                    else:
                        off = offsets.get(ev.index, 0)
                        choice = {"index": ev.index, "text": ev.text,
                                  "logprobs": completion_logprobs(ev.logprobs, off),
                                  "finish_reason": None}
                        offsets[ev.index] = off + len(ev.text)
                    started.add(ev.index)
                    yield chunk([choice])
                elif isinstance(ev, Finished):
                    if kind == "chat":
                        delta = {"role": "assistant"} if ev.index not in started else {}
                        choice = {"index": ev.index, "delta": delta, "logprobs": None,
                                  "finish_reason": ev.finish_reason}
                    else:
                        choice = {"index": ev.index, "text": "", "logprobs": None,
                                  "finish_reason": ev.finish_reason}
                    started.add(ev.index)
                    yield chunk([choice])
                elif isinstance(ev, Usage):
                    if include_usage:
                        yield chunk([], usage_body(ev))
                elif isinstance(ev, Failed):
                    yield sse(error_body(ev.message, type="server_error"))

        async def _drain(self, gen, head: list, on_batch) -> None:
            """Every batch of a request's events to `on_batch`; a worker that dies on the
            way is a 503."""
            try:
                async for batch in self._batches(head, gen):
                    on_batch(batch)
            except ApiError:
                raise
            except Exception as exc:
                if _is_worker_death(exc):
                    raise ApiError(503, "The model worker failed during the request.",
                                   headers={"Retry-After": RETRY_AFTER_S}) from None
                raise

        async def _collect(self, gen, head: list, kind: str, meta: dict) -> Response:
            folds: dict[int, ChoiceFold] = {}
            usage = usage_body(Usage(prompt_tokens=0, completion_tokens=0))

            def fold(batch: list) -> None:
                nonlocal usage
                for ev in batch:
                    if isinstance(ev, Deltas):
                        folds.setdefault(ev.index, ChoiceFold()).add(ev)
                    elif isinstance(ev, Finished):
                        f = folds.setdefault(ev.index, ChoiceFold())
                        f.finish_reason = ev.finish_reason
                        f.final = ev.message
                    elif isinstance(ev, Usage):
                        usage = usage_body(ev)
                    elif isinstance(ev, Failed):
                        raise ApiError(503, ev.message, type="server_error")

            await self._drain(gen, head, fold)
            choices = []
            for i in sorted(folds):
                f = folds[i]
                if kind == "chat":
                    choices.append({"index": i, "message": f.chat_message(),
                                    "logprobs": chat_logprobs(f.logprobs),
                                    "finish_reason": f.finish_reason})
                else:
                    choices.append({"index": i, "text": "".join(f.content),
                                    "logprobs": completion_logprobs(f.logprobs, 0),
                                    "finish_reason": f.finish_reason})
            obj = "chat.completion" if kind == "chat" else "text_completion"
            return Response(msgspec.json.encode({**meta, "object": obj, "choices": choices,
                                                 "usage": usage}),
                            media_type="application/json")

    return OpenAIIngress
