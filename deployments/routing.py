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
top of a chat prompt) and its messages' text, or a completion's prompt. On a deployment that
serves several models (a models_dir library: Serve's multiplexing), the text is keyed by the
request's model (`multiplexed_model_id`, then a NUL): one model's cached prefix never draws
another model's request, and Serve's multiplexed routing picks the candidates (the replicas
holding the model) before the tree picks among them.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
import ray
from ray.exceptions import RayError
from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import (
    PrefixCacheAffinityRouter,
)
from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_tree import PrefixTreeActor
from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

from actors.events import ChatGenerate, CompletionGenerate, GenerateRequest

log = logging.getLogger(__name__)
ROUTER = "deployments.routing:PrefixRouter"


def routing_text(request: GenerateRequest, messages_text) -> str:
    """The text a request's prompt starts with, as the router matches it (never empty; an
    embedding's is nothing the KV cache holds: it goes by load)."""
    if isinstance(request, CompletionGenerate):
        if request.prompt_ids is not None:  # the ids as text: the same ids, the same text
            return " ".join(map(str, request.prompt_ids)) or " "
        if request.prompt_parts is not None:  # llama-server's mixed prompt, parts as given
            return "".join(p if isinstance(p, str) else f" {p} "
                           for p in request.prompt_parts) or " "
        if request.infill is not None:  # llama-server's extra files come first
            return "".join(t for _, t in request.infill.extra) + request.prompt or " "
        return request.prompt or " "
    if not isinstance(request, ChatGenerate):
        return " "
    head = msgspec.json.encode(request.tools).decode() if request.tools else ""
    return (head + messages_text(request.messages)) or " "


def model_key_text(model: str, text: str) -> str:
    """The tree's key for `text` sent to `model` ("": a deployment of one model)."""
    return f"{model}\0{text}" if model else text


class PrefixRouter(PrefixCacheAffinityRouter):
    """Routes a `GenerateRequest` to the replica that was sent the longest prefix of its
    text; other calls on the handle (info) carry no request and go by load.

    The tree of sent prompts lives in one actor per deployment, which this router places
    where `tree_resources` say (the head node: Ray's own placement could put it on a node
    whose loss then breaks routing for the others). If it is lost anyway, requests go by
    load (logged once) rather than fail."""

    def initialize_state(self, tree_resources: dict[str, float] | None = None,
                         **kwargs: Any) -> None:
        if kwargs.get("tree_actor") is None and tree_resources:
            kwargs["tree_actor"] = self._placed_tree(tree_resources)
        self._tree_lost = False
        super().initialize_state(**kwargs)

    def _placed_tree(self, resources: dict[str, float]):
        """The deployment's tree actor, as Ray's router names it, on `resources`, removed by
        serve.shutdown() as Ray's own is."""
        parts = [SERVE_NAMESPACE] + [p for p in (
            getattr(self._deployment_id, "app_name", None),
            getattr(self._deployment_id, "name", None)) if p]
        actor = PrefixTreeActor.options(
            name="LlmPrefixTreeActor", namespace="::".join(parts), get_if_exists=True,
            lifetime="detached", num_cpus=0, resources=resources).remote()
        controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
        ray.get(controller._register_shutdown_cleanup_actor.remote(actor))
        return actor

    def _lost(self, exc: BaseException) -> None:
        if not self._tree_lost:
            self._tree_lost = True
            log.warning("the prefix router's tree is unavailable (%s): routing by load", exc)

    def _extract_text_from_request(self, pending_request: Any) -> str:
        metadata = getattr(pending_request, "metadata", None)
        model = getattr(metadata, "multiplexed_model_id", "") or ""
        for arg in pending_request.args:
            if isinstance(arg, GenerateRequest):
                return model_key_text(model, routing_text(arg,
                                                          self._normalize_prompt_to_string))
        return " "

    async def _prefix_match_best_replicas(self, pending_request, candidate_replicas):
        if self._tree_lost:
            return [[]]  # (the caller then takes its load-based choice)
        try:
            return await super()._prefix_match_best_replicas(pending_request,
                                                             candidate_replicas)
        except RayError as exc:
            self._lost(exc)
            return [[]]

    def on_request_routed(self, pending_request, replica_id, result) -> None:
        if not self._tree_lost:
            try:
                super().on_request_routed(pending_request, replica_id, result)
            except RayError as exc:
                self._lost(exc)

    def on_replica_actor_died(self, replica_id) -> None:
        try:
            super().on_replica_actor_died(replica_id)
        except RayError as exc:  # (the replica is dropped before the tree is told)
            self._lost(exc)

    def update_replicas(self, replicas) -> None:
        try:
            super().update_replicas(replicas)
        except RayError as exc:  # (the replicas are updated before the tree is told)
            self._lost(exc)


def router_config(max_batch: int, tree_resources: dict[str, float] | None = None
                  ) -> dict[str, Any]:
    """The worker deployment's `request_router_config`: affinity while no replica has half
    a batch more requests than another, then load; the tree of sent prompts bounded and
    placed on `tree_resources`."""
    kwargs: dict[str, Any] = {"imbalanced_threshold": max(1, max_batch // 2),
                              "do_eviction": True}
    if tree_resources:
        kwargs["tree_resources"] = tree_resources
    return {"request_router_class": ROUTER, "request_router_kwargs": kwargs}
