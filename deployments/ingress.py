"""The ingress: ONE request path for every generating route of every API, and what the
routes share (the served models, authentication, the body's size limit, metrics).

`Ingress.generate(request, route, make_call, errors)`: authenticate and read the body,
`make_call(body, ingress)` (the API's request module: decode, validate, type the request
once -> a `Call`), open the request on the model's worker (a peek at its first event, so a
400 is still a plain JSON error before any byte of a 200 stream; a worker that died before
answering is retried on another replica; Serve's back-pressure is a 503 with Retry-After),
then stream the reply's bytes or fold the events into one body; a client that goes away
cancels the request on the worker. Errors are rendered by `errors` (the API's shape). A
Call with `keep_alive` bytes (Anthropic's ping) gets them whenever its stream waits
`keep_alive_s` for an event; when its first event is that late (a long prompt prefills),
the stream starts at once, and a refusal that comes after is the stream's error event.

A models_dir's models (deployments.library, which the Ingress extends) are resolved beside
the configured ones and reach the library worker with their multiplexed model id.

The routes themselves live in each API's sub-package (`routes.py`: a FastAPI router whose
handlers get this replica's Ingress through `current`); deployments.server puts them
together into the Serve deployment.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Annotated, Any

from fastapi import Depends
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from actors.events import Accepted, ChatGenerate, Failed, GenerateRequest, Rejected
from actors.metrics import Metrics
from deployments.access import CLIENT_CLOSED, TRACE_KEY
from deployments.errors import ApiError
from deployments.exchange import Call, Reply
from deployments.library import LibraryFront
from deployments.metrics import RequestTrace

log = logging.getLogger(__name__)
RETRY_AFTER_S = "1"
# how long a listing waits for a model's description from its workers when it has an earlier
# one: a worker with as many requests as its batch takes (Serve's max_ongoing_requests,
# which counts this call too) answers when one of them ends, which can be minutes
INFO_WAIT_S = 1.0
# a batch's requests open at once on the model's workers (the rest wait their turn here)
PARTS_OPEN = 8
# tries of a request whose worker dies before answering (each on a replica the router
# still believes alive; the router drops a replica it saw die)
START_ATTEMPTS = 3
_REPLICA_GONE = ("RayActorError", "ActorDiedError", "ActorUnavailableError")


def _is_backpressure(exc: BaseException) -> bool:
    return type(exc).__name__ == "BackPressureError"


def _is_replica_death(exc: BaseException) -> bool:
    """The replica's actor is gone (not an error raised by our code)."""
    return type(exc).__name__ in _REPLICA_GONE


def _is_worker_death(exc: BaseException) -> bool:
    return type(exc).__name__ in (*_REPLICA_GONE, "RayTaskError", "DeploymentUnavailableError")


def current() -> Ingress:
    """This replica's Ingress (a FastAPI dependency of every route; tests override it)."""
    from ray import serve

    return serve.get_replica_context().servable_object


# a route handler's parameter `ingress: Current` is this replica's Ingress
Current = Annotated["Ingress", Depends(current)]


def _replica_id() -> str:
    try:
        from ray import serve

        replica = getattr(serve.get_replica_context(), "replica_id", None)
    except Exception:  # not on a Serve replica (unit tests)
        return "local"
    return str(getattr(replica, "unique_id", replica))


_END = object()


async def _next(it: AsyncIterator) -> object:
    try:
        return await anext(it)
    except StopAsyncIteration:
        return _END


def _settled(task: asyncio.Task) -> None:
    """Take a dropped task's outcome: a worker stream cancelled under it ends in Serve's
    RequestCancelledError, which asyncio would otherwise log as never retrieved."""
    if not task.cancelled():
        task.exception()


async def _paced(batches: AsyncIterator[list], every: float) -> AsyncIterator[list | None]:
    """`batches`, with a None each time `every` seconds pass without one (the next batch
    is awaited throughout, never cancelled for the pause)."""
    step: asyncio.Task | None = None
    try:
        while True:
            step = asyncio.ensure_future(_next(batches))
            while not (await asyncio.wait({step}, timeout=every))[0]:
                yield None
            batch, step = step.result(), None
            if batch is _END:
                return
            yield batch
    finally:
        if step is not None:
            step.cancel()
            step.add_done_callback(_settled)


class _Traced:
    """A request's event stream from its worker, showing each batch to the request's trace."""

    def __init__(self, gen: Any, trace: RequestTrace) -> None:
        self.gen, self.trace = gen, trace

    def __aiter__(self) -> _Traced:
        return self

    async def __anext__(self) -> list:
        batch = await self.gen.__anext__()
        self.trace.saw(batch)
        return batch

    def cancel(self) -> None:
        self.gen.cancel()


