"""Rerank through HTTP on the shared Serve instance: a random BERT cross-encoder ranks the
documents as transformers scores them (sigmoid of its logits), on every path (llama-server's,
vLLM's, Jina's, Cohere's), with `top_n` and `return_documents`; what a client sees of bad
input and of models that do not rerank (OpenAI's error shape, the field named); Cohere's
own client pointed at the server; vLLM's /v1/score and the cuts (`truncate_prompt_tokens`,
`max_tokens_per_doc`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.integration.conftest import RERANKER

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

QUERY = "where did the cat sit?"
DOCUMENTS = ["The cat sat on the mat.", "Stocks fell sharply today.", "a",
             "the cat and the dog sat on the mat; the cat slept", "It rained in Oslo."]


@pytest.fixture(scope="module")
def oracle(reranker_dir: Path):
    """transformers' scores of pairs as tokenized with `kw` (sigmoid of the logits: the
    config names no activation) and their token counts; and its tokenizer."""
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(reranker_dir))
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        str(reranker_dir)).eval()

    def score(documents: list[str], **kw) -> dict:
        enc = [tok(QUERY, d, return_tensors="pt", **kw) for d in documents]
        with torch.no_grad():
            logits = np.array([model(**e).logits[0, 0].item() for e in enc])
        return {"scores": 1 / (1 + np.exp(-logits)),
                "tokens": sum(int(e["input_ids"].shape[1]) for e in enc)}
    score.tokenizer = tok
    return score


@pytest.fixture(scope="module")
def expected(oracle) -> dict:
    return oracle(DOCUMENTS)


def _error(r) -> dict:
    assert r.status_code in (400, 404), r.text
    return r.json()["error"]


def test_results_rank_as_transformers_scores(client, expected) -> None:
    r = client.post("/v1/rerank", json={"model": RERANKER, "query": QUERY,
                                        "documents": DOCUMENTS})
    assert r.status_code == 200, r.text
    body = r.json()
    order = [int(i) for i in np.argsort(-expected["scores"], kind="stable")]
    assert [x["index"] for x in body["results"]] == order
    np.testing.assert_allclose([x["relevance_score"] for x in body["results"]],
                               expected["scores"][order], rtol=0, atol=1e-4)
    assert [x["document"]["text"] for x in body["results"]] == [DOCUMENTS[i] for i in order]
    assert body["usage"] == {"prompt_tokens": expected["tokens"],
                             "total_tokens": expected["tokens"]}
    assert body["model"] == RERANKER and body["id"].startswith("rerank-")
    # llama-server's alias, Cohere's v2 path, top_n and no documents: the same ranking, cut
    for path in ("/v1/reranking", "/v2/rerank", "/rerank"):
        cut = client.post(path, json={"model": RERANKER, "query": QUERY,
                                      "documents": [{"text": d} for d in DOCUMENTS],
                                      "top_n": 2, "return_documents": False}).json()
        assert [x["index"] for x in cut["results"]] == order[:2]
        assert all(set(x) == {"index", "relevance_score"} for x in cut["results"])
    # Hugging Face TEI's body and answer: the same ranking
    tei = client.post("/rerank", json={"model": RERANKER, "query": QUERY, "texts": DOCUMENTS})
    assert [x["index"] for x in tei.json()] == order


def test_vllm_score_and_the_document_and_pair_cuts(client, expected, oracle) -> None:
    """vLLM's /v1/score (1:N and N:N, the scores in the pairs' order), vLLM's
    `truncate_prompt_tokens` (transformers' scores of the pairs cut to k, the document's
    end) and Cohere's `max_tokens_per_doc` (each document's first N tokens)."""
    r = client.post("/v1/score", json={"model": RERANKER, "text_1": QUERY,
                                       "text_2": DOCUMENTS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["id"].startswith("score-")
    assert [x["index"] for x in body["data"]] == list(range(len(DOCUMENTS)))
    np.testing.assert_allclose([x["score"] for x in body["data"]], expected["scores"],
                               rtol=0, atol=1e-4)
    assert body["usage"]["prompt_tokens"] == expected["tokens"]
    many = client.post("/score", json={"model": RERANKER, "queries": [QUERY] * 5,
                                       "documents": DOCUMENTS}).json()
    np.testing.assert_allclose([x["score"] for x in many["data"]], expected["scores"],
                               rtol=0, atol=1e-4)
    tok = oracle.tokenizer
    k = len(tok(QUERY, "")["input_ids"]) + 4  # room for 4 tokens of a document
    cut = oracle(DOCUMENTS, truncation="only_second", max_length=k)
    for path in ("/v1/score", "/v1/rerank"):
        sides = ({"text_1": QUERY, "text_2": DOCUMENTS} if path == "/v1/score"
                 else {"query": QUERY, "documents": DOCUMENTS})
        r = client.post(path, json={"model": RERANKER, "truncate_prompt_tokens": k, **sides})
        assert r.status_code == 200, r.text
        got = (sorted(r.json()["results"], key=lambda x: x["index"])
               if path == "/v1/rerank" else r.json()["data"])
        np.testing.assert_allclose([x.get("score", x.get("relevance_score")) for x in got],
                                   cut["scores"], rtol=0, atol=1e-4)
        assert r.json()["usage"]["prompt_tokens"] == cut["tokens"]
    starts = [d[:tok(d, add_special_tokens=False, return_offsets_mapping=True)
                 ["offset_mapping"][:2][-1][1]] for d in DOCUMENTS]
    r = client.post("/v2/rerank", json={"model": RERANKER, "query": QUERY,
                                        "documents": DOCUMENTS, "max_tokens_per_doc": 2})
    got = sorted(r.json()["results"], key=lambda x: x["index"])
    np.testing.assert_allclose([x["relevance_score"] for x in got],
                               oracle(starts)["scores"], rtol=0, atol=1e-4)
    err = _error(client.post("/v1/score", json={"model": RERANKER, "text_1": [QUERY] * 2,
                                                "text_2": DOCUMENTS}))
    assert err["param"] == "text_2"
    err = _error(client.post("/v1/score", json={"model": RERANKER, "text_1": QUERY,
                                                "text_2": ["ok"],
                                                "truncate_prompt_tokens": 10**6}))
    assert err["param"] == "truncate_prompt_tokens"


def test_bad_input_and_models_that_do_not_rerank(client) -> None:
    body = {"model": RERANKER, "query": QUERY}
    err = _error(client.post("/v1/rerank", json={**body, "documents": []}))
    assert err["param"] == "documents"
    err = _error(client.post("/v1/rerank", json={**body, "documents": ["ok", 7]}))
    assert err["param"] == "documents[1]"
    err = _error(client.post("/v1/rerank", json={**body, "query": "cat " * 200,
                                                 "documents": ["ok"]}))
    assert err["param"] == "query" and err["code"] == "context_length_exceeded"
    # a document past the context is cut to fit (as CrossEncoder and Cohere cut it)
    r = client.post("/v1/rerank", json={**body, "documents": ["ok", "cat " * 200]})
    assert r.status_code == 200 and len(r.json()["results"]) == 2
    err = _error(client.post("/v1/rerank", json={**body, "model": "nope",
                                                 "documents": ["ok"]}))
    assert err["code"] == "model_not_found"
    for model, words in (("smollm2-135m", "a generation model"),
                         ("bert-tiny", "an embedding model")):
        err = _error(client.post("/v1/rerank", json={**body, "model": model,
                                                     "documents": ["ok"]}))
        assert err["param"] == "model" and words in err["message"]


def test_a_reranker_does_not_chat_or_embed(client) -> None:
    chat = client.post("/v1/chat/completions", json={
        "model": RERANKER, "messages": [{"role": "user", "content": "hi"}]})
    embed = client.post("/v1/embeddings", json={"model": RERANKER, "input": "hi"})
    for r in (chat, embed):
        err = _error(r)
        assert err["param"] == "model" and "is a reranker" in err["message"]
    # what it serves, as Ollama's /api/show lists it
    show = client.post("/api/show", json={"model": RERANKER})
    assert show.status_code == 200 and show.json()["capabilities"] == ["rerank"]
    cards = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert cards[RERANKER]["capabilities"] == ["rerank"]
    assert cards["bert-tiny"]["capabilities"] == ["embedding"]
    assert "completion" in cards["flm-tiny"]["capabilities"]


def test_cohere_client(serve_url, expected) -> None:
    """Cohere's SDK (v1 and v2 clients) with its base URL set to the server."""
    import cohere

    order = [int(i) for i in np.argsort(-expected["scores"], kind="stable")]
    v2 = cohere.ClientV2(base_url=serve_url, api_key="unused", timeout=120)
    r = v2.rerank(model=RERANKER, query=QUERY, documents=DOCUMENTS, top_n=3)
    assert [x.index for x in r.results] == order[:3]
    np.testing.assert_allclose([x.relevance_score for x in r.results],
                               expected["scores"][order[:3]], rtol=0, atol=1e-4)
    v1 = cohere.Client(base_url=serve_url, api_key="unused", timeout=120)
    r = v1.rerank(model=RERANKER, query=QUERY, documents=DOCUMENTS, return_documents=True)
    assert [x.document.text for x in r.results] == [DOCUMENTS[i] for i in order]
    with pytest.raises(cohere.errors.BadRequestError):
        v2.rerank(model=RERANKER, query=QUERY, documents=[])
