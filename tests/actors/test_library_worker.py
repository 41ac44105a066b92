"""actors/library_worker.py without Serve: the memory budget's choice of models to unload."""

from __future__ import annotations

import asyncio
import weakref
from collections import OrderedDict

import pytest

from actors.errors import RequestError
from actors.library_worker import room_for

pytestmark = pytest.mark.timeout(60)  # the asyncio cases wait on locks: a hang fails


def test_nothing_is_unloaded_while_the_model_fits() -> None:
    assert room_for(10, [("a", 30, True), ("b", 30, True)], 100) == []


def test_the_least_recently_used_idle_models_make_room() -> None:
    held = [("old", 40, True), ("busy", 40, False), ("new", 40, True)]
    assert room_for(30, held, 130) == ["old"]
    assert room_for(70, held, 130) == ["old", "new"]


def test_a_model_over_the_budget_alone_is_507_with_both_sizes() -> None:
    with pytest.raises(RequestError) as err:
        room_for(5_000_000_000, [], 4_000_000_000)
    assert err.value.status == 507 and err.value.code == "model_too_large"
    assert "5,000 MB" in err.value.message and "4,000 MB" in err.value.message


def test_models_serving_requests_are_never_unloaded_under_them() -> None:
    with pytest.raises(RequestError) as err:
        room_for(50, [("busy", 80, False), ("idle", 10, True)], 100)
    assert err.value.status == 503 and "serving requests" in err.value.message


class _FakeEngine:
    weight_bytes = 1000

    def kv_usage(self) -> dict:
        return {"kv_bytes": 24}


class _FakeWorker:
    def __init__(self) -> None:
        self.closed = 0
        self.model = type("M", (), {"engine": _FakeEngine()})()

    def close(self) -> None:
        self.closed += 1


def _held():
    from actors.library import LibraryModel
    from actors.library_worker import HeldModel

    entry = LibraryModel(name="m", path="m.gguf", files=("m.gguf",), format="gguf", size=1,
                         modified=0.0, digest="")
    return HeldModel(entry, _FakeWorker(), 0.5)


def test_an_evicted_model_with_requests_in_flight_stops_when_the_last_one_ends() -> None:
    held = _held()
    held.enter()
    held.enter()
    held.__del__()  # Serve's eviction
    assert held.retired and held.worker.closed == 0
    held.leave()
    assert held.worker.closed == 0
    held.leave()
    assert held.worker.closed == 1
    assert held.held_bytes() == 1024


def test_an_idle_model_stops_at_once_when_evicted() -> None:
    held = _held()
    held.__del__()
    assert held.worker.closed == 1


def test_a_replica_reports_its_models_to_the_hub_numbered_in_order() -> None:
    from actors.library_worker import LibraryWorkerBase

    sent = []
    hub = type("Hub", (), {"hold": type("M", (), {
        "remote": staticmethod(lambda *args: sent.append(args))})()})()
    worker = LibraryWorkerBase.__new__(LibraryWorkerBase)  # its report needs no Serve
    held = _held()
    held.worker.model.context_length = 256
    worker.metrics_hub, worker.replica, worker._reports = hub, "r1", 0
    worker.loaded, worker.loads = {"m": held}, {"m": 1}
    worker.report()
    del worker.loaded["m"]
    worker.report()
    (replica, seq, models), (_, seq2, after) = sent
    assert replica == "r1" and (seq, seq2) == (1, 2)
    assert models[0]["id"] == "m" and models[0]["replica"] == "r1" and after == []
    assert models[0]["context_length"] == 256 and models[0]["weight_bytes"] == 1000
    worker.metrics_hub = None
    assert worker.report() is None  # no hub: nothing sent


def _library_worker(budget: int):
    from actors.library_worker import LibraryWorkerBase
    from actors.metrics import Metrics

    worker = LibraryWorkerBase.__new__(LibraryWorkerBase)  # the budget's checks need no Serve
    worker.budget, worker.loaded, worker.draining = budget, {}, []
    worker.metrics, worker.metrics_hub = Metrics(), None
    worker._cold = asyncio.Lock()
    return worker


@pytest.mark.parametrize("how", ["unloaded", "evicted by Serve"])
def test_a_model_still_serving_after_its_unload_counts_until_its_last_request(how) -> None:
    """Its memory is freed only when its worker stops: a model loaded meanwhile must fit
    beside it (503, retry shortly) instead of going past the budget."""
    from actors.library import LibraryModel

    worker = _library_worker(budget=2500)
    busy = _held()  # 1,024 bytes held
    busy.enter()
    worker.loaded["m"] = busy
    if how == "unloaded":
        assert worker.unload("m", reason="keep_alive")
    else:
        busy.__del__()  # Serve's LRU eviction, before it calls the loader
    assert busy.retired and busy.worker.closed == 0
    entry = LibraryModel(name="n", path="n.gguf", files=("n.gguf",), format="gguf",
                         size=2000, modified=0.0, digest="")
    with pytest.raises(RequestError) as err:
        worker._make_room(entry)
    assert err.value.status == 503
    assert "serving requests" in err.value.message
    assert worker.draining == [busy]
    busy.leave()  # its last request ends: the worker stops, the memory goes
    assert busy.worker.closed == 1 and worker.draining == []
    gone = weakref.ref(busy)
    del busy
    assert gone() is None  # nothing here holds it (a cycle would wait for the collector)
    worker._make_room(entry)  # fits now


