"""LibraryWorker: one Serve deployment for every model of a Library, each loaded on its
first request and unloaded when idle, on Ray Serve's model multiplexing.

The ingress calls `handle.options(multiplexed_model_id=name)`; Serve's router then prefers
a replica that holds (or is loading) that model, else one holding the fewest models, and
the replica reads the id with `serve.get_multiplexed_model_id()`. `held_model(name)` is the
`@serve.multiplexed(max_num_models_per_replica=N)` loader: Serve keeps the loaded models in
LRU order, serialises loads behind one lock (so requests for a model being loaded wait for
that one load, and never start a second) and, past N, evicts the least recently used model
by calling its `__del__` (run in a thread). As read in ray/serve/multiplex.py (Ray 2.60):
eviction does not look at requests in flight, so a load first moves the models serving
requests behind the idle ones in that order (`_spare_busy`), and `HeldModel.__del__` only
retires a model (where every one was busy) and its Worker stops when its last request
ends. Serve offers no unload by id; keep-alive expiry and `keep_alive: 0` pop the model
from the multiplexer's own cache (`_ModelMultiplexWrapper.models`) and flag the change for
the router; that cache and its order (`_spare_busy`) are the places this module touches
Serve's internals (`_serve_cache`).

A model that cannot be served (unreadable header, unsupported architecture or tensor) is a
`RequestError` naming the file and the reason (status 422), remembered until the file
changes, and checked before Serve's loader runs (Serve evicts its LRU model before it calls
the loader, so a known-bad name must not get that far); the replica's other models keep
serving.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
from ray import serve

from actors.blas import blas_threads_for, set_blas_threads, start_threads
from actors.config import WorkerConfig
from actors.errors import RequestError
from actors.events import Accepted, ChatGenerate, Event, GenerateRequest, Rejected
from actors.library import Library, LibraryModel, model_key
from actors.metrics import Metrics
from actors.worker import Worker
from npu import ModelError

log = logging.getLogger(__name__)

FOREVER = math.inf  # keep_alive -1: never unloaded
REPORT_WAIT_S = 0.5  # the longest a request's end waits for the hub to have its model


class LibraryConfig(WorkerConfig, kw_only=True):
    """The library's worker: WorkerConfig's options for every model it loads, and

    Attributes:
        models_dir: the folder of models (see actors.library).
        max_loaded_models: models one replica holds at once (Serve's
            max_num_models_per_replica); loading one more evicts the least recently used.
        keep_alive_s: how long a model stays loaded after its last request when the request
            does not say (Ollama's default, 5 minutes); `inf`: until evicted.
        memory_budget: bytes of weights and KV cache one replica holds (None: three
            quarters of the host's available memory when the replica starts); loading past
            it first unloads the least recently used idle models; a model whose file alone
            is larger is refused (507).
    """

    name: str = "library"
    path: str = ""
    models_dir: str = ""
    max_loaded_models: int = 2
    keep_alive_s: float = 300.0
    memory_budget: int | None = None


def available_memory() -> int:
    """The host's available memory in bytes (MemAvailable; 0 when unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def room_for(need: int, held: list[tuple[str, int, bool]], budget: int) -> list[str]:
    """The models to unload, least recently used first, so that `need` more bytes fit in
    `budget`; `held`: (name, bytes, idle) from least to most recently used. A model with
    requests in flight is never chosen.

    Raises:
        RequestError: 507 when `need` alone is over the budget, or the idle models cannot
            make room (the message says how big the model is and what the budget is).
    """
    mb = 1 / 1e6
    if need > budget:
        raise RequestError(f"The model needs {need * mb:,.0f} MB and the worker's memory "
                           f"budget is {budget * mb:,.0f} MB (memory_budget).", status=507,
                           param="model", code="model_too_large", type="server_error")
    used = sum(size for _, size, _ in held)
    out = []
    for name, size, idle in held:
        if used + need <= budget:
            break
        if idle:
            out.append(name)
            used -= size
    if used + need > budget:
        raise RequestError(f"The model needs {need * mb:,.0f} MB; the worker's memory budget "
                           f"is {budget * mb:,.0f} MB and {used * mb:,.0f} MB of it is held "
                           "by models serving requests: retry shortly.", status=503,
                           code="model_busy", type="server_error")
    return out


def _stamp(path: str) -> tuple[int, int, int] | None:
    """What tells a file (or directory) apart from the one that was at `path`: its inode,
    size and modification time; None when nothing is there."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


class HeldModel:
    """A library model loaded on this replica: its Worker, requests in flight, expiry."""

    def __init__(self, entry: LibraryModel, worker: Worker, load_s: float,
                 stamp: tuple[int, int, int] | None = None) -> None:
        self.entry, self.worker, self.load_s = entry, worker, load_s
        # the file as it was when its load began (a replaced one loads again)
        self.stamp = stamp if stamp is not None else _stamp(entry.path)
        engine = worker.model.engine
        self.weight_bytes = int(engine.weight_bytes)
        self.loaded_at = time.time()
        self.expires_at: float = FOREVER  # wall-clock seconds
        self.in_flight = 0
        self.retired = False
        self.on_close: Callable[[], None] | None = None  # once the worker has stopped
        self._lock = threading.Lock()
        self._timer: asyncio.TimerHandle | None = None

    def replaced(self) -> bool:
        """Whether the file at the model's path is no longer the one loaded (a new file
        moved over it, as the docs say to replace a model, or it is gone)."""
        return _stamp(self.entry.path) != self.stamp

    def enter(self) -> None:
        with self._lock:
            self.in_flight += 1

    def leave(self) -> None:
        with self._lock:
            self.in_flight -= 1
            close = self.retired and self.in_flight == 0
        if close:
            self.worker.close()
            if self.on_close is not None:
                self.on_close()

    def keep(self, seconds: float, on_expiry) -> None:
        """Expire `seconds` from now (inf: never); `on_expiry()` runs on this loop then."""
        self.expires_at = time.time() + seconds if math.isfinite(seconds) else FOREVER
        self.arm(on_expiry)

    def arm(self, on_expiry) -> None:
        """Run `on_expiry()` at `expires_at` (again: a timer may fire a little early)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if math.isfinite(self.expires_at):
            loop = asyncio.get_running_loop()
            left = max(self.expires_at - time.time(), 0.0)
            self._timer = loop.call_later(left + 0.001, on_expiry)

    def held_bytes(self) -> int:
        """Weights and the KV cache allocated now."""
        return self.weight_bytes + int(self.worker.model.engine.kv_usage().get("kv_bytes", 0))

    def expired(self) -> bool:
        return self.expires_at <= time.time()

    def __del__(self) -> None:
        """Serve's eviction (and ours): stop the worker now, or when its last request ends."""
        lock = getattr(self, "_lock", None)
        if lock is None:
            return
        with lock:  # (its expiry timer may still fire: it finds the model gone)
            self.retired = True
            close = self.in_flight == 0
        if close:
            self.worker.close()


class LibraryWorkerBase:
    """The deployment's body; `library_worker(n)` adds Serve's multiplexed loader."""

    def __init__(self, config: LibraryConfig, metrics_hub: Any = None) -> None:
        self.config = config
        self.library = Library(config.models_dir)
        self.loaded: dict[str, HeldModel] = {}
        # unloaded (or evicted by Serve) while serving requests: their memory is held until
        # the last one ends, and counts against the budget until then
        self.draining: list[HeldModel] = []
        self.failed: dict[str, tuple[str, str]] = {}  # name -> (digest, reason)
        self.metrics_hub = metrics_hub
        replica = getattr(serve.get_replica_context(), "replica_id", None)
        self.replica = str(getattr(replica, "unique_id", replica))
        self.loads: dict[str, int] = {}  # loads per model on this replica
        self.metrics = Metrics()
        self.budget = config.memory_budget or available_memory() * 3 // 4 or 1 << 62
        self._reports = 0  # reports of the loaded models sent to the hub
        self._cold = asyncio.Lock()  # a load's reorder and Serve's eviction, together

    async def held_model(self, name: str) -> HeldModel:  # replaced by library_worker()
        raise NotImplementedError

    # -- loading ------------------------------------------------------------------------
    async def _servable(self, name: str) -> LibraryModel:
        """The library's entry for `name`, once nothing known stands in its way.

        Raises:
            RequestError: 404 for a name the library does not have; 422 for a model that
                cannot be served, naming its file and the reason; 507 for one larger than
                the memory budget by itself.
        """
        entry = await asyncio.to_thread(self.library.get, name)  # a new header: off the loop
        if entry is None:
            raise RequestError(f"The model '{name}' is not in the library; see /v1/models.",
                               status=404, param="model", code="model_not_found")
        if entry.error:
            raise RequestError(f"The model '{name}' cannot be served: {entry.error}",
                               status=422, param="model", code="model_not_servable")
        failed = self.failed.get(name)
        if failed and failed[0] == entry.digest:
            raise RequestError(failed[1], status=422, param="model", code="model_not_servable")
        room_for(entry.size, [], self.budget)
        return entry

    async def _load(self, name: str) -> HeldModel:
        """The model `name`, loaded (in a thread: the replica's other models keep serving).

        Raises:
            RequestError: as `_servable`; 422 when loading fails (the file and the reason).
        """
        entry = await self._servable(name)
        self._make_room(entry)
        started, stamp = time.perf_counter(), _stamp(entry.path)
        try:
            worker = await asyncio.to_thread(self._worker, entry)
        except Exception as exc:  # ModelError and whatever a malformed file raises
            self.metrics.inc("flm_model_loads_total", name, "failed")
            reason = (f"The model '{name}' cannot be served: {exc}" if isinstance(
                exc, ModelError) else f"The model '{name}' cannot be served: {entry.path}: "
                f"{type(exc).__name__}: {exc}")
            log.warning("%s", reason)
            self.failed[name] = (entry.digest, reason)
            raise RequestError(reason, status=422, param="model",
                               code="model_not_servable") from None
        held = HeldModel(entry, worker, time.perf_counter() - started, stamp)
        self.failed.pop(name, None)
        self.loaded[name] = held
        self.loads[name] = self.loads.get(name, 0) + 1
        self.metrics.inc("flm_model_loads_total", name, "loaded")
        self.metrics.observe("flm_model_load_seconds", name, value=held.load_s)
        log.info("loaded %s (%s, %.1f MB) in %.2f s", name, entry.path,
                 held.weight_bytes / 1e6, held.load_s)
        return held

    def _make_room(self, entry: LibraryModel) -> None:
        """Unload least recently used idle models until `entry` fits the memory budget
        (its file's size stands for its weights until it is loaded).

        Raises:
            RequestError: 507, the model alone is over the budget; 503, the models serving
                requests leave no room.
        """
        self._forget_evicted()
        wrapper = self._serve_cache()
        order = list(wrapper.models) if wrapper is not None else list(self.loaded)
        held = [(n, self.loaded[n].held_bytes(), self.loaded[n].in_flight == 0)
                for n in order if n in self.loaded]
        self.draining = [h for h in self.draining if h.in_flight > 0]
        held += [(h.entry.name, h.held_bytes(), False) for h in self.draining]
        for name in room_for(entry.size, held, self.budget):
            self.unload(name, reason="evicted")

    def _worker(self, entry: LibraryModel) -> Worker:
        from npu import load_model

        cfg = self.config
        options = cfg.options()

        def factory():
            return load_model(entry.path, "cpu", options, name=entry.name)

        worker = Worker(factory, max_batch=cfg.max_batch,
                        stream_interval_s=cfg.stream_interval_ms / 1000,
                        max_messages_per_s=cfg.max_messages_per_s,
                        speculation=cfg.speculative)
        threads = blas_threads_for(worker.model.engine.weight_bytes, cfg.blas_threads)
        set_blas_threads(start_threads(cfg.blas_threads))  # process-wide: every model's
        worker.model.engine.set_threads(threads)
        return worker

    async def _acquire(self, name: str) -> tuple[HeldModel, float]:
        """The held model for a request (entered) and the seconds this call spent loading it
        (0 when it was loaded already)."""
        known = name in self.loaded and not self.loaded[name].retired
        if known and self.loaded[name].replaced():  # its new weights load (as Ollama's do)
            self.unload(name, reason="replaced")
            known = False
        if not known:  # Serve evicts before it calls the loader: refuse what cannot load
            await self._servable(name)
            # one cold load at a time here: Serve's load lock is then free, so its eviction
            # follows the order `_spare_busy` left with nothing run between them (waiting on
            # Serve's lock, a request meanwhile could make a busy model the oldest again)
            async with self._cold:
                self._spare_busy()
                held = await self.held_model(name)
        else:
            held = await self.held_model(name)
        if held.retired:  # evicted between Serve's lookup and ours: load it again
            if self.loaded.get(name) is held:
                self._retire(self.loaded.pop(name))
            held = await self.held_model(name)
        held.enter()
        return held, (0.0 if known else held.load_s)

    def _spare_busy(self) -> None:
        """Before a load: the models serving requests move behind the idle ones in Serve's
        LRU order, so that a load past `max_loaded_models` evicts an idle model (Serve's
        eviction takes the least recently used, requests in flight or not: a model
        streaming a long answer was unloaded under it, and its next request loaded it
        again beside the draining copy). Where every model is busy Serve still evicts one
        (it drains, its memory counted: `_make_room`)."""
        wrapper = self._serve_cache()
        if wrapper is None:
            return
        busy = [n for n, held in wrapper.models.items() if getattr(held, "in_flight", 0) > 0]
        for name in busy:
            wrapper.models.move_to_end(name)

    # -- unloading ----------------------------------------------------------------------
    def _serve_cache(self) -> Any:
        """Serve's multiplexer of this replica (None before its first load)."""
        return getattr(self, "__serve_multiplex_wrapper", None)

    def unload(self, name: str, reason: str = "keep_alive") -> bool:
        """Unload `name` now (its worker stops once its requests end); False: not loaded."""
        held = self.loaded.pop(name, None)
        wrapper = self._serve_cache()
        if wrapper is not None:
            cached = wrapper.models.pop(name, None)
            wrapper._push_multiplexed_replica_info = True  # the router's view of this replica
            held = held or cached
        if held is None:
            return False
        self._retire(held)
        self.metrics.inc("flm_model_unloads_total", name, reason)
        log.info("unloaded %s (%s)", name, reason)
        return True

    def _expire(self, name: str) -> None:
        held = self.loaded.get(name)
        if held is None or held.in_flight:  # gone, or its last request will look again
            return
        if not held.expired():  # the timer fired early, or keep_alive was extended
            held.arm(lambda: self._expire(name))
            return
        self.unload(name)
        self.report()

    def _keep(self, held: HeldModel, keep_alive_s: float | None) -> None:
        seconds = self.config.keep_alive_s if keep_alive_s is None else keep_alive_s
        name = held.entry.name
        if held.retired or self.loaded.get(name) is not held:  # not the one loaded now
            return
        if seconds < 0:
            seconds = FOREVER
        held.keep(seconds, lambda: self._expire(name))
        if held.in_flight == 0 and held.expired():
            self.unload(name)

    def _retire(self, held: HeldModel) -> None:
        """Stop `held`'s worker now, or (requests in flight) when its last request ends,
        its memory counted as held until then."""
        if held not in self.draining:
            self.draining.append(held)
            held.on_close = lambda: self._drained(held)
        if not held.retired:  # (Serve's eviction retired it already)
            held.__del__()
        if held.in_flight == 0:  # (its last request may have ended just now too)
            self._drained(held)

    def _drained(self, held: HeldModel) -> None:
        """`held`'s last request has ended and its worker stopped: its memory goes with it
        (nothing here holds it any more)."""
        held.on_close = None
        if held in self.draining:
            self.draining.remove(held)

    def _forget_evicted(self) -> None:
        """Drop the models Serve evicted from our own index (those still serving requests
        go on counting against the budget)."""
        gone = [n for n, h in self.loaded.items() if h.retired]
        for name in gone:
            self._retire(self.loaded.pop(name))
            self.metrics.inc("flm_model_unloads_total", name, "evicted")

    def report(self) -> Any:
        """Send the hub the models this replica holds now (what /api/ps merges across
        replicas); the call's response, to await or not (None: no hub)."""
        if self.metrics_hub is None:
            return None
        self._reports += 1
        return self.metrics_hub.hold.remote(self.replica, self._reports, self.held())

    # -- requests -------------------------------------------------------------------------
    async def generate(self, request: GenerateRequest,
                       keep_alive_s: float | None = None) -> AsyncIterator[list[Event]]:
        """The request's events on the model named by the request's multiplexed model id
        (Rejected when it cannot be loaded); Accepted carries the seconds spent loading."""
        name = model_key(serve.get_multiplexed_model_id())
        try:
            held, load_s = await self._acquire(name)
        except RequestError as exc:
            yield [Rejected(status=exc.status, message=exc.message, param=exc.param,
                            code=exc.code, type=exc.type)]
            return
        self._forget_evicted()
        try:
            first = True
            async for batch in held.worker.generate(request):
                if first and batch and isinstance(batch[0], Accepted) and load_s:
                    batch = [msgspec.structs.replace(batch[0], load_s=load_s), *batch[1:]]
                first = False
                yield batch
        finally:
            held.leave()
            self._keep(held, keep_alive_s)
            await self._reported()

    async def _reported(self) -> None:
        """Wait (briefly) for the hub to have this replica's models: a client's /api/ps
        right after its request then shows them."""
        sent = self.report()
        if sent is not None:
            try:
                await asyncio.wait_for(asyncio.shield(sent), REPORT_WAIT_S)
            except Exception:  # a slow or lost hub never fails a request
                pass

    async def count_tokens(self, request: ChatGenerate) -> Accepted | Rejected:
        """The prompt tokens of a chat request on the model (loaded for it if need be)."""
        name = model_key(serve.get_multiplexed_model_id())
        try:
            held, _ = await self._acquire(name)
        except RequestError as exc:
            return Rejected(status=exc.status, message=exc.message, param=exc.param,
                            code=exc.code, type=exc.type)
        try:
            return await held.worker.count_tokens(request)
        finally:
            held.leave()
            self._keep(held, None)
            self.report()

    async def load(self, keep_alive_s: float | None = None) -> dict:
        """Ollama's empty request: load the model (keep_alive 0: unload it instead).
        Returns `done_reason` and `load_s`, or a refusal as `rejected` (a Rejected's fields:
        the model is unknown, 404, or cannot be served, 422)."""
        name = model_key(serve.get_multiplexed_model_id())
        if keep_alive_s is not None and keep_alive_s == 0:
            unloaded = self.unload(name)
            await self._reported()
            return {"done_reason": "unload", "unloaded": unloaded, "load_s": 0.0}
        try:
            held, load_s = await self._acquire(name)
        except RequestError as exc:
            return {"rejected": {"status": exc.status, "message": exc.message,
                                 "code": exc.code}}
        self._forget_evicted()
        held.leave()
        self._keep(held, keep_alive_s)
        await self._reported()
        return {"done_reason": "load", "load_s": load_s}

    async def running(self) -> list[dict]:
        """The models loaded on this replica (see `held`)."""
        self._forget_evicted()
        return self.held()

    def held(self) -> list[dict]:
        """The models loaded on this replica, as descriptions with `expires_at`, `size`,
        `context_length` and the replica's id."""
        out = []
        for name, held in self.loaded.items():
            m = held.worker.model
            out.append({**held.entry.info(), "id": name, "weight_bytes": held.weight_bytes,
                        "size": held.entry.size, "context_length": m.context_length,
                        "expires_at": held.expires_at, "loaded_at": held.loaded_at,
                        "active": held.in_flight, "loads": self.loads.get(name, 0),
                        "load_s": held.load_s, "replica": self.replica})
        return out

    def check_health(self) -> None:
        self._forget_evicted()
        self.report()  # (also: a replica not heard from for a while holds nothing)
        if self.metrics_hub is not None:
            self.metrics.set("flm_models_loaded", self.replica, value=len(self.loaded))
            self.metrics_hub.push.remote(f"{self.replica}/library", self.metrics.snapshot())
        for held in list(self.loaded.values()):
            if not held.worker.healthy:
                raise RuntimeError(f"{held.entry.name}: the decode loop has failed: "
                                   f"{held.worker.error!r}")
            if self.metrics_hub is not None:  # not awaited: a slow hub never fails a check
                source = f"{self.replica}/{held.entry.name}"
                self.metrics_hub.push.remote(source, held.worker.metrics_snapshot(source))


def library_worker(max_loaded_models: int):
    """The LibraryWorker deployment class holding at most `max_loaded_models` per replica
    (Serve's limit is fixed when its loader is decorated, hence a class per limit)."""

    class LibraryWorker(LibraryWorkerBase):
        @serve.multiplexed(max_num_models_per_replica=max_loaded_models)
        async def held_model(self, name: str) -> HeldModel:
            return await self._load(name)

    return serve.deployment(LibraryWorker)
