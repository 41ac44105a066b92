"""vLLM's score API without Ray: every spelling of the two sides becomes one Rerank (one
query against many texts, or a query a text), answered in vLLM's shape with the scores in
the pairs' order; bad input is a 400 in OpenAI's shape naming the field before any worker
is asked, and a worker's refusal names the field as the client sent it."""

from __future__ import annotations

import pytest

from actors.events import Accepted, Rejected, Usage
from actors.rerank import Rerank, Scores
from deployments.rerank.request import MAX_DOCUMENTS
from tests.deployments.test_ingress import FakeStream, FakeWorker, _client

TEXTS = ["a cat", "stocks", "the cat sat"]
SCORES = [0.5, 0.1, 0.9]


def _play(scores: list[float] = SCORES) -> FakeStream:
    n = len(scores)
    return FakeStream([[Accepted(request_id="r", model="m", prompt_tokens=6 * n),
                        Scores(scores=scores, tokens=[6] * n),
                        Usage(prompt_tokens=6 * n, completion_tokens=0)]])


@pytest.mark.parametrize("path", ["/score", "/v1/score"])
def test_one_text_against_many_answers_vllms_shape_in_the_pairs_order(path: str) -> None:
    worker = FakeWorker(_play())
    client, _ = _client(worker)
    r = client.post(path, json={"model": "m", "text_1": "cat?", "text_2": TEXTS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["id"].startswith("score-") and body["object"] == "list"
    assert body["model"] == "m" and isinstance(body["created"], int)
    assert body["data"] == [{"index": i, "object": "score", "score": s}
                            for i, s in enumerate(SCORES)]
    assert body["usage"] == {"prompt_tokens": 18, "total_tokens": 18,
                             "completion_tokens": 0, "prompt_tokens_details": None}
    (req,) = worker.requests
    assert req == Rerank(request_id=body["id"], query="cat?", documents=TEXTS)


@pytest.mark.parametrize("first,second", [("text_1", "text_2"), ("queries", "documents"),
                                          ("queries", "items"), ("data_1", "data_2")])
def test_every_spelling_pairs_alike(first: str, second: str) -> None:
    """vLLM's request types: 1:1 (two strings), 1:N, N:N (the i-th with the i-th)."""
    worker = FakeWorker(_play([0.3]), _play(), _play())
    client, _ = _client(worker)
    for one, two in (("q", "d"), (["q"], TEXTS), (["q1", "q2", "q3"], TEXTS)):
        r = client.post("/v1/score", json={first: one, second: two})
        assert r.status_code == 200, r.text
    pair, one_many, many = worker.requests
    assert (pair.query, pair.documents) == ("q", ["d"])
    assert (one_many.query, one_many.documents) == ("q", TEXTS)
    assert (many.query, many.documents) == (["q1", "q2", "q3"], TEXTS)
    assert r.json()["model"] == "m"  # no model where the server serves one


def test_truncate_prompt_tokens_is_the_pair_cut() -> None:
    worker = FakeWorker(_play(), _play())
    client, _ = _client(worker)
    for k in (64, -1):
        client.post("/score", json={"text_1": "q", "text_2": TEXTS,
                                    "truncate_prompt_tokens": k})
    assert [req.pair_tokens for req in worker.requests] == [64, -1]
    assert all(req.document_tokens is None for req in worker.requests)


@pytest.mark.parametrize("body,param", [
    ({}, "text_1"),
    ({"text_1": "q"}, "text_2"),
    ({"queries": "q"}, "documents"),
    ({"items": ["d"]}, "queries"),
    ({"data_2": ["d"]}, "data_1"),
    ({"text_1": [], "text_2": TEXTS}, "text_1"),
    ({"text_1": "q", "text_2": []}, "text_2"),
    ({"text_1": ["a", "b"], "text_2": TEXTS}, "text_2"),
    ({"queries": ["a", "b"], "documents": ["d"]}, "documents"),
    ({"text_1": "q", "text_2": ["d"] * (MAX_DOCUMENTS + 1)}, "text_2"),
    ({"text_1": 3, "text_2": TEXTS}, "text_1"),
    ({"text_1": "q", "text_2": ["a", 2]}, "text_2[1]"),
    ({"text_1": "q", "text_2": {"content": [{"type": "text", "text": "d"}]}}, "text_2"),
    ({"text_1": "q", "text_2": TEXTS, "truncate_prompt_tokens": -2},
     "truncate_prompt_tokens"),
    ({"text_1": "q", "text_2": TEXTS, "use_activation": False}, "use_activation"),
    ({"text_1": "q", "text_2": TEXTS, "model": "nope"}, "model"),
])
def test_bad_input_is_a_400_naming_the_field(body: dict, param: str) -> None:
    worker = FakeWorker()
    client, _ = _client(worker)
    r = client.post("/v1/score", json=body)
    assert r.status_code == (404 if param == "model" else 400), r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error"
    assert worker.requests == []


@pytest.mark.parametrize("sent,param", [(("text_1", "text_2"), "text_1"),
                                        (("queries", "documents"), "queries")])
def test_a_worker_refusal_names_the_field_as_sent(sent: tuple[str, str], param: str) -> None:
    reject = FakeStream([[Rejected(status=400, param="query", message=(
        "The query has 600 tokens with the pair's special tokens and a document; this "
        "model's maximum context length is 512 tokens."), code="context_length_exceeded")]])
    client, _ = _client(FakeWorker(reject))
    r = client.post("/score", json={sent[0]: "long " * 600, sent[1]: ["d"]})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == param and err["code"] == "context_length_exceeded"
