"""Embedding requests in the worker (no Ray): vectors as a client gets them (unit length,
the same whatever else is in the batch or running beside them), the checks against the
model (context, dimensions, token ids) naming the input, and the KV cache left as it was."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import numpy as np
import pytest

from actors.embedding import (
    IDLE_SLICE_S,
    MAX_CREDIT_S,
    MAX_STEP_TOKENS,
    STREAM_SHARE,
    Embedder,
    EmbedJob,
    finish,
)
from actors.events import (
    Accepted,
    ChatGenerate,
    Deltas,
    Embeddings,
    EmbedGenerate,
    Finished,
    Rejected,
    Usage,
)
from actors.worker import Worker
from npu import load_model
from npu.load.tiny import ensure_tiny

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def worker(tmp_path_factory) -> Worker:
    folder: Path = ensure_tiny(tmp_path_factory.mktemp("cache"))
    w = Worker(lambda: load_model(folder, name="flm-tiny"), max_batch=4)
    yield w
    w.close()


async def _embed(worker: Worker, inputs: list, **kw) -> list:
    req = EmbedGenerate(request_id="e", inputs=inputs, **kw)
    return [ev async for batch in worker.generate(req) for ev in batch]


def _vectors(events: list) -> np.ndarray:
    (emb,) = [e for e in events if isinstance(e, Embeddings)]
    return np.frombuffer(emb.vectors, dtype="<f4").reshape(len(emb.tokens), emb.dims)


def test_events_and_unit_vectors(worker) -> None:
    events = asyncio.run(_embed(worker, ["Hello there", "a cat sat", [5, 6, 7]]))
    assert isinstance(events[0], Accepted) and isinstance(events[-1], Usage)
    v = _vectors(events)
    assert v.shape == (3, worker.model.embedding_dims)
    assert np.allclose(np.linalg.norm(v, axis=1), 1, atol=1e-5)
    assert events[0].prompt_tokens == events[-1].prompt_tokens == sum(events[1].tokens)
    assert events[-1].completion_tokens == 0


def test_same_input_same_vector_whatever_the_batch(worker) -> None:
    alone = _vectors(asyncio.run(_embed(worker, ["a cat sat"])))
    mixed = _vectors(asyncio.run(_embed(worker, ["Hello there, how are you", "a cat sat",
                                                 "x"])))
    np.testing.assert_allclose(mixed[1], alone[0], rtol=0, atol=1e-6)

    async def together() -> list:
        return await asyncio.gather(_embed(worker, ["a cat sat"]),
                                    _embed(worker, ["something else entirely"]))
    first, _ = asyncio.run(together())
    np.testing.assert_allclose(_vectors(first)[0], alone[0], rtol=0, atol=1e-6)


def test_dimensions_truncate_then_normalize(worker) -> None:
    full = _vectors(asyncio.run(_embed(worker, ["a cat sat"])))[0]
    cut = _vectors(asyncio.run(_embed(worker, ["a cat sat"], dimensions=8)))[0]
    assert cut.shape == (8,)
    np.testing.assert_allclose(cut, full[:8] / np.linalg.norm(full[:8]), atol=1e-6)


@pytest.mark.parametrize("inputs,kw,param,text", [
    (["ok", ""], {}, "input", "Input 1 is empty"),
    ([[1, 10**9]], {}, "input", "Input 0 holds token id"),
    (["ok"], {"dimensions": 10**6}, "dimensions", "between 1 and"),
    (["ok", "word " * 5000], {}, "input", "Input 1 has"),
])
def test_bad_inputs_are_rejected_naming_them(worker, inputs, kw, param, text) -> None:
    (ev,) = asyncio.run(_embed(worker, inputs, **kw))
    assert isinstance(ev, Rejected) and ev.status == 400
    assert ev.param == param and text in ev.message


def test_truncate_cuts_to_the_context(worker) -> None:
    events = asyncio.run(_embed(worker, ["word " * 5000], truncate=True))
    assert _vectors(events).shape[0] == 1
    assert events[1].tokens == [worker.model.context_length]


def test_embedding_leaves_the_kv_cache_and_running_chats_alone(worker) -> None:
    chat = ChatGenerate(request_id="c", messages=[{"role": "user", "content": "hi"}],
                        max_tokens=12, seed=1, temperature=0)

    async def text(events) -> str:
        return "".join(d.text for e in events if isinstance(e, Deltas) for d in e.deltas)

    async def run_chat() -> list:
        return [ev async for b in worker.generate(chat) for ev in b]

    alone = asyncio.run(run_chat())
    before = worker.model.engine.kv_usage()

    async def beside() -> tuple:
        return await asyncio.gather(run_chat(), _embed(worker, ["word " * 200] * 6))
    events, emb = asyncio.run(beside())
    assert asyncio.run(text(events)) == asyncio.run(text(alone))
    assert _vectors(emb).shape[0] == 6
    assert worker.model.engine.kv_usage() == before


def test_a_long_input_does_not_hold_a_chat_that_arrives_meanwhile(worker) -> None:
    """A 4,000-token input is one forward of about a second here (128 steps), two of them
    two forwards: a chat sent once the first runs streams and ends while they are still
    under way (the embedding takes a quarter of the chat's time meanwhile)."""
    engine = worker.model.engine
    started = threading.Event()
    steps = engine.embed_steps

    def watched(items):
        gen = steps(items)
        next(gen)
        started.set()  # the decode thread is inside the forward
        return (yield from gen)

    chat = ChatGenerate(request_id="c", messages=[{"role": "user", "content": "hi"}],
                        max_tokens=12, seed=1, temperature=0)
    long = [(i * 7) % 1000 + 100 for i in range(4000)]

    async def both() -> tuple:
        embedding = asyncio.ensure_future(_embed(worker, [long, long[::-1]]))
        assert await asyncio.to_thread(started.wait, 60)
        events = [ev async for b in worker.generate(chat) for ev in b]
        return events, embedding.done(), await embedding

    engine.embed_steps = watched
    try:
        events, embedding_done, emb = asyncio.run(both())
    finally:
        del engine.embed_steps
    (done,) = [e for e in events if isinstance(e, Finished)]
    assert done.completion_tokens == 12
    assert not embedding_done  # the chat ended first
    alone = _vectors(asyncio.run(_embed(worker, [long])))
    assert np.array_equal(_vectors(emb)[:1], alone)


class Clock:
    """A test's clock: each engine step takes `step` seconds of it."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        return self.now


class StepEngine:
    """An engine whose `embed_steps` takes `steps` steps of the clock's time, then gives
    each input's length as its vector; `closed` counts forwards stopped before their end."""

    def __init__(self, clock: Clock, steps: int) -> None:
        self.clock, self.steps, self.started, self.closed = clock, steps, 0, 0

    def embed_steps(self, items):
        self.started += 1
        try:
            for _ in range(self.steps - 1):
                self.clock.now += self.clock.step
                yield
            self.clock.now += self.clock.step
        except GeneratorExit:
            self.closed += 1
            raise
        return np.array([[len(i), 1, 0, 0] for i in items], dtype=np.float32)


class StepModel:
    def __init__(self, engine: StepEngine) -> None:
        self.engine = engine


def _job(name: str, *lengths: int) -> EmbedJob:
    from actors.outbox import Outbox

    job = EmbedJob(EmbedGenerate(request_id=name), [[1] * n for n in lengths], dims=4)
    job.outbox = Outbox(loop=None)
    return job


def _lengths(outbox) -> list[float]:
    """The first entry of each vector an ended job's outbox holds (its input's length)."""
    (emb,) = [e for e in outbox.pending if isinstance(e, Embeddings)]
    return np.frombuffer(emb.vectors, dtype="<f4").reshape(-1, emb.dims)[:, 0].tolist()


def test_a_forward_runs_in_slices_when_nothing_else_runs() -> None:
    step = 0.3 * IDLE_SLICE_S
    clock = Clock(step=step)
    e = Embedder(StepModel(StepEngine(clock, steps=10)), clock=clock)
    jobs = [_job("a", 5, 7)]
    assert e.ready(False)
    assert e.run(jobs, busy=False) == []  # 4 steps (1.2 slices), then back to the loop
    assert clock.now == pytest.approx(4 * step) and e.credit == 0
    e.run(jobs, busy=False)
    (ended,) = e.run(jobs, busy=False)  # the last 2 steps: the job's vectors
    assert clock.now == pytest.approx(10 * step) and not jobs and e.forward is None
    assert e.model.engine.started == 1
    np.testing.assert_allclose(_lengths(ended), [5 / np.hypot(5, 1), 7 / np.hypot(7, 1)])


def test_beside_chats_a_forward_takes_its_share_of_their_time() -> None:
    clock = Clock(step=0.01)
    e = Embedder(StepModel(StepEngine(clock, steps=40)), clock=clock)
    jobs = [_job("a", 3000)]
    assert not e.ready(True)  # no chat step has paid for one yet
    e.earn(0.01)
    assert e.ready(True) and e.credit == pytest.approx(STREAM_SHARE * 0.01)
    e.run(jobs, busy=True)  # one step (nothing measured yet), 7.5 ms owed
    assert clock.now == pytest.approx(0.01) and e.step_s == pytest.approx(0.01)
    assert e.credit == pytest.approx(STREAM_SHARE * 0.01 - 0.01)
    chat_s = 0.0
    while jobs:  # chat steps of 20 ms, embedding steps whenever they have earned one
        e.earn(0.02)
        chat_s += 0.02
        if e.ready(True):
            e.run(jobs, busy=True)
    assert clock.now == pytest.approx(0.4)  # 40 steps of 10 ms
    assert chat_s == pytest.approx(0.4 / STREAM_SHARE, rel=0.1)  # while 1.6 s of chats ran
    for _ in range(1000):
        e.earn(1.0)
    assert e.credit == pytest.approx(MAX_CREDIT_S)  # what is saved up is bounded


def test_a_forward_whose_clients_left_stops() -> None:
    clock = Clock(step=0.05)
    engine = StepEngine(clock, steps=100)
    e = Embedder(StepModel(engine), clock=clock)
    a, b = _job("a", 10), _job("b", 10)
    jobs = [a, b]
    e.run(jobs, busy=False)
    assert e.forward is not None and len(e.forward.picked) == 2  # both in one forward
    a.cancelled = True
    e.drop_cancelled()
    assert e.forward is not None  # b still waits for it
    b.cancelled = True
    e.drop_cancelled()
    assert e.forward is None and engine.closed == 1


def test_a_forward_takes_inputs_up_to_the_step_budget() -> None:
    clock = Clock(step=0.001)
    engine = StepEngine(clock, steps=1)
    e = Embedder(StepModel(engine), clock=clock)
    big = MAX_STEP_TOKENS // 2 + 1
    a, b = _job("a", big, big), _job("b", 1)
    jobs = [a, b]
    assert e.run(jobs, busy=False) == []  # a's first input alone: with its second, past it
    assert a.done == 1 and b.done == 0
    ended = e.run(jobs, busy=False)  # then a's second and b's, in one forward: both end
    assert ended == [a.outbox, b.outbox] and not jobs and engine.started == 2
    assert _lengths(a.outbox) == pytest.approx([big / np.hypot(big, 1)] * 2)


def test_finish_normalizes_and_keeps_zero() -> None:
    v = np.array([[3, 4, 12], [0, 0, 0]], dtype=np.float32)
    out = finish(v, 2)
    np.testing.assert_allclose(out, [[0.6, 0.8], [0, 0]])
