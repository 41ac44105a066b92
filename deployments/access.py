"""The access log: one line per HTTP request, written by the ingress replica when the
response's last byte has gone (or its client went away: 499 when it left before any answer,
as nginx logs it), as Ollama's `[GIN]` lines and llama-server's request lines are:

    [flm] 2026/12/05 08:30:01 | 200 |   1.402 s | POST /v1/chat/completions | smollm2-135m
          | 36 in, 21 out | first token 0.120 s          (one line; cut here to fit)

method, path, status, total time; for a generating request also the model, its prompt and
output tokens and the time to its first token (from the request's `RequestTrace`, which
`Ingress.generate` leaves in the request's state). The console shows these lines
(deployments.launch.console_filter); Serve's own access log stays in Ray's log files.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

TRACE_KEY = "flm_trace"  # the request state's key of a generating request's RequestTrace
# the status of a request whose client went away before any answer (nginx's "client closed
# request"): nothing was sent, so it is neither the server's failure nor a success
CLIENT_CLOSED = 499

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]],
                    Callable[[Message], Awaitable[None]]], Awaitable[None]]


def access_line(*, at: float, method: str, path: str, status: int, seconds: float,
                model: str = "", prompt_tokens: int | None = None,
                output_tokens: int | None = None, first_token_s: float | None = None,
                went_away: bool = False) -> str:
    """One request's line (`at`: the epoch second it arrived)."""
    stamp = time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(at))
    parts = [f"[flm] {stamp}", f"{status:3d}", f"{seconds:7.3f} s", f"{method} {path}"]
    if model:
        parts.append(model)
    if prompt_tokens is not None and output_tokens is not None:
        parts.append(f"{prompt_tokens} in, {output_tokens} out")
    if first_token_s is not None:
        parts.append(f"first token {first_token_s:.3f} s")
    if went_away:
        parts.append("client went away")
    return " | ".join(parts)


def _to_stderr(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


class AccessLog:
    """ASGI middleware writing `access_line` for each HTTP request through `write`
    (default: the replica's stderr, which Ray streams to the console and its log file)."""

    def __init__(self, app: ASGIApp, write: Callable[[str], None] = _to_stderr) -> None:
        self.app, self.write = app, write

    async def __call__(self, scope: Scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        at, started = time.time(), time.perf_counter()
        state = scope.setdefault("state", {})
        seen = {"status": 500, "ended": False}

        async def watched(message: Message) -> None:
            if message["type"] == "http.response.start":
                seen["status"] = int(message["status"])
                seen["started"] = True
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                seen["ended"] = True
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except asyncio.CancelledError:
            if not seen.get("started"):  # gone before any answer: nginx's 499, not a 500
                seen["status"] = CLIENT_CLOSED
            raise
        finally:
            self.write(self._line(scope, state, at, time.perf_counter() - started, seen))

    @staticmethod
    def _line(scope: Scope, state: dict, at: float, seconds: float, seen: dict) -> str:
        trace = state.get(TRACE_KEY)
        fields: dict[str, Any] = {}
        if trace is not None:
            usage = trace.usage
            fields = {"model": trace.model,
                      "prompt_tokens": usage.prompt_tokens if usage else None,
                      "output_tokens": usage.completion_tokens if usage else None,
                      "first_token_s": (None if trace.first_at is None
                                        else trace.first_at - trace.started)}
        return access_line(at=at, method=scope.get("method", "?"), path=scope.get("path", "?"),
                           status=seen["status"], seconds=seconds,
                           went_away=not seen["ended"], **fields)
