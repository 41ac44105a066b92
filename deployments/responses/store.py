"""ResponseStore: finished responses, their conversations and their input items, per ingress
replica, for `previous_response_id`, GET, DELETE and the input items' listing."""

from __future__ import annotations

import time
from collections import OrderedDict

import msgspec

from deployments.errors import ApiError

STORE_MAX = 1000
STORE_TTL_S = 3600.0


class Stored(msgspec.Struct, frozen=True, kw_only=True):
    """A finished response as kept.

    Attributes:
        response: the response object, as answered.
        conversation: its whole conversation as chat messages (input and output), without
            `instructions`: what a follow-up continues from.
        items: the input items it was made from (a follow-up's: the earlier input items and
            outputs first), each with its id, oldest first.
    """

    response: dict
    conversation: list[dict]
    items: list[dict] = msgspec.field(default_factory=list)


class ResponseStore:
    """Finished responses, for `previous_response_id`, GET, DELETE and input items: at most
    `max_items`, each kept `ttl_s` seconds (the oldest go first)."""

    def __init__(self, max_items: int = STORE_MAX, ttl_s: float = STORE_TTL_S) -> None:
        self.max_items, self.ttl_s = max_items, ttl_s
        self._items: OrderedDict[str, tuple[float, Stored]] = OrderedDict()

    def _expire(self) -> None:
        now = time.monotonic()
        while self._items:
            key, (at, _) = next(iter(self._items.items()))
            if now - at < self.ttl_s and len(self._items) <= self.max_items:
                break
            del self._items[key]

    def put(self, stored: Stored) -> None:
        self._items[stored.response["id"]] = (time.monotonic(), stored)
        self._expire()

    def get(self, response_id: str) -> Stored:
        """The stored response.

        Raises:
            ApiError: 404 for an unknown (or expired, or deleted, or never stored) id.
        """
        self._expire()
        found = self._items.get(response_id)
        if found is None:
            raise ApiError(404, f"No response with id '{response_id}' is stored here "
                                "(unknown, deleted, created with store: false, or older "
                                "than the store keeps).",
                           param="response_id", code="response_not_found")
        return found[1]

    def delete(self, response_id: str) -> None:
        self.get(response_id)
        del self._items[response_id]
