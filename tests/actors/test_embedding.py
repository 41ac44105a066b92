"""Embedding requests in the worker (no Ray): vectors as a client gets them (unit length,
the same whatever else is in the batch or running beside them), the checks against the
model (context, dimensions, token ids) naming the input, and the KV cache left as it was."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from actors.embedding import MAX_CREDIT_S, MAX_STEP_TOKENS, STREAM_SHARE, EmbedJob, Embedder, finish
from actors.events import (
    Accepted,
    ChatGenerate,
    Deltas,
    EmbedGenerate,
    Embeddings,
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


def test_embedding_beside_streams_takes_its_share_of_their_time() -> None:
    e = Embedder(model=None)
    job = EmbedJob(EmbedGenerate(request_id="j"), [[1] * 100, [2] * 10], dims=4)
    assert e.ready(False, [job]) and e.budget(False) == MAX_STEP_TOKENS  # nothing decodes
    assert not e.ready(True, [job])  # no decode step has paid for one yet
    e.earn(0.01, [job])
    assert e.ready(True, [job]) and e.credit == pytest.approx(STREAM_SHARE * 0.01)
    assert e.budget(True) == 1  # no rate measured yet: one input
    e.tokens_per_s = 1000.0  # the next input (100 tokens) costs 0.1 s
    assert not e.ready(True, [job])  # earned 2.5 ms of it so far
    for _ in range(100):
        e.earn(0.01, [job])
    assert e.credit == pytest.approx(0.1) and e.ready(True, [job])  # saved up to its cost
    assert e.budget(True) == 100
    job.done = 1  # the next input costs 10 ms: what is saved up is bounded by MAX_CREDIT_S
    for _ in range(1000):
        e.earn(1.0, [job])
    assert e.credit == pytest.approx(MAX_CREDIT_S)


def test_finish_normalizes_and_keeps_zero() -> None:
    v = np.array([[3, 4, 12], [0, 0, 0]], dtype=np.float32)
    out = finish(v, 2)
    np.testing.assert_allclose(out, [[0.6, 0.8], [0, 0]])