class Ingress(LibraryFront):
    """One ingress replica.

    Args:
        workers: each served model's worker deployment handle, by model name.
        settings: `api_key` (when set, a request must carry it as a bearer token or as
            `x-api-key`, Anthropic's header), `max_request_bytes`.
        hub: the MetricsHub deployment's handle (None: this replica's metrics alone).
        library: the library worker deployment's handle, serving every model of
            `settings["models_dir"]` (None: no library). A name the config serves itself
            comes first.
    """

    def __init__(self, workers: dict[str, Any], settings: dict[str, Any],
                 hub: Any = None, library: Any = None) -> None:
        self.hub = hub
        self.metrics = Metrics()
        self.replica = _replica_id()
        self.workers = workers
        self.streams = {name: h.options(stream=True, _by_reference=False)
                        for name, h in workers.items()}
        self.api_key = settings.get("api_key")
        self.max_bytes = int(settings.get("max_request_bytes") or 4 << 20)
        self._state: dict[str, Any] = {}
        self._described: dict[tuple[str, bool], dict] = {}  # each model's last description
        LibraryFront.__init__(self, library, settings)

    def state(self, key: str, make: Callable[[], Any]) -> Any:
        """An API's own per-replica state (Responses' stored responses), made on first use."""
        if key not in self._state:
            self._state[key] = make()
        return self._state[key]

    async def check_health(self) -> None:
        if self.hub is not None:  # not awaited: a slow hub never fails a check
            self.hub.push.remote(self.replica, self.metrics.snapshot())

    # -- what routes share -------------------------------------------------------------
    def authenticate(self, request: Request) -> None:
        if not self.api_key:
            return
        auth = request.headers.get("authorization", "")
        if auth != f"Bearer {self.api_key}" and \
                request.headers.get("x-api-key") != self.api_key:
            raise ApiError(401, "Incorrect API key provided.", code="invalid_api_key")

    async def body(self, request: Request) -> bytes:
        """The authenticated request's body, within the size limit."""
        self.authenticate(request)
        body = await request.body()
        if len(body) > self.max_bytes:
            raise ApiError(413, f"The request body is larger than {self.max_bytes} bytes.",
                           code="request_too_large")
        return body

    def check_model(self, name: str) -> None:
        if self.resolve(name) is None:
            raise ApiError(404, f"The model '{name}' does not exist; see /v1/models.",
                           param="model", code="model_not_found")

    def served(self, name: str | None) -> str:
        """The served model a request names: the only one when it names none and the server
        serves one model (no models_dir), as llama-server and vLLM take a body without
        `model` (the tokenizer and rerank routes).

        Raises:
            ApiError: 400 `model` missing where there is a choice; 404 an unknown model.
        """
        if name is None:
            if len(self.streams) == 1 and self.library is None:
                return next(iter(self.streams))
            raise ApiError(400, "'model' is required: this server serves more than one "
                                "model; see /v1/models.", param="model")
        self.check_model(name)
        return self.resolve(name) or name

    async def info(self, name: str, verbose: bool = False) -> dict:
        """A model's description from one of its workers (the one they gave last when none
        answers within INFO_WAIT_S: each is busy with a full batch; a bare one when its
        workers are all down: the model is still listed; a model that could not load says
        why under "error", and `verbose` asks for what it does not have: the error itself);
        a library model's from its header."""
        if name not in self.workers:
            return self.library_info(name, verbose)
        known = self._described.get((name, verbose))
        try:
            info = await asyncio.wait_for(self._ask_info(name, verbose),
                                          INFO_WAIT_S if known is not None else None)
        except Exception as exc:
            if known is None or not isinstance(exc, TimeoutError):
                if verbose:
                    raise ApiError(503, "The model's workers are unavailable; retry shortly.",
                                   headers={"Retry-After": RETRY_AFTER_S}) from None
                return {"id": name, "created": 0}
            info = known
        self._described[(name, verbose)] = info
        if verbose and info.get("error"):
            raise ApiError(500, info["error"], param="model", code="model_unavailable")
        return info

    async def _ask_info(self, name: str, verbose: bool) -> dict:
        return await self.workers[name].info.remote(verbose)

    async def count_tokens(self, name: str, request: ChatGenerate) -> int:
        """The prompt tokens of `request` on model `name`, counted by one of its workers
        with the model's template and tokenizer (nothing is generated).

        Raises:
            ApiError: the template refuses the request (its status), or the workers are
                busy or unavailable (503 with Retry-After).
        """
        try:
            handle = self.workers.get(name)
            if handle is None:  # a library model: on a replica that holds it (or loads it)
                target = self._library_target(self.resolve(name) or name)
                handle = self.library_handle.options(multiplexed_model_id=target)
                request = self.with_variant_template(name, request)
            first = await handle.count_tokens.remote(request)
        except Exception as exc:
            if _is_backpressure(exc):
                raise ApiError(503, "The server is busy; retry shortly.", code="overloaded",
                               headers={"Retry-After": RETRY_AFTER_S}) from None
            if _is_worker_death(exc):
                raise ApiError(503, "The model worker is unavailable; retry shortly.",
                               headers={"Retry-After": RETRY_AFTER_S}) from None
            raise
        if isinstance(first, Rejected):
            raise ApiError(first.status, first.message, param=first.param, code=first.code,
                           type=first.type)
        return first.prompt_tokens

    async def infos(self) -> dict[str, dict]:
        """Every served model's description: the configured ones, then the library's."""
        names = list(self.workers)
        infos = dict(zip(names, await asyncio.gather(*(self.info(n) for n in names))))
        return {**infos, **(await self.library_models())}

    # -- the one request path ----------------------------------------------------------
    async def generate(self, request: Request, route: str,
                       make_call: Callable[[bytes, Ingress], Call | Awaitable[Call]],
                       errors: Callable[[ApiError], Response]) -> Response:
        """A generating route's response: `make_call` types the body (awaited where it
        asks a worker first: Responses' `truncation: "auto"` counts the prompt), the worker
        answers, `errors` renders any ApiError; status, duration and tokens go to the
        metrics."""
        trace = RequestTrace(self.metrics, route)
        setattr(request.state, TRACE_KEY, trace)  # the access line: model, tokens, first token
        try:
            call = make_call(await self.body(request), self)
            if inspect.isawaitable(call):
                call = await call
            response = await self._answer(call, trace)
        except asyncio.CancelledError:  # its client went away before the answer (nginx's
            trace.answered(CLIENT_CLOSED, streaming=True)  # 499, as the access line says)
            trace.ended(disconnected=True)
            raise
        except ApiError as err:
            response = errors(err)
        except Exception:  # a bug, never user input: still an error body of the API's
            log.exception("request failed")
            response = errors(ApiError(500, "Internal error.", type="server_error"))
        trace.answered(response.status_code, isinstance(response, StreamingResponse))
        return response

    async def respond(self, run: Callable[[], Awaitable[Response]],
                       errors: Callable[[ApiError], Response]) -> Response:
        """A route that does not generate (listings, stored responses): `run()`'s response,
        its ApiErrors rendered by `errors` (a bug's too: an error body of the API's)."""
        try:
            return await run()
        except ApiError as err:
            return errors(err)
        except Exception:  # a bug, never user input
            log.exception("request failed")
            return errors(ApiError(500, "Internal error.", type="server_error"))

    async def _answer(self, call: Call, trace: RequestTrace) -> Response:
        if call.now is not None:
            return call.now
        if call.later is not None:
            return await call.later()
        if call.parts:
            await self._fold_parts(call.parts, trace)
            return call.reply.answer()
        reply = call.reply
        if call.stream and call.keep_alive:
            opening = asyncio.ensure_future(self._open(call, trace))
            try:
                await asyncio.wait({opening}, timeout=call.keep_alive_s)
            except asyncio.CancelledError:
                opening.cancel()
                raise
            if not opening.done():  # the stream starts now, with keep-alives
                return StreamingResponse(self._stream_late(opening, call, trace),
                                         media_type=reply.media_type, headers=reply.headers)
            gen, head = opening.result()
        else:
            gen, head = await self._open(call, trace)
        if not call.stream:
            await self._drain(gen, head, reply.fold)
            return reply.answer()
        return StreamingResponse(self._stream(gen, head, call), media_type=reply.media_type,
                                 headers=reply.headers)

    async def _fold_parts(self, parts: list[Call], trace: RequestTrace) -> None:
        """Each part's request run on its worker, PARTS_OPEN at a time (the worker batches
        them; more would only wait in the handle's queue, whose limit would refuse them),
        its events folded into its own reply; the first refusal or failure cancels the rest
        and is raised."""
        room = asyncio.Semaphore(PARTS_OPEN)

        async def fold(part: Call) -> None:
            async with room:
                await self._drain(*await self._open(part, trace), part.reply.fold)

        tasks = [asyncio.ensure_future(fold(part)) for part in parts]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()

    async def _open(self, call: Call, trace: RequestTrace) -> tuple[_Traced, list]:
        """The request's stream on `model`'s worker (each batch shown to `trace`) and what
        came after its Accepted.

        Raises:
            ApiError: the worker rejected the request (its status; the field it names in
                the API's words), or answered out of order (503).
        """
        configured = self.resolve(call.model)  # a configured model's name in any case
        model = configured if configured in self.streams else call.model
        trace.model = model
        library = model not in self.streams
        args = (call.keep_loaded_s,) if library else ()
        greq = self.with_variant_template(model, call.request) if library else call.request
        gen, head = await self._start(self.stream(model), greq, *args)
        gen = _Traced(gen, trace)
        trace.saw(head)
        first = head[0] if head else None
        if isinstance(first, Rejected):
            param, message = first.param, first.message
            if param in call.params:  # named as the client sent it, in the text too
                param = call.params[param]
                said = _renamed(message, call.params)
                message = said if said != message else f"{message} ('{param}')"
            raise ApiError(first.status, message, param=param, code=first.code, type=first.type)
        if not isinstance(first, Accepted):
            raise ApiError(503, "The model worker answered out of order.")
        return gen, head  # the Accepted too: it says how long the model took to load

    @staticmethod
    async def _start(handle: Any, greq: GenerateRequest, *args: Any) -> tuple[Any, list]:
        """The request's stream and its first batch: [Rejected], or Accepted and what came
        with it. A worker that died before answering has produced nothing, so the request
        goes again, to a replica the router still believes alive."""
        attempts = START_ATTEMPTS
        while True:
            gen = handle.generate.remote(greq, *args)
            try:
                return gen, await gen.__anext__()
            except asyncio.CancelledError:  # the client went away before the first event
                gen.cancel()
                raise
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
    async def _batches(head: list, gen: _Traced):
        if head:
            yield head
        async for batch in gen:
            yield batch

    async def _stream(self, gen: _Traced, head: list, call: Call, *, lead: bool = True):
        """The body of a stream: the reply's lead (unless already sent), each batch of
        events rendered (and the call's keep-alives between them), its tail; its
        `broken()` if the worker fails mid-stream. A client that goes away cancels the
        request on the worker."""
        reply: Reply = call.reply
        finished = False
        try:
            first = reply.lead() if lead else b""
            if first:
                yield first
            batches = self._batches(head, gen)
            if call.keep_alive:
                batches = _paced(batches, call.keep_alive_s)
            async with aclosing(batches) as each:
                async for batch in each:
                    out = call.keep_alive if batch is None else reply.render(batch)
                    if out:
                        yield out
            finished = True
        except asyncio.CancelledError:  # the client went away
            raise
        except Exception as exc:
            log.warning("stream broke: %r", exc)
            yield reply.broken()
            finished = True
        finally:
            if not finished:
                gen.cancel()
            gen.trace.ended(disconnected=not finished)
        tail = reply.tail()
        if tail:
            yield tail

    async def _stream_late(self, opening: asyncio.Task, call: Call, trace: RequestTrace):
        """The body of a stream whose first event is late: the reply's lead and a
        keep-alive every `keep_alive_s` until the worker answers, then as `_stream`. A
        refusal that comes now (the response is already a 200) ends the stream as a
        failure with its message."""
        reply: Reply = call.reply
        try:
            # the first bytes now (the reply's lead, else a keep-alive: a reply may wait
            # for its first event to begin, as Anthropic's message_start does)
            yield reply.lead() or call.keep_alive
            while not (await asyncio.wait({opening}, timeout=call.keep_alive_s))[0]:
                yield call.keep_alive
            gen, head = opening.result()
        except ApiError as err:
            trace.ended()
            yield reply.render([Failed(message=err.message)]) + reply.tail()
            return
        except Exception as exc:
            log.warning("stream broke before its first event: %r", exc)
            trace.ended()
            yield reply.broken() + reply.tail()
            return
        finally:
            if not opening.done():  # the client went away
                opening.cancel()
                trace.ended(disconnected=True)
        async for out in self._stream(gen, head, call, lead=False):
            yield out

    async def _drain(self, gen: _Traced, head: list, on_batch: Callable[[list], None]) -> None:
        """Every batch of a request's events to `on_batch`; a worker that dies on the way is
        a 503. Cancelled (its client left, or another part of its batch failed), it cancels
        the request on the worker."""
        try:
            async for batch in self._batches(head, gen):
                on_batch(batch)
        except asyncio.CancelledError:
            gen.cancel()
            raise
        except ApiError:
            raise
        except Exception as exc:
            if _is_worker_death(exc):
                raise ApiError(503, "The model worker failed during the request.",
                               headers={"Retry-After": RETRY_AFTER_S}) from None
            raise


def _renamed(message: str, names: dict[str, str]) -> str:
    """`message` with the fields of `names` (ours -> the API's) named as the API names them:
    whole field paths only (`input` in 'input' or input[0], not in "inputs"), longest first."""
    for ours in sorted(names, key=len, reverse=True):
        message = re.sub(rf"(?<![\w.]){re.escape(ours)}(?![\w])", names[ours], message)
    return message
