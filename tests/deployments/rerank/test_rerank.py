"""The rerank routes without Ray: every path (llama-server's, vLLM's, Jina's, Cohere's)
types the body into one Rerank, and the worker's scores come back sorted, cut to `top_n`,
with or without the documents; bad input is a 400 in OpenAI's shape naming the field before
any worker is asked, and a worker's refusal keeps its field and code."""

from __future__ import annotations

import pytest

from actors.events import Accepted, Failed, Rejected, Usage
from actors.rerank import Rerank, Scores
from deployments.rerank.request import COHERE_DOCUMENT_TOKENS, MAX_DOCUMENTS
from tests.deployments.test_ingress import FakeStream, FakeWorker, _client

DOCS = ["a cat", "stocks", "the cat sat", "dogs"]
SCORES = [0.5, 0.1, 0.9, 0.5]  # a tie: the first document first
PATHS = ["/rerank", "/reranking", "/v1/rerank", "/v1/reranking", "/v2/rerank"]


def _play(scores: list[float] = SCORES) -> FakeStream:
    n = len(scores)
    return FakeStream([[Accepted(request_id="r", model="m", prompt_tokens=6 * n),
                        Scores(scores=scores, tokens=[6] * n),
                        Usage(prompt_tokens=6 * n, completion_tokens=0)]])


