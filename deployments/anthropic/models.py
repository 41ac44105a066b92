"""Anthropic's Models API on the listing's own paths: GET /v1/models (a page of ModelInfo:
`data`, `has_more`, `first_id`, `last_id`; `after_id`, `before_id`, `limit` as Anthropic
pages) and GET /v1/models/{model_id}, in Anthropic's shape for a client that sends the
`anthropic-version` header (every Anthropic SDK does; OpenAI's never does), errors
included (an unknown model is a 404 not_found_error)."""

from __future__ import annotations

from datetime import datetime, timezone

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from deployments.anthropic.errors import HEADER, error_response, new_request_id
from deployments.body import page_limit
from deployments.errors import ApiError
from deployments.ingress import Ingress

VERSION_HEADER = "anthropic-version"
DEFAULT_LIMIT = 20
MAX_LIMIT = 1000


def wants_anthropic(request: Request) -> bool:
    """Whether the client speaks Anthropic's API (it sends `anthropic-version`)."""
    return VERSION_HEADER in request.headers


def rfc3339(epoch_s: float) -> str:
    """An epoch time as RFC 3339 in UTC (`1970-01-01T00:00:00Z` when it is unknown)."""
    return datetime.fromtimestamp(epoch_s, tz=timezone.utc).isoformat() \
        .replace("+00:00", "Z")


def model_info(name: str, info: dict) -> dict:
    """A served model as Anthropic's ModelInfo (its context as `max_input_tokens`, and as
    `max_tokens`: output stops at the context's end; `capabilities` null: unknown)."""
    context = info.get("context_length")
    return {"type": "model", "id": name, "display_name": name,
            "created_at": rfc3339(info.get("created") or 0), "lifecycle": "active",
            "max_input_tokens": context, "max_tokens": context, "capabilities": None}


def _cursor(ids: list[str], name: str, value: str) -> int:
    if value not in ids:
        raise ApiError(400, f"'{name}' is {value!r}, which is not a listed model; use an id "
                            "from a page's first_id or last_id.", param=name)
    return ids.index(value)


def models_page(infos: dict[str, dict], *, after_id: str | None = None,
                before_id: str | None = None, limit: int = DEFAULT_LIMIT) -> dict:
    """One page of the listing: up to `limit` models after `after_id` (or just before
    `before_id`), in the listing's order; `has_more`: more lie in that direction.

    Raises:
        ApiError: 400, a cursor that is not a listed model, or both cursors.
    """
    if after_id is not None and before_id is not None:
        raise ApiError(400, "'after_id' and 'before_id' are both set; page one way at a "
                            "time.", param="before_id")
    ids = list(infos)
    if before_id is not None:
        end = _cursor(ids, "before_id", before_id)
        start = max(0, end - limit)
        has_more = start > 0
    else:
        start = 0 if after_id is None else _cursor(ids, "after_id", after_id) + 1
        end = min(len(ids), start + limit)
        has_more = end < len(ids)
    page = ids[start:end]
    return {"data": [model_info(n, infos[n]) for n in page], "has_more": has_more,
            "first_id": page[0] if page else None, "last_id": page[-1] if page else None}


async def list_models(request: Request, ingress: Ingress) -> Response:
    """GET /v1/models in Anthropic's shape."""
    async def run() -> Response:
        ingress.authenticate(request)
        q = request.query_params
        limit = page_limit(q.get("limit"), default=DEFAULT_LIMIT, most=MAX_LIMIT)
        page = models_page(await ingress.infos(), after_id=q.get("after_id"),
                           before_id=q.get("before_id"), limit=limit)
        return JSONResponse(page, headers={HEADER: new_request_id()})

    return await ingress.respond(run, error_response)


async def get_model(model_id: str, request: Request, ingress: Ingress) -> Response:
    """GET /v1/models/{model_id} in Anthropic's shape."""
    async def run() -> Response:
        ingress.authenticate(request)
        ingress.check_model(model_id)
        info = model_info(model_id, await ingress.info(model_id))
        return JSONResponse(info, headers={HEADER: new_request_id()})

    return await ingress.respond(run, error_response)
