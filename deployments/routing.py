"""PrefixRouter: Serve's prefix-cache affinity router, reading our workers' requests.

With several worker replicas, a conversation's next turn should go to the replica whose KV
cache holds its earlier turns (actors/worker.py reuses the longest cached prefix). Ray Serve
ships that policy as `PrefixCacheAffinityRouter` (public name: ray.serve.llm.request_router;
imported here from the module that defines it, since importing ray.serve.llm itself pulls
in pyarrow, which nothing else here needs; ray is pinned in requirements.txt). It keeps a
character prefix tree of the prompts each replica was sent, sends a request to the replica
with the longest match while the replicas' queues differ by at most `imbalanced_threshold`,
and falls back to power-of-two-choices by load otherwise.

What it reads of a request is ours: a `GenerateRequest`'s tool definitions (rendered at the
top of a chat prompt) and its messages' text, or a completion's prompt.
"""

from __future__ import annotations

from typing import Any

import msgspec
from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import (
    PrefixCacheAffinityRouter,
)

from actors.events import GenerateRequest

ROUTER = "deployments.routing:PrefixRouter"


def routing_text(request: GenerateRequest, messages_text) -> str:
    """The text a request's prompt starts with, as the router matches it (never empty)."""
    if request.kind != "chat":
        return request.prompt or " "
    tools = request.body.get("tools")
    head = msgspec.json.encode(tools).decode() if tools else ""
    return (head + messages_text(request.messages)) or " "


class PrefixRouter(PrefixCacheAffinityRouter):
    """Routes a `GenerateRequest` to the replica that was sent the longest prefix of its
    text; other calls on the handle (info) carry no request and go by load."""

    def _extract_text_from_request(self, pending_request: Any) -> str:
        for arg in pending_request.args:
            if isinstance(arg, GenerateRequest):
                return routing_text(arg, self._normalize_prompt_to_string)
        return " "


def router_config(max_batch: int) -> dict[str, Any]:
    """The worker deployment's `request_router_config`: affinity while no replica has half
    a batch more requests than another, then load; the tree of sent prompts bounded."""
    return {"request_router_class": ROUTER,
            "request_router_kwargs": {"imbalanced_threshold": max(1, max_batch // 2),
                                      "do_eviction": True}}
