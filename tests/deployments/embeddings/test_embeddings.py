"""The embedding routes without Ray: what OpenAI's, Ollama's and llama-server's clients
send is typed into one EmbedGenerate, and the worker's vectors come back in each API's
shape (floats, base64 of little-endian float32, Ollama's lists, llama-server's one-row
matrices normalized as asked); bad input is a 400 in the API's shape naming the field,
before any worker is asked."""

from __future__ import annotations

import base64

import msgspec
import numpy as np
import pytest

from actors.events import Accepted, Embeddings, EmbedGenerate, Rejected, Usage
from deployments.embeddings.request import MAX_INPUTS
from tests.deployments.test_hostile_bodies import HOSTILE
from tests.deployments.test_ingress import FakeStream, FakeWorker, _client

VECTORS = np.array([[0.6, 0.8, 0.0], [0.0, 0.0, 1.0]], dtype="<f4")


def _play(rows: int = 2) -> FakeStream:
    v = VECTORS[:rows]
    return FakeStream([[Accepted(request_id="r", model="m", prompt_tokens=5 * rows),
                        Embeddings(vectors=v.tobytes(), dims=3, tokens=[5] * rows),
                        Usage(prompt_tokens=5 * rows, completion_tokens=0)]])


def test_openai_floats_and_base64() -> None:
    worker = FakeWorker(_play(), _play(1))
    client, _ = _client(worker)
    r = client.post("/v1/embeddings", json={"model": "m", "input": ["a", "b"]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == "m"
    assert [d["index"] for d in body["data"]] == [0, 1]
    assert np.allclose([d["embedding"] for d in body["data"]], VECTORS)
    assert body["usage"] == {"prompt_tokens": 10, "total_tokens": 10}
    assert worker.requests[0] == EmbedGenerate(request_id=worker.requests[0].request_id,
                                               inputs=["a", "b"])
    r = client.post("/v1/embeddings", json={"model": "m", "input": [1, 2, 3],
                                            "encoding_format": "base64", "dimensions": 3})
    raw = base64.b64decode(r.json()["data"][0]["embedding"])
    assert np.array_equal(np.frombuffer(raw, dtype="<f4"), VECTORS[0])
    assert worker.requests[1].inputs == [[1, 2, 3]] and worker.requests[1].dimensions == 3
    assert worker.requests[1].truncate is False  # OpenAI refuses, never cuts


def test_openai_truncate_prompt_tokens_keeps_each_inputs_last_tokens() -> None:
    """vLLM's `truncate_prompt_tokens` travels as `keep_last` (-1: the context); the
    worker's refusal of a size names it as the client sent it."""
    reject = FakeStream([[Rejected(status=400, param="keep_last", message=(
        "'keep_last' is 9000, more than this model's maximum context length of 2048 "
        "tokens: ask for at most 2048 (or -1: the context)."))]])
    worker = FakeWorker(_play(1), _play(1), reject)
    client, _ = _client(worker)
    for k in (16, -1):
        r = client.post("/v1/embeddings", json={"model": "m", "input": "a",
                                                "truncate_prompt_tokens": k})
        assert r.status_code == 200, r.text
    assert [req.keep_last for req in worker.requests] == [16, -1]
    r = client.post("/v1/embeddings", json={"model": "m", "input": "a",
                                            "truncate_prompt_tokens": 9000})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "truncate_prompt_tokens"
    assert err["message"].startswith("'truncate_prompt_tokens' is 9000")


@pytest.mark.parametrize("body,param", [
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": 5}, "input"),
    ({"input": ["a", 1]}, "input"),
    ({"input": ["a", ""]}, "input[1]"),
    ({"input": [[1, 2], []]}, "input[1]"),
    ({"input": [[1, "x"]]}, "input[0]"),
    ({"input": "a", "encoding_format": "hex"}, "encoding_format"),
    ({"input": "a", "dimensions": 0}, "dimensions"),
    ({"input": "a", "dimensions": "8"}, "dimensions"),
    ({"input": "a", "truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
    ({"input": "a", "truncate_prompt_tokens": "8"}, "truncate_prompt_tokens"),
    ({"input": "a", "model": "nope"}, "model"),
])
def test_openai_bad_input_is_a_400_naming_the_field(body: dict, param: str) -> None:
    worker = FakeWorker()
    client, _ = _client(worker)
    r = client.post("/v1/embeddings", json={"model": "m", **body})
    assert r.status_code in (400, 404), r.text
    assert r.json()["error"]["param"] == param
    assert worker.requests == []


def test_a_worker_rejection_keeps_the_api_shape() -> None:
    reject = FakeStream([[Rejected(status=400, message="Input 0 has 9000 tokens; ...",
                                   param="input", code="context_length_exceeded")]])
    client, _ = _client(FakeWorker(reject))
    r = client.post("/v1/embeddings", json={"model": "m", "input": "long"})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded"
    client, _ = _client(FakeWorker(FakeStream([[Rejected(status=400, message="too long",
                                                         param="input")]])))
    r = client.post("/api/embed", json={"model": "m", "input": "long", "truncate": False})
    assert r.status_code == 400 and r.json() == {"error": "too long"}


def test_ollama_embed_and_embeddings() -> None:
    worker = FakeWorker(_play(), _play(1))
    client, _ = _client(worker)
    r = client.post("/api/embed", json={"model": "m:latest", "input": ["a", "b"]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert np.allclose(body["embeddings"], VECTORS) and body["model"] == "m:latest"
    assert body["prompt_eval_count"] == 10 and body["total_duration"] > 0
    assert worker.requests[0].truncate is True  # Ollama cuts by default
    r = client.post("/api/embeddings", json={"model": "m", "prompt": "a"})
    assert np.allclose(r.json()["embedding"], VECTORS[0])
    assert worker.requests[1].inputs == ["a"]


def test_ollama_empty_input_loads_and_bad_input_is_an_ollama_error() -> None:
    worker = FakeWorker()
    client, _ = _client(worker)
    r = client.post("/api/embed", json={"model": "m"})
    assert r.status_code == 200 and r.json()["embeddings"] == []
    assert client.post("/api/embeddings", json={"model": "m", "prompt": ""}).json() == \
        {"embedding": []}
    r = client.post("/api/embed", json={"model": "m", "input": 3})
    assert r.status_code == 400 and isinstance(r.json()["error"], str)
    r = client.post("/api/embed", json={"model": "other", "input": "a"})
    assert r.status_code == 404 and "other" in r.json()["error"]
    assert worker.requests == []


def test_ollama_embed_reports_the_load_it_waited_for() -> None:
    """A request that waited for its library model's load says so in `load_duration`, as
    Ollama's does (the worker's Accepted carries the load's seconds)."""
    v = VECTORS[:1]
    worker = FakeWorker(FakeStream([[Accepted(request_id="r", model="m", prompt_tokens=5,
                                              load_s=0.25),
                                     Embeddings(vectors=v.tobytes(), dims=3, tokens=[5]),
                                     Usage(prompt_tokens=5, completion_tokens=0)]]))
    client, _ = _client(worker)
    body = client.post("/api/embed", json={"model": "m", "input": "a"}).json()
    assert body["load_duration"] == 250_000_000 and body["prompt_eval_count"] == 5


@pytest.mark.parametrize("dimensions, expected", [
    (2, [[0.6, 0.8], [0.0, 0.0]]),  # cut and normalized again (a zero row stays zero)
    (3, VECTORS.tolist()), (5, VECTORS.tolist()), (0, VECTORS.tolist()),
    (-1, VECTORS.tolist())])
def test_ollama_dimensions_follow_ollamas_rule(dimensions: int, expected: list) -> None:
    """Ollama cuts a vector to `dimensions` only where that is fewer than the model's, and
    reads 0 (Go's unset) or less as none: never a 400 for a size the model lacks."""
    worker = FakeWorker(_play())
    client, _ = _client(worker)
    r = client.post("/api/embed", json={"model": "m", "input": ["a", "b"],
                                        "dimensions": dimensions})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json()["embeddings"], expected, atol=1e-6)


class _Library:
    """An ingress whose one model is a library model (loaded on request), as `ingress.load`
    sees it: the keep_alive each load was asked with."""

    streams: dict = {}

    def __init__(self) -> None:
        self.loads: list[float | None] = []

    def resolve(self, name: str) -> str | None:
        return "lib" if name == "lib" else None

    async def load(self, model: str, keep_alive_s: float | None) -> dict:
        self.loads.append(keep_alive_s)
        return {"done_reason": "load", "load_s": 0.5}


@pytest.mark.parametrize("path, body", [("/api/embed", {"input": ""}), ("/api/embed", {}),
                                        ("/api/embeddings", {"prompt": ""})])
def test_ollama_empty_input_loads_a_library_model(path: str, body: dict) -> None:
    """As Ollama, an embedding request with nothing to embed loads the model (keep_alive 0:
    unloads it), then answers no embeddings (the load's time in /api/embed's)."""
    import asyncio

    from deployments.embeddings.request import embed_call, embeddings_call

    ingress = _Library()
    build = embed_call if path == "/api/embed" else embeddings_call
    for keep, seconds in ((None, None), (0, 0.0)):
        call = build(msgspec.json.encode({"model": "lib", "keep_alive": keep, **body}),
                     ingress)
        assert call.later is not None and call.now is None
        answer = msgspec.json.decode(asyncio.run(call.later()).body)
        assert ingress.loads[-1] == seconds
        if path == "/api/embed":
            assert answer["embeddings"] == [] and answer["load_duration"] == 500_000_000
            assert answer["total_duration"] > 0
        else:
            assert answer == {"embedding": []}
    assert len(ingress.loads) == 2


def test_ollama_embed_caps_its_inputs_as_openai_does() -> None:
    """/api/embed refuses more inputs than /v1/embeddings takes, in Ollama's shape and
    naming the limit, before any worker is asked; the limit itself still passes."""
    worker = FakeWorker(_play())
    client, _ = _client(worker)
    r = client.post("/api/embed", json={"model": "m", "input": ["a"] * (MAX_INPUTS + 1)})
    assert r.status_code == 400, r.text
    assert list(r.json()) == ["error"] and str(MAX_INPUTS) in r.json()["error"]
    r = client.post("/v1/embeddings", json={"model": "m", "input": ["a"] * (MAX_INPUTS + 1)})
    assert r.status_code == 400 and str(MAX_INPUTS) in r.json()["error"]["message"]
    assert worker.requests == []
    r = client.post("/api/embed", json={"model": "m", "input": ["a"] * MAX_INPUTS})
    assert r.status_code == 200 and len(worker.requests[0].inputs) == MAX_INPUTS


def test_llama_servers_embedding_is_a_list_of_one_row_matrices() -> None:
    """/embedding (and /embeddings): `content` or `input` in llama-server's prompt forms,
    answered as `[{"index", "embedding": [vector]}]` (the pooled vector, L2-normalized by
    default)."""
    worker = FakeWorker(_play(), _play(1), _play())
    client, _ = _client(worker)
    r = client.post("/embedding", json={"content": ["a", [1, 2]]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [d["index"] for d in body] == [0, 1]
    assert np.allclose([d["embedding"][0] for d in body], VECTORS)
    assert all(len(d["embedding"]) == 1 for d in body)
    assert worker.requests[0].inputs == ["a", [1, 2]] and not worker.requests[0].truncate
    r = client.post("/embeddings", json={"input": [5, 6], "content": "ignored"})
    assert r.status_code == 200 and worker.requests[1].inputs == [[5, 6]]
    r = client.post("/embedding", json={"content": "a", "model": "m"})
    assert r.status_code == 200 and worker.requests[2].inputs == ["a"]


@pytest.mark.parametrize("p", [0, 1, 3, 700])
def test_llama_servers_embd_normalize_renormalizes_the_unit_vectors(p: int) -> None:
    """Every norm scales with the vector: the worker's unit vector normalized as asked is
    the raw vector normalized so (llama.cpp's common_embd_normalize); a large p too (the
    powers of a unit vector's values underflowed to a zero norm)."""
    raw = np.array([[3.0, -4.0, 12.0], [0.5, 0.25, -2.0]])
    unit = (raw / np.linalg.norm(raw, axis=1, keepdims=True)).astype("<f4")
    play = FakeStream([[Accepted(request_id="r", model="m", prompt_tokens=4),
                        Embeddings(vectors=unit.tobytes(), dims=3, tokens=[2, 2])]])
    client, _ = _client(FakeWorker(play))
    r = client.post("/embedding", json={"content": ["a", "b"], "embd_normalize": p})
    got = np.array([d["embedding"][0] for d in r.json()])
    if p == 0:
        want = raw / (np.abs(raw).max(axis=1, keepdims=True) / 32760.0)
    else:
        top = np.abs(raw).max(axis=1, keepdims=True)
        want = raw / (top * ((np.abs(raw) / top) ** p).sum(axis=1, keepdims=True) ** (1 / p))
    assert np.allclose(got, want, rtol=1e-5)


@pytest.mark.parametrize("body,param", [
    ({}, "content"),
    ({"content": ""}, "content"),
    ({"content": []}, "content"),
    ({"content": ["a", ""]}, "content[1]"),
    ({"content": [1, "a"]}, "content"),
    ({"content": ["a", [1, "b"]]}, "content[1]"),
    ({"input": {"x": 1}}, "input"),
    ({"content": "a", "embd_normalize": -1}, "embd_normalize"),
    ({"content": "a", "embd_normalize": "2"}, "embd_normalize"),
    ({"content": "a", "model": "nope"}, "model"),
])
def test_llama_servers_bad_embedding_input_is_its_400(body: dict, param: str) -> None:
    worker = FakeWorker()
    client, _ = _client(worker)
    r = client.post("/embedding", json=body)
    assert r.status_code in (400, 404), r.text
    err = r.json()["error"]
    assert err["param"] == param and err["code"] == r.status_code
    assert worker.requests == []


def test_llama_servers_embedding_refusal_names_its_field() -> None:
    reject = FakeStream([[Rejected(status=400, message="Input 0 has 9000 tokens; this "
                                   "model's maximum context length is 8 tokens.",
                                   param="input", code="context_length_exceeded")]])
    client, _ = _client(FakeWorker(reject))
    r = client.post("/embedding", json={"content": "long"})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "content"
    assert r.json()["error"]["type"] == "exceed_context_size_error"


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_hostile_bodies_are_4xx_on_llama_servers_embedding(kind: str) -> None:
    worker = FakeWorker()
    client, _ = _client(worker)
    for path in ("/embedding", "/embeddings"):
        r = client.post(path, content=HOSTILE[kind], headers={"content-type": "application/json"})
        assert r.status_code in (400, 404), (path, r.status_code, r.text[:300])
        assert r.json()["error"]["message"] and r.json()["error"]["code"] == r.status_code
    assert worker.requests == []
