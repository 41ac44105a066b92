"""The OpenAI ingress: HTTP, validation, model routing, SSE and errors.

Every handler goes through `_serve`: authenticate, size-check, decode the body with msgspec
(400 on anything malformed), pick the model's worker (404), then peek at the worker's first
event so a 400 is still a plain JSON error before any byte of a 200 stream is sent.
Serve's back-pressure becomes an OpenAI-shaped 503 with Retry-After.
"""

# No `from __future__ import annotations`: FastAPI reads these handlers' annotations on the
# replica, where the class (defined in make_ingress) arrives by value without its module.

import asyncio
import logging
import time
import uuid
from typing import Any

import msgspec
from fastapi import FastAPI, Request
from ray import serve
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse, Response, StreamingResponse

from actors.events import Accepted, Deltas, Failed, Finished, GenerateRequest, Rejected, Usage
from deployments.errors import ApiError, error_body, error_response
from deployments.responses import (
    DONE,
    ChoiceFold,
    chat_delta,
    chat_logprobs,
    completion_logprobs,
    sse,
)
from deployments.schemas import CONSTRAINT_FIELDS
from deployments.validate import decode_request

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


def make_ingress(config: dict[str, Any]):
    """The ingress deployment class for an app config (see deployments.app.AppConfig)."""
    app = FastAPI(title="flm-serve", docs_url=None, redoc_url=None)
    if config.get("cors_origins"):
        app.add_middleware(CORSMiddleware, allow_origins=config["cors_origins"],
                           allow_methods=["*"], allow_headers=["*"])

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        """An unknown path (404) or method (405): the routing's errors, in OpenAI's shape."""
        text = {404: f"Unknown path {request.url.path!r}; see /v1/models.",
                405: f"{request.method} is not allowed on {request.url.path!r}."}
        return error_response(ApiError(exc.status_code, text.get(exc.status_code, exc.detail),
                                       headers=dict(exc.headers or {})))

    @serve.deployment
    @serve.ingress(app)
    class OpenAIIngress:
        def __init__(self, workers: dict[str, Any], settings: dict[str, Any]) -> None:
            self.workers = workers
            self.streams = {name: h.options(stream=True, _by_reference=False)
                            for name, h in workers.items()}
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
            data = [await self._model_card(name) for name in self.workers]
            return JSONResponse({"object": "list", "data": data})

        @app.get("/v1/models/{model_id:path}")
        async def model(self, model_id: str, request: Request) -> Response:
            try:
                self._authenticate(request)
                if model_id not in self.workers:
                    raise ApiError(404, f"The model '{model_id}' does not exist; see "
                                        "/v1/models.", param="model", code="model_not_found")
            except ApiError as err:
                return error_response(err)
            return JSONResponse(await self._model_card(model_id))

        async def _model_card(self, name: str) -> dict:
            try:
                info = await self.workers[name].info.remote()
            except Exception:  # a model whose workers are all down is still listed
                info = {"id": name, "created": 0}
            return {"id": name, "object": "model", "created": info.get("created", 0),
                    "owned_by": "flm-serve", "context_length": info.get("context_length")}

        @app.post("/v1/chat/completions")
        async def chat_completions(self, request: Request) -> Response:
            return await self._serve(request, "chat")

        @app.post("/v1/completions")
        async def completions(self, request: Request) -> Response:
            return await self._serve(request, "completion")

        # -- the shared path ---------------------------------------------------------------
        def _authenticate(self, request: Request) -> None:
            if not self.api_key:
                return
            auth = request.headers.get("authorization", "")
            if auth != f"Bearer {self.api_key}":
                raise ApiError(401, "Incorrect API key provided.", code="invalid_api_key")

        async def _serve(self, request: Request, kind: str) -> Response:
            try:
                self._authenticate(request)
                body = await request.body()
                if len(body) > self.max_bytes:
                    raise ApiError(413, f"The request body is larger than {self.max_bytes} "
                                        "bytes.", code="request_too_large")
                req, raw = decode_request(body, kind)
                if req.model not in self.streams:
                    raise ApiError(404, f"The model '{req.model}' does not exist; see "
                                        "/v1/models.", param="model", code="model_not_found")
                greq = self._generate_request(req, raw, kind)
                gen, head = await self._start(self.streams[req.model], greq)
                first = head[0] if head else None
                if isinstance(first, Rejected):
                    raise ApiError(first.status, first.message, param=first.param,
                                   code=first.code, type=first.type)
                if not isinstance(first, Accepted):
                    raise ApiError(503, "The model worker answered out of order.")
                meta = {"id": ("chatcmpl-" if kind == "chat" else "cmpl-") + greq.request_id,
                        "created": int(time.time()), "model": req.model}
                include_usage = bool(req.stream_options and req.stream_options.include_usage)
                if req.stream:
                    return StreamingResponse(self._stream(gen, head[1:], kind, meta,
                                                          include_usage),
                                             media_type="text/event-stream",
                                             headers={"Cache-Control": "no-cache"})
                return await self._collect(gen, head[1:], kind, meta)
            except ApiError as err:
                return error_response(err)
            except Exception:  # a bug, never user input: still an OpenAI-shaped body
                log.exception("request failed")
                return JSONResponse(error_body("Internal error.", type="server_error"),
                                    status_code=500)

        @staticmethod
        def _generate_request(req, raw: dict, kind: str) -> GenerateRequest:
            stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
            common = dict(
                request_id=uuid.uuid4().hex, kind=kind, n=req.n or 1, stop=stop,
                temperature=req.temperature, top_p=req.top_p,
                top_k=None if req.top_k in (None, -1) else req.top_k, min_p=req.min_p,
                repetition_penalty=req.repetition_penalty,
                presence_penalty=req.presence_penalty or 0.0,
                frequency_penalty=req.frequency_penalty or 0.0, seed=req.seed,
                ignore_eos=bool(req.ignore_eos))
            if kind == "chat":
                messages = []
                for m in req.messages:
                    msg = msgspec.to_builtins(m)
                    if msg.get("role") == "developer":
                        msg["role"] = "system"
                    if msg.get("reasoning") and not msg.get("reasoning_content"):
                        msg["reasoning_content"] = msg["reasoning"]
                    messages.append({k: v for k, v in msg.items() if v is not None})
                top = req.top_logprobs or 0
                return GenerateRequest(
                    messages=messages, body={k: raw.get(k) for k in CONSTRAINT_FIELDS},
                    max_tokens=req.max_completion_tokens or req.max_tokens,
                    logprobs=bool(req.logprobs), top_logprobs=top, **common)
            prompt = req.prompt if isinstance(req.prompt, str) else req.prompt[0]
            return GenerateRequest(prompt=prompt, max_tokens=req.max_tokens or 16,
                                   logprobs=req.logprobs is not None,
                                   top_logprobs=req.logprobs or 0, **common)

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

        async def _stream(self, gen, head: list, kind: str, meta: dict, include_usage: bool):
            obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
            started: set[int] = set()
            offsets: dict[int, int] = {}
            finished = False
            try:
                async for batch in self._batches(head, gen):
                    out = b"".join(self._chunks(batch, kind, obj, meta, started, offsets,
                                                include_usage))
                    if out:
                        yield out
                finished = True
            except asyncio.CancelledError:  # the client went away
                raise
            except Exception as exc:
                log.warning("stream for %s broke: %r", meta["id"], exc)
                yield sse(error_body("The model worker failed during the stream.",
                                     type="server_error"))
                finished = True
            finally:
                if not finished:
                    gen.cancel()
            yield DONE

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
                        yield chunk([], {"prompt_tokens": ev.prompt_tokens,
                                         "completion_tokens": ev.completion_tokens,
                                         "total_tokens": ev.prompt_tokens
                                         + ev.completion_tokens})
                elif isinstance(ev, Failed):
                    yield sse(error_body(ev.message, type="server_error"))

        async def _collect(self, gen, head: list, kind: str, meta: dict) -> Response:
            folds: dict[int, ChoiceFold] = {}
            usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
            try:
                async for batch in self._batches(head, gen):
                    for ev in batch:
                        if isinstance(ev, Deltas):
                            folds.setdefault(ev.index, ChoiceFold()).add(ev)
                        elif isinstance(ev, Finished):
                            fold = folds.setdefault(ev.index, ChoiceFold())
                            fold.finish_reason = ev.finish_reason
                            fold.final = ev.message
                        elif isinstance(ev, Usage):
                            usage = {"prompt_tokens": ev.prompt_tokens,
                                     "completion_tokens": ev.completion_tokens,
                                     "total_tokens": ev.prompt_tokens + ev.completion_tokens}
                        elif isinstance(ev, Failed):
                            raise ApiError(503, ev.message, type="server_error")
            except ApiError:
                raise
            except Exception as exc:
                if _is_worker_death(exc):
                    raise ApiError(503, "The model worker failed during the request.",
                                   headers={"Retry-After": RETRY_AFTER_S}) from None
                raise
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
