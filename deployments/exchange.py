"""What an API surface hands the ingress's one request path: a `Call` (the model, the typed
request for its worker, how to answer) whose `Reply` turns the worker's events into that
API's bytes, streamed or folded into one body.

Each API sub-package (openai/, responses/, ollama/, anthropic/) builds its Calls in its `request`
module and its Replies in its `reply` module; `deployments.ingress.Ingress.generate` runs
every one of them the same way.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from starlette.responses import Response

from actors.events import GenerateRequest


class Reply(Protocol):
    """One request's answer in one API's shape.

    Streamed: `lead()`, then `render(batch)` for each batch of the worker's events, then
    `tail()`; `broken()` instead of the rest when the worker fails mid-stream. Not
    streamed: `fold(batch)` for each batch, then `answer()` (which raises `ApiError` when
    the events ended in a failure)."""

    media_type: str
    headers: dict[str, str]

    def lead(self) -> bytes: ...

    def render(self, batch: list) -> bytes: ...

    def broken(self) -> bytes: ...

    def tail(self) -> bytes: ...

    def fold(self, batch: list) -> None: ...

    def answer(self) -> Response: ...


class WholeReply:
    """The streaming half of a Reply whose answer is never streamed (embeddings, tokenize,
    a batch of prompts): nothing; its `fold` and `answer` are its own."""

    media_type = "application/json"
    headers: ClassVar[dict[str, str]] = {}

    def lead(self) -> bytes:
        return b""

    def render(self, batch: list) -> bytes:
        return b""

    def broken(self) -> bytes:
        return b""

    def tail(self) -> bytes:
        return b""


@dataclass
class Call:
    """A decoded, validated request: the served model's name, the worker's request, whether
    to stream, and its reply. `now`: an answer given without the worker (Ollama's load
    request); the rest is then unused; `later`: one that is awaited instead (a library
    model's load or unload). `params`: the API's names for the request fields a worker's
    rejection may name (`context_limit` is Ollama's `options.num_ctx`).
    `keep_alive`: streamed, bytes sent each time `keep_alive_s` seconds pass without an
    event (Anthropic's `ping`: clients with read timeouts keep the connection while a long
    prompt prefills); a stream whose first event takes longer starts with them (b"": the
    stream starts with its first event, and nothing is sent between events).
    `keep_loaded_s`: how long a library model stays loaded after this request (Ollama's
    keep_alive; None: the app's default).
    `parts`: a request of several (a completions batch: one prompt each), run together on
    the model's workers, each folding its events into its own reply; then `reply.answer()`
    joins them. Not streamed; a part's refusal is the request's."""

    model: str = ""
    request: GenerateRequest | None = None
    reply: Reply | None = None
    stream: bool = False
    now: Response | None = None
    later: Callable[[], Awaitable[Response]] | None = None
    params: dict[str, str] = field(default_factory=dict)
    keep_alive: bytes = b""
    keep_alive_s: float = 5.0
    keep_loaded_s: float | None = None
    parts: list[Call] = field(default_factory=list)
