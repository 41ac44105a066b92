"""Responses' input items as OpenAI lists them back (GET /v1/responses/{id}/input_items):
a request's `input` as items, each with its `id` and `status`, and one page of a response's
items (`limit`, `order`, `after`)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from deployments.body import page_limit
from deployments.errors import ApiError

LIMIT_DEFAULT, LIMIT_MAX = 20, 100
# OpenAI's ResponseIncludable values: none adds anything to a text-only item here but the
# output text's logprobs
LOGPROBS = "message.output_text.logprobs"
INCLUDABLE = frozenset({
    "file_search_call.results", "web_search_call.results", "web_search_call.action.sources",
    "message.input_image.image_url", "computer_call_output.output.image_url",
    "code_interpreter_call.outputs", "reasoning.encrypted_content",
    "message.output_text.logprobs"})
_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco",
           "reasoning": "rs"}


def _part(part: Any) -> Any:
    if isinstance(part, dict) and part.get("type") == "output_text":
        return {"annotations": [], **part}
    return part


def _item(item: dict) -> dict:
    kind = item.get("type", "message")
    out: dict[str, Any] = {**item, "type": kind,
                           "id": item.get("id") or f"{_PREFIX[kind]}_{uuid.uuid4().hex}",
                           "status": item.get("status") or "completed"}
    if kind == "message":
        content = item.get("content")
        if isinstance(content, str):
            text = "output_text" if item.get("role") == "assistant" else "input_text"
            content = [{"type": text, "text": content}]
        out["content"] = [_part(p) for p in content or []]
    elif kind == "reasoning":
        out["summary"] = item.get("summary") or []
    return out


def input_items(items: str | list[dict]) -> list[dict]:
    """`input` (already validated) as items: each with its type, an id (the one sent, else a
    new one) and a status; a string is one user message, a string content one text part."""
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    return [_item(item) for item in items]


def item_page(items: list[dict], query: Iterable[tuple[str, str]]) -> dict:
    """One page of `items` (oldest first) as OpenAI's list object, for the query parameters
    `limit` (1-100, default 20), `order` ("desc", the default: newest first, or "asc"),
    `after` (an item id: the items after it in that order) and `include` (accepted: no
    includable field applies to text items).

    Raises:
        ApiError: 400 naming the parameter that is out of range, or an `after` id that is
            not among the items.
    """
    params: dict[str, list[str]] = {}
    for key, value in query:
        params.setdefault(key.removesuffix("[]"), []).append(value)
    limit = page_limit((params.get("limit") or [None])[-1], default=LIMIT_DEFAULT,
                       most=LIMIT_MAX)
    order = (params.get("order") or ["desc"])[-1]
    if order not in ("asc", "desc"):
        raise ApiError(400, f"'order' is {order!r}; use 'asc' or 'desc'.", param="order")
    for value in params.get("include", []):
        if value not in INCLUDABLE:
            raise ApiError(400, f"'include' has {value!r}; use one of "
                                f"{', '.join(sorted(INCLUDABLE))}.", param="include")
    seq = items[::-1] if order == "desc" else list(items)
    if params.get("after"):
        after = params["after"][-1]
        ids = [item["id"] for item in seq]
        if after not in ids:
            raise ApiError(400, f"'after' is {after!r}, which is not an input item of this "
                                "response.", param="after")
        seq = seq[ids.index(after) + 1:]
    page = seq[:limit]
    return {"object": "list", "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(seq) > limit}
