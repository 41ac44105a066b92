"""ApiError and error_body: every error the API returns, in OpenAI's shape (or Ollama's
on its routes)."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

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


def error_body(message: str, *, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def error_response(err: ApiError) -> JSONResponse:
    return JSONResponse(error_body(err.message, type=err.type, param=err.param, code=err.code),
                        status_code=err.status, headers=err.headers)


def ollama_error_response(err: ApiError) -> JSONResponse:
    """An error in Ollama's shape: `{"error": "..."}` (the status as OpenAI's)."""
    return JSONResponse({"error": err.message}, status_code=err.status, headers=err.headers)
