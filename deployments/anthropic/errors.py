"""Anthropic's request ids and error responses: every answer has a `request-id` header
(`req_...`; the SDK reads it as `_request_id`, and as an error's `request_id`), and an
error body also carries it as its top-level `request_id`."""

from __future__ import annotations

import uuid

from starlette.responses import JSONResponse

from deployments.errors import OVERLOADED, ApiError, anthropic_error_body

HEADER = "request-id"


def request_id_of(message_id: str) -> str:
    """A message's request id: `req_` and the message id's random part (`msg_<hex>`)."""
    return "req_" + message_id.removeprefix("msg_")


def new_request_id() -> str:
    return "req_" + uuid.uuid4().hex


def error_response(err: ApiError) -> JSONResponse:
    """An error in Anthropic's shape and status (503 -> 529 overloaded_error), with its
    request id in the body and the header (the one `err.headers` names, else a new one)."""
    headers = dict(err.headers)
    rid = headers.setdefault(HEADER, new_request_id())
    return JSONResponse({**anthropic_error_body(err), "request_id": rid},
                        status_code=OVERLOADED if err.status == 503 else err.status,
                        headers=headers)
