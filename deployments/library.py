"""LibraryFront: what the ingress knows of a models_dir library (actors.library): its
models by name beside the configured ones, their descriptions from the headers, the
streaming handle that routes a request to a replica holding the model (Serve's
multiplexed_model_id), load and unload requests, the loaded models, aliases and variants.

The Ingress extends it; it reads the Ingress's `streams` (the configured models come first).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import msgspec

from actors.errors import RequestError
from actors.events import ChatGenerate, CompletionGenerate
from actors.library import Library, model_key
from deployments.errors import ApiError

log = logging.getLogger(__name__)


def merge_running(held: list[dict]) -> list[dict]:
    """One entry per loaded model from every replica's list: sizes added up (the memory the
    model takes on the server), the latest expiry, the replicas holding it, in the order
    models were loaded (oldest first)."""
    out: dict[str, dict] = {}
    for m in sorted(held, key=lambda m: m.get("loaded_at", 0.0)):
        seen = out.get(m["id"])
        if seen is None:
            out[m["id"]] = {**m, "replicas": [m.get("replica")]}
            continue
        seen["replicas"].append(m.get("replica"))
        for key in ("weight_bytes", "size", "active", "loads"):
            seen[key] = seen.get(key, 0) + m.get(key, 0)
        seen["expires_at"] = max(seen.get("expires_at", 0.0), m.get("expires_at", 0.0))
    return list(out.values())


class LibraryFront:
    """The library side of an ingress replica.

    Args:
        library: the library worker deployment's handle (None: no models_dir).
        settings: `models_dir`, `allow_delete` (Ollama's /api/delete may delete files).
    """

    streams: dict[str, Any]  # the configured models' handles (the Ingress's)

    def __init__(self, library: Any, settings: dict[str, Any]) -> None:
        self.library_handle = library
        self.library = Library(settings["models_dir"]) if library is not None else None
        self.allow_delete = bool(settings.get("allow_delete"))
        self._library_streams: dict[str, Any] = {}
        self._hidden_logged: set[str] = set()  # folder models a configured one hides

    def resolve(self, name: str) -> str | None:
        """The served model `name` means: a configured model by its exact name, else the
        library's model of that name (`model_key`: any case, `:latest` or not), else the one
        configured model of that name in any case, `:latest` or not (Ollama's names are
        read so); None."""
        if name in self.streams:
            return name
        key = model_key(name)
        if self.library is not None:
            if key not in self.streams and self.library.get(key) is not None:
                return key
        alike = [s for s in self.streams if model_key(s) == key]
        return alike[0] if len(alike) == 1 else None

    def stream(self, name: str) -> Any:
        """The streaming handle for a served model (a library model's carries its id for
        Serve's multiplexed routing)."""
        handle = self.streams.get(name)
        if handle is not None:
            return handle
        key = self.resolve(name)
        if key is None:
            raise ApiError(404, f"The model '{name}' does not exist; see /v1/models.",
                           param="model", code="model_not_found")
        if key in self.streams:
            return self.streams[key]
        target = self._library_target(key)
        if target not in self._library_streams:
            self._library_streams[target] = self.library_handle.options(
                stream=True, _by_reference=False, multiplexed_model_id=target)
        return self._library_streams[target]

    def _library_target(self, key: str) -> str:
        """The library model a name is loaded as (an alias's model: one load for both)."""
        entry = self.library.get(key) if self.library is not None else None
        return (entry.alias_of or entry.name) if entry is not None else key

    def edit_library(self, edit: Callable[[Any], Any], names: dict[str, str]) -> Any:
        """`edit(library)` (an alias made or removed, a file deleted), its RequestError an
        ApiError; a 400 when this app has no models_dir, or when one of `names` (field:
        model name) is a configured model's (the edit would act on a folder model of that
        name, which the configured one hides, or make one that it would hide)."""
        if self.library is None:
            raise ApiError(400, "This server has no models_dir: its models are the ones its "
                                "config names.")
        for field, name in names.items():
            if name in self.streams:
                raise ApiError(400, f"The model '{name}' is served from this server's config, "
                                    "not its models folder: the folder's models cannot be "
                                    "edited under that name.", param=field)
        try:
            return edit(self.library)
        except RequestError as exc:
            raise ApiError(exc.status, exc.message, param=exc.param, code=exc.code) from None

    async def delete(self, name: str) -> None:
        """Ollama's /api/delete: an alias or variant removed, or (allow_delete) a GGUF
        model's files deleted, with the aliases made from it; a model whose files went is
        unloaded now (not left loaded, and listed by /api/ps, until its keep_alive ends).

        Raises:
            ApiError: the library's refusal (404 unknown, 403 files not allowed, ...).
        """
        key = self.resolve(name)
        target = self._library_target(key) if key is not None else None
        self.edit_library(lambda lib: lib.delete(name, allow_files=self.allow_delete),
                          {"model": name})
        if target is not None and self.resolve(target) is None and self.library_handle:
            handle = self.library_handle.options(multiplexed_model_id=target)
            await handle.load.remote(0)

    def variant(self, name: str) -> tuple[str | None, dict[str, Any]] | None:
        """A library variant's defaults (system prompt, Ollama's parameters); None for any
        other model."""
        if self.library is None or name in self.streams:
            return None
        entry = self.library.get(name)
        if entry is None or (entry.system is None and not entry.options):
            return None
        return entry.system, entry.options

    def with_variant_template(self, name: str, request: Any) -> Any:
        """`request` with the chat template of the library variant `name` (Ollama's
        TEMPLATE), when it is a chat and the variant has one, and the variant's context
        (PARAMETER num_ctx) where the request sets none; else `request` itself."""
        entry = self.library.get(name) if self.library is not None else None
        if entry is None:
            return request
        num_ctx = (entry.options or {}).get("num_ctx")
        if num_ctx is not None and isinstance(request, (ChatGenerate, CompletionGenerate)) \
                and request.context_limit is None:
            request = msgspec.structs.replace(request, context_limit=int(num_ctx))
        if entry.template is None or not isinstance(request, ChatGenerate) \
                or request.template is not None:
            return request
        return msgspec.structs.replace(request, template=entry.template)

    async def library_models(self) -> dict[str, dict]:
        """The library's models not shadowed by a configured one, as descriptions (the
        folder scanned in a thread: a new file's header is read then, off the loop)."""
        if self.library is None:
            return {}
        models = await asyncio.to_thread(self.library.models)
        hidden = sorted(set(models) & set(self.streams) - self._hidden_logged)
        if hidden:
            log.warning("the models folder's %s: hidden by the configured model(s) of the "
                        "same name, which requests reach", ", ".join(hidden))
            self._hidden_logged.update(hidden)
        return {name: m.info() for name, m in models.items() if name not in self.streams}

    async def load(self, name: str, keep_alive_s: float | None) -> dict:
        """Load (keep_alive 0: unload) a library model without a request: the worker's
        `done_reason` and `load_s`.

        Raises:
            ApiError: the model is unknown (404) or cannot be served (422).
        """
        key = self.resolve(name)
        if key is None and keep_alive_s == 0 and self.library_handle is not None:
            # a model still loaded whose files went (removed by hand): unloaded by its name
            key = next((m["id"] for m in await self.running()
                        if m["id"] == model_key(name)), None)
        if key is None or key in self.streams:
            raise ApiError(404, f"The model '{name}' does not exist; see /v1/models.",
                           param="model", code="model_not_found")
        handle = self.library_handle.options(multiplexed_model_id=self._library_target(key))
        out = await handle.load.remote(keep_alive_s)
        rejected = out.get("rejected")
        if rejected:
            raise ApiError(rejected["status"], rejected["message"], param="model",
                           code=rejected.get("code"))
        return out

    async def running(self) -> list[dict]:
        """The library models loaded now on any replica, as descriptions (`merge_running`):
        the metrics hub's reports of every replica, or, without a hub, one replica's own."""
        if self.library_handle is None:
            return []
        hub = getattr(self, "hub", None)
        try:
            if hub is not None:
                return merge_running(await hub.held.remote())
            return merge_running(await self.library_handle.running.remote())
        except Exception:
            log.warning("the library worker did not answer /api/ps", exc_info=True)
            return []

    def library_info(self, name: str, verbose: bool = False) -> dict:
        """A library model's description from its header (`verbose`: with its template).

        Raises:
            ApiError: 404, not a library model.
        """
        entry = self.library.get(name) if self.library is not None else None
        if entry is None:
            raise ApiError(404, f"The model '{name}' does not exist; see /v1/models.",
                           param="model", code="model_not_found")
        info = entry.info()
        return {**info,
                **({"template": entry.chat_template} if verbose else {}),
                **({"system": entry.system} if entry.system is not None else {}),
                **({"variant_options": entry.options} if entry.options else {})}