class _Multiplexer:
    """Serve's multiplexer as ray/serve/multiplex.py runs it: an OrderedDict in LRU order;
    a load past the limit evicts the least recently used model (its __del__), busy or not."""

    def __init__(self, limit: int, load) -> None:
        self.models: OrderedDict = OrderedDict()
        self.limit, self.load = limit, load

    async def get(self, name: str):
        if name in self.models:
            self.models.move_to_end(name)
            return self.models[name]
        if len(self.models) >= self.limit:
            _, evicted = self.models.popitem(last=False)
            evicted.__del__()
        self.models[name] = self.load(name)
        return self.models[name]


def _on_multiplexer(make) -> tuple:
    """A library worker whose Serve multiplexer is `make(load)` (a _Multiplexer); `load`
    makes a held model known as LibraryWorkerBase._load does; every name servable."""
    from actors.library import LibraryModel
    from actors.library_worker import HeldModel

    worker = _library_worker(budget=1 << 40)

    def load(name: str) -> HeldModel:
        entry = LibraryModel(name=name, path=f"{name}.gguf", files=(f"{name}.gguf",),
                             format="gguf", size=1, modified=0.0, digest="")
        worker.loaded[name] = HeldModel(entry, _FakeWorker(), 0.5)
        return worker.loaded[name]

    mux = make(load)
    setattr(worker, "__serve_multiplex_wrapper", mux)
    worker.held_model = mux.get

    async def servable(name: str) -> None:
        return None

    worker._servable = servable
    return worker, mux


def test_a_load_past_the_limit_evicts_an_idle_model_not_one_serving_requests() -> None:
    """A model streaming a long answer (the least recently used: two loads came after it)
    stays loaded; the idle one goes. With every model busy Serve still evicts one."""
    worker, mux = _on_multiplexer(lambda load: _Multiplexer(2, load))

    async def run() -> None:
        chat, _ = await worker._acquire("chat")  # streaming: in flight throughout
        rerank, _ = await worker._acquire("rerank")
        rerank.leave()
        other, _ = await worker._acquire("other")
        assert set(mux.models) == {"chat", "other"} and rerank.retired
        assert not chat.retired and chat.worker.closed == 0
        third, _ = await worker._acquire("third")  # both busy: Serve evicts one of them
        assert len(mux.models) == 2 and "third" in mux.models
        for held in (chat, other, third):
            held.leave()

    asyncio.run(run())


class _LockedMultiplexer(_Multiplexer):
    """_Multiplexer with Serve's load lock, and loads that wait for `gates[name]`."""

    def __init__(self, limit: int, load, gates: dict[str, asyncio.Event]) -> None:
        super().__init__(limit, load)
        self.lock, self.gates, self.loading = asyncio.Lock(), gates, None

    async def get(self, name: str):
        if name in self.models:
            self.models.move_to_end(name)
            return self.models[name]
        async with self.lock:
            if name in self.models:
                return self.models[name]
            if len(self.models) >= self.limit:
                _, evicted = self.models.popitem(last=False)
                evicted.__del__()
            self.loading = name
            if name in self.gates:
                await self.gates[name].wait()
            self.models[name] = self.load(name)
            return self.models[name]


def test_a_request_during_a_load_does_not_make_the_next_load_evict_a_busy_model() -> None:
    """Two cold loads at once, and a request to an idle model while the first loads: the
    second load's eviction still spares the model streaming (the reorder and Serve's
    eviction run together, not on either side of Serve's load lock)."""
    gate = asyncio.Event()
    worker, mux = _on_multiplexer(lambda load: _LockedMultiplexer(3, load, {"c": gate}))

    async def run() -> None:
        chat, _ = await worker._acquire("chat")  # streaming throughout
        for name in ("idle1", "idle2"):
            held, _ = await worker._acquire(name)
            held.leave()
        loads = asyncio.gather(worker._acquire("c"), worker._acquire("d"))
        while mux.loading != "c":
            await asyncio.sleep(0)
        held, _ = await worker._acquire("idle2")  # a short request while c loads
        held.leave()
        gate.set()
        for held, _ in await loads:
            held.leave()
        assert not chat.retired and "chat" in mux.models
        chat.leave()

    asyncio.run(run())