@pytest.mark.parametrize("path", PATHS)
def test_every_path_answers_sorted_results_with_documents(path: str) -> None:
    worker = FakeWorker(_play())
    client, _ = _client(worker)
    r = client.post(path, json={"model": "m", "query": "cat?", "documents": DOCS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "m" and body["id"].startswith("rerank-")
    assert [x["index"] for x in body["results"]] == [2, 0, 3, 1]
    assert [x["relevance_score"] for x in body["results"]] == [0.9, 0.5, 0.5, 0.1]
    assert [x["document"] for x in body["results"]] == [{"text": DOCS[i]} for i in (2, 0, 3, 1)]
    assert body["usage"] == {"prompt_tokens": 24, "total_tokens": 24}
    (req,) = worker.requests
    cut = COHERE_DOCUMENT_TOKENS if path == "/v2/rerank" else None  # Cohere v2's default
    assert req == Rerank(request_id=req.request_id, query="cat?", documents=DOCS,
                         document_tokens=cut)
    assert req.request_id == body["id"]


def test_top_n_return_documents_and_text_objects() -> None:
    worker = FakeWorker(_play(), _play(), _play(), _play())
    client, _ = _client(worker)
    body = {"query": {"text": "cat?"}, "documents": [{"text": d} for d in DOCS]}  # Cohere's
    r = client.post("/v1/rerank", json={**body, "top_n": 2, "return_documents": False})
    assert r.json()["results"] == [{"index": 2, "relevance_score": 0.9},
                                   {"index": 0, "relevance_score": 0.5}]
    assert worker.requests[0].query == "cat?" and worker.requests[0].documents == DOCS
    # no model where the server serves one; top_n 0 (vLLM's default) and past the end: all
    for top_n in (0, 10, None):
        r = client.post("/rerank", json={"query": "q", "documents": DOCS, "top_n": top_n})
        assert len(r.json()["results"]) == 4 and r.json()["model"] == "m"


def test_teis_body_gets_teis_answer() -> None:
    """Hugging Face TEI's /rerank (llama-server takes it too): `texts`, `return_text`; the
    answer a list of {index, score[, text]}, sorted alike."""
    worker = FakeWorker(_play(), _play())
    client, _ = _client(worker)
    r = client.post("/rerank", json={"query": "cat?", "texts": DOCS, "truncate": True})
    assert r.status_code == 200 and r.json() == [
        {"index": 2, "score": 0.9}, {"index": 0, "score": 0.5}, {"index": 3, "score": 0.5},
        {"index": 1, "score": 0.1}]
    r = client.post("/rerank", json={"query": "cat?", "texts": DOCS, "return_text": True,
                                     "raw_scores": False})
    assert r.json()[0] == {"index": 2, "score": 0.9, "text": "the cat sat"}
    assert worker.requests[0].documents == DOCS


@pytest.mark.parametrize("body,param", [
    ({"documents": DOCS}, "query"),
    ({"query": "", "documents": DOCS}, "query"),
    ({"query": 3, "documents": DOCS}, "query"),
    ({"query": "q"}, "documents"),
    ({"query": "q", "documents": []}, "documents"),
    ({"query": "q", "documents": "a cat"}, "documents"),
    ({"query": "q", "documents": ["a", 2]}, "documents[1]"),
    ({"query": "q", "documents": ["a", {"title": "x"}]}, "documents[1].text"),
    ({"query": "q", "documents": ["a"] * (MAX_DOCUMENTS + 1)}, "documents"),
    ({"query": "q", "documents": DOCS, "top_n": -1}, "top_n"),
    ({"query": "q", "documents": DOCS, "top_n": "2"}, "top_n"),
    ({"query": "q", "documents": DOCS, "return_documents": "yes"}, "return_documents"),
    ({"query": "q", "documents": DOCS, "model": "nope"}, "model"),
    ({"query": "q", "texts": []}, "texts"),
    ({"query": "q", "texts": ["a", 2]}, "texts[1]"),
    ({"query": "q", "texts": DOCS, "raw_scores": True}, "raw_scores"),
    ({"query": "q", "documents": DOCS, "max_tokens_per_doc": 0}, "max_tokens_per_doc"),
    ({"query": "q", "documents": DOCS, "max_tokens_per_doc": "9"}, "max_tokens_per_doc"),
    ({"query": "q", "documents": DOCS, "truncate_prompt_tokens": -2},
     "truncate_prompt_tokens"),
    ({"query": "q", "documents": DOCS, "truncate_prompt_tokens": 1.5},
     "truncate_prompt_tokens"),
])
def test_bad_input_is_a_400_naming_the_field(body: dict, param: str) -> None:
    worker = FakeWorker()
    client, _ = _client(worker)
    r = client.post("/v1/rerank", json={"model": "m", **body})
    assert r.status_code == (404 if param == "model" else 400), r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error"
    assert worker.requests == []


def test_a_worker_refusal_keeps_its_field_and_a_failure_is_a_503() -> None:
    reject = FakeStream([[Rejected(status=400, message="Document 1 with the query has 600 "
                                   "tokens; ...", param="documents[1]",
                                   code="context_length_exceeded")]])
    failed = FakeStream([[Accepted(request_id="r", model="m", prompt_tokens=1),
                          Failed(message="The model worker failed: boom")]])
    client, _ = _client(FakeWorker(reject, failed))
    r = client.post("/v1/rerank", json={"query": "q", "documents": ["a", "b"]})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "documents[1]"
    assert r.json()["error"]["code"] == "context_length_exceeded"
    r = client.post("/v1/rerank", json={"query": "q", "documents": ["a", "b"]})
    assert r.status_code == 503 and "boom" in r.json()["error"]["message"]


def test_model_is_required_where_the_server_serves_several() -> None:
    from fastapi.testclient import TestClient

    from deployments.ingress import Ingress, current
    from deployments.server import make_app

    worker = FakeWorker()
    ingress = Ingress({"m": worker, "n": FakeWorker()}, {})
    app = make_app()
    app.dependency_overrides[current] = lambda: ingress
    r = TestClient(app).post("/v1/rerank", json={"query": "q", "documents": ["a"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    assert worker.requests == []


@pytest.mark.parametrize("path,body,cut,pair", [
    ("/v1/rerank", {}, None, None),
    ("/v1/rerank", {"max_tokens_per_doc": 7}, 7, None),
    ("/v2/rerank", {}, COHERE_DOCUMENT_TOKENS, None),
    ("/v2/rerank", {"max_tokens_per_doc": 7}, 7, None),
    ("/v1/rerank", {"truncate_prompt_tokens": 100}, None, 100),
    ("/rerank", {"truncate_prompt_tokens": -1}, None, -1),
])
def test_document_and_pair_cuts_reach_the_worker(path: str, body: dict, cut: int | None,
                                                  pair: int | None) -> None:
    """Cohere's `max_tokens_per_doc` (4096 on /v2/rerank when not sent, Cohere's default)
    and vLLM's `truncate_prompt_tokens` travel as the Rerank's document and pair cuts."""
    worker = FakeWorker(_play())
    client, _ = _client(worker)
    r = client.post(path, json={"query": "q", "documents": DOCS, **body})
    assert r.status_code == 200, r.text
    (req,) = worker.requests
    assert (req.document_tokens, req.pair_tokens) == (cut, pair)


def test_a_worker_refusal_of_a_cut_names_the_apis_field() -> None:
    reject = FakeStream([[Rejected(status=400, param="pair_tokens", message=(
        "'pair_tokens' is 9000; it must be between 1 and this model's maximum context "
        "length of 512 tokens (or -1: the context)."))]])
    client, _ = _client(FakeWorker(reject))
    r = client.post("/v1/rerank", json={"query": "q", "documents": ["a"],
                                        "truncate_prompt_tokens": 9000})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "truncate_prompt_tokens"
    assert err["message"].startswith("'truncate_prompt_tokens' is 9000")
