"""ResponseStore: finished responses and their conversations, per ingress replica, for
`previous_response_id`, GET and DELETE."""

from __future__ import annotations

import time
from collections import OrderedDict

from deployments.errors import ApiError

STORE_MAX = 1000
STORE_TTL_S = 3600.0


class ResponseStore:
    """Finished responses and their conversations, for `previous_response_id`, GET and
    DELETE: at most `max_items`, each kept `ttl_s` seconds (the oldest go first)."""

    def __init__(self, max_items: int = STORE_MAX, ttl_s: float = STORE_TTL_S) -> None:
        self.max_items, self.ttl_s = max_items, ttl_s
        self._items: OrderedDict[str, tuple[float, dict, list[dict]]] = OrderedDict()

    def _expire(self) -> None:
        now = time.monotonic()
        while self._items:
            key, (at, _, _) = next(iter(self._items.items()))
            if now - at < self.ttl_s and len(self._items) <= self.max_items:
                break
            del self._items[key]

    def put(self, response: dict, conversation: list[dict]) -> None:
        self._items[response["id"]] = (time.monotonic(), response, conversation)
        self._expire()

    def get(self, response_id: str) -> tuple[dict, list[dict]]:
        """The response and its whole conversation (input and output as chat messages).

        Raises:
            ApiError: 404 for an unknown (or expired, or deleted) id.
        """
        self._expire()
        found = self._items.get(response_id)
        if found is None:
            raise ApiError(404, f"No response with id '{response_id}' is stored here "
                                "(unknown, deleted, or older than the store keeps).",
                           param="response_id", code="response_not_found")
        return found[1], found[2]

    def delete(self, response_id: str) -> None:
        self.get(response_id)
        del self._items[response_id]
