"""ApiError and error_body: every error the API returns, in OpenAI's shape (or Ollama's,
Anthropic's or llama-server's on their routes)."""

from __future__ import annotations

import re
from typing import Any

from starlette.responses import JSONResponse

from actors.errors import FIM_UNSUPPORTED

_TYPES = {400: "invalid_request_error", 401: "invalid_request_error",
          404: "invalid_request_error", 413: "invalid_request_error",
          503: "server_error", 500: "server_error"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, type: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type or _TYPES.get(status, "invalid_request_error")
        self.headers = headers or {}

    def renamed(self, param: str | None) -> ApiError:
        """This error naming its field `param` (a request translated to another API's
        names it as the client sent it), in its text's field path too."""
        if param != self.param:
            self.message = self.message.replace(f"`$.{self.param}`", f"`$.{param}`")
            if self.param and param:  # a message that quotes the field: 'reasoning_effort'
                self.message = self.message.replace(f"'{self.param}'", f"'{param}'")
            self.param = param
        return self


def error_body(message: str, *, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def error_response(err: ApiError) -> JSONResponse:
    return JSONResponse(error_body(err.message, type=err.type, param=err.param, code=err.code),
                        status_code=err.status, headers=err.headers)


def ollama_error_response(err: ApiError) -> JSONResponse:
    """An error in Ollama's shape: `{"error": "..."}` (the status as OpenAI's)."""
    return JSONResponse({"error": err.message}, status_code=err.status, headers=err.headers)


# llama-server's error types by status (its format_error_response)
_LLAMA_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                403: "permission_error", 404: "not_found_error", 500: "server_error",
                501: "not_supported_error", 503: "unavailable_error"}


def llama_status(err: ApiError) -> int:
    """The status llama-server answers `err` with: its 501 for a model without FIM tokens."""
    return 501 if err.code == FIM_UNSUPPORTED else err.status


def llama_error_body(err: ApiError) -> dict[str, Any]:
    """llama-server's `{"error": {"code", "message", "type"}}`: the status as a number in
    `code`, the type named by it (a prompt over the context: its exceed_context_size_error);
    and `param`, the field a 400 is about (vLLM's body, beside llama-server's on the
    tokenizer's routes, has it too)."""
    status = llama_status(err)
    kind = ("exceed_context_size_error" if err.code == "context_length_exceeded" else
            _LLAMA_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error"))
    return {"error": {"code": status, "message": err.message, "type": kind, "param": err.param}}


def llama_error_response(err: ApiError) -> JSONResponse:
    """An error in llama-server's shape (its routes and the tokenizer's)."""
    return JSONResponse(llama_error_body(err), status_code=llama_status(err),
                        headers=err.headers)


# Anthropic's error types by status. Back-pressure (and a worker that is down) is a 503
# here, and Anthropic's 529 overloaded_error there: what Anthropic sends when it is
# overloaded, which its SDKs retry with backoff (honouring Retry-After, kept) and Claude
# Code reports as "overloaded"; a 503 would be retried too, but read as an outage.
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                    403: "permission_error", 404: "not_found_error",
                    413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
                    529: "overloaded_error"}
OVERLOADED = 529


# the worker's words for a prompt over the context: the limit, then the prompt's tokens
_OVER_CONTEXT = re.compile(r"(\d+) tokens; the prompt has (\d+)")


def anthropic_error_body(err: ApiError) -> dict[str, Any]:
    """`{"type": "error", "error": {"type", "message"}}`; the message names the field. A
    prompt over the context is Anthropic's "prompt is too long: 9031 tokens > 8192
    maximum", whose numbers Claude Code reads to compact by the gap in one retry."""
    status = OVERLOADED if err.status == 503 else err.status
    kind = _ANTHROPIC_TYPES.get(status, "invalid_request_error" if status < 500
                                else "api_error")
    message = err.message
    over = _OVER_CONTEXT.search(message) if err.code == "context_length_exceeded" else None
    if over is not None:
        message = f"prompt is too long: {over[2]} tokens > {over[1]} maximum"
    elif err.code == "context_length_exceeded":
        message = f"prompt is too long: {message}"
    elif err.param and err.param not in message:
        message = f"{err.param}: {message}"
    return {"type": "error", "error": {"type": kind, "message": message}}


