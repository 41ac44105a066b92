"""Rerank requests in the worker (no Ray): Accepted, the documents' scores in their order
(the engine's scores of the pairs, the same alone or beside others) and Usage; a pair over
the context refused naming the document; and each model refusing what it does not serve:
a reranker chat and embeddings, an embedding or generation model reranking."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from actors.errors import RequestError
from actors.events import Accepted, ChatGenerate, EmbedGenerate, Rejected, Usage
from actors.rerank import Rerank, Scores, build_job, build_rerank
from actors.worker import Worker
from npu import load_model
from tests.bert_model import DIMS, build_reranker

pytestmark = pytest.mark.timeout(60)

QUERY = "where did the cat sit?"
DOCUMENTS = ["The cat sat on the mat.", "Stocks fell sharply today.", "a cat"]


@pytest.fixture(scope="module")
def worker(tmp_path_factory) -> Worker:
    folder = build_reranker(tmp_path_factory.mktemp("rr") / "model")
    w = Worker(lambda: load_model(folder, name="rr"), max_batch=2)
    yield w
    w.close()


async def _events(worker: Worker, request) -> list:
    return [ev async for batch in worker.generate(request) for ev in batch]


def _run(worker: Worker, request) -> list:
    return asyncio.run(_events(worker, request))


def _rerank(worker: Worker, documents: list[str], query: str = QUERY) -> list:
    return _run(worker, Rerank(request_id="r", query=query, documents=documents))


def test_scores_come_in_the_documents_order(worker) -> None:
    events = _rerank(worker, DOCUMENTS)
    assert [type(e) for e in events] == [Accepted, Scores, Usage]
    accepted, scores, usage = events
    pairs = worker.model.tokenizer.encode_pairs(QUERY, DOCUMENTS)
    assert scores.tokens == [len(ids) for ids, _ in pairs]
    assert accepted.prompt_tokens == usage.prompt_tokens == sum(scores.tokens)
    assert usage.completion_tokens == 0
    want = worker.model.engine.embed([p[0] for p in pairs], types=[p[1] for p in pairs])
    np.testing.assert_allclose(scores.scores, want[:, 0], rtol=0, atol=1e-6)
    assert all(0 < s < 1 for s in scores.scores)  # sigmoid: no activation in the config


def test_a_documents_score_is_the_same_alone_or_with_others(worker) -> None:
    alone = _rerank(worker, DOCUMENTS[1:2])[1].scores
    mixed = _rerank(worker, DOCUMENTS)[1].scores

    async def together() -> list:  # three requests in the worker at once
        return await asyncio.gather(*(_events(worker, Rerank(request_id=f"r{i}", query=QUERY,
                                                              documents=[d]))
                                      for i, d in enumerate(DOCUMENTS)))
    side = [events[1].scores[0] for events in asyncio.run(together())]
    np.testing.assert_allclose(alone[0], mixed[1], rtol=0, atol=1e-6)
    np.testing.assert_allclose(side, mixed, rtol=0, atol=1e-6)


def test_a_document_past_the_context_is_cut_and_a_query_past_it_refused(worker) -> None:
    """As sentence-transformers' CrossEncoder and Cohere cut a long document (RAG chunks
    past a 512-token BERT's context): scored as its start that fits; the query is never
    cut."""
    limit = DIMS["max_position_embeddings"]
    long = "cat " * limit
    _, scores, _ = _rerank(worker, ["short", long])
    assert scores.tokens[1] == limit
    fits = len(worker.model.tokenizer.encode_pairs(QUERY, [""])[0][0])
    cut = "cat " * (limit - fits)  # one token a word: exactly the context
    _, same, _ = _rerank(worker, [cut])
    assert same.tokens == [limit]
    np.testing.assert_allclose(scores.scores[1], same.scores[0], rtol=0, atol=1e-6)
    (r,) = _rerank(worker, ["short"], query=long)
    assert isinstance(r, Rejected) and r.status == 400
    assert r.param == "query" and r.code == "context_length_exceeded"
    assert str(limit) in r.message


def test_a_reranker_does_not_chat_or_embed(worker) -> None:
    chat = ChatGenerate(request_id="c", messages=[{"role": "user", "content": "hi"}])
    for request in (chat, EmbedGenerate(request_id="e", inputs=["hi"])):
        (r,) = _run(worker, request)
        assert isinstance(r, Rejected) and r.status == 400 and r.param == "model"
        assert "'rr' is a reranker" in r.message and "/v1/rerank" in r.message
    # Anthropic's count_tokens (and vLLM's /tokenize of messages) render a chat: refused alike
    r = asyncio.run(worker.count_tokens(chat))
    assert isinstance(r, Rejected) and r.param == "model" and "is a reranker" in r.message


@pytest.mark.parametrize("kind,words", [("encoder", "an embedding model"),
                                        ("decoder", "a generation model")])
def test_a_model_that_is_not_a_reranker_does_not_rerank(kind: str, words: str,
                                                         tmp_path) -> None:
    from npu.load.tiny import ensure_tiny
    from tests.bert_model import build_bert

    folder = build_bert(tmp_path / "bert") if kind == "encoder" else ensure_tiny(tmp_path)
    model = load_model(folder, name="m")
    with pytest.raises(RequestError) as exc:
        build_job(Rerank(request_id="r", query="q", documents=["d"]), model)
    assert exc.value.param == "model" and f"'m' is {words}" in exc.value.message
    assert "pooling_type 4" in exc.value.message  # what a reranker is


def test_no_documents_is_refused(worker) -> None:
    with pytest.raises(RequestError) as exc:
        build_rerank(Rerank(request_id="r", query="q"), worker.model)
    assert exc.value.param == "documents"


def _job(worker: Worker, documents: list[str], **kw):
    return build_rerank(Rerank(request_id="r", query=kw.pop("query", QUERY),
                               documents=documents, **kw), worker.model)


def test_document_tokens_cut_each_document_to_its_own_first_tokens(worker) -> None:
    """Cohere's `max_tokens_per_doc`: a document is scored as its first N tokens; a
    shorter one is whole; the context still cuts one whose N tokens do not fit."""
    tok = worker.model.tokenizer
    long = "the cat sat on the mat and looked at the dog " * 3
    job = _job(worker, [long, "a cat"], document_tokens=5)
    want = tok.encode_pairs(QUERY, [tok.text_prefix(long, 5), "a cat"])
    assert job.ids == [ids for ids, _ in want]
    assert len(tok.encode(tok.text_prefix(long, 5))) == 5
    limit = DIMS["max_position_embeddings"]
    (ids,) = _job(worker, ["cat " * (2 * limit)], document_tokens=limit).ids
    assert len(ids) == limit
    with pytest.raises(RequestError) as exc:
        _job(worker, ["a"], document_tokens=0)
    assert exc.value.param == "document_tokens"


def test_pair_tokens_cut_each_pair_as_the_context_does(worker) -> None:
    """vLLM's `truncate_prompt_tokens`: every pair at most k tokens, the document's end cut
    (the query whole); -1 is the context; a k past the context, or one the query does not
    fit in, is refused naming it."""
    tok = worker.model.tokenizer
    limit = DIMS["max_position_embeddings"]
    long = "cat " * limit
    job = _job(worker, [long, "a cat"], pair_tokens=40)
    assert [len(ids) for ids in job.ids] == [40, len(tok.encode_pairs(QUERY, ["a cat"])[0][0])]
    assert job.ids[0] == tok.encode_pairs(QUERY, [long], limit=40)[0][0]
    assert _job(worker, [long], pair_tokens=-1).ids == _job(worker, [long]).ids
    for k in (0, -2, limit + 1):
        with pytest.raises(RequestError) as exc:
            _job(worker, ["a"], pair_tokens=k)
        assert exc.value.param == "pair_tokens" and str(k) in exc.value.message
    with pytest.raises(RequestError) as exc:
        _job(worker, ["a"], pair_tokens=4)
    assert exc.value.param == "pair_tokens" and "'pair_tokens' keeps 4" in exc.value.message


def test_a_query_a_document_scores_each_pair_as_alone(worker) -> None:
    """vLLM's score API N:N: each document with its own query, the scores those pairs get
    one query at a time; a query list not one a document is refused naming `query`."""
    queries = [QUERY, "what fell?", QUERY]
    _, scores, usage = _run(worker, Rerank(request_id="r", query=queries, documents=DOCUMENTS))
    alone = [_rerank(worker, [d], query=q)[1] for q, d in zip(queries, DOCUMENTS)]
    np.testing.assert_allclose(scores.scores, [a.scores[0] for a in alone], rtol=0, atol=1e-6)
    assert scores.tokens == [a.tokens[0] for a in alone]
    assert usage.prompt_tokens == sum(scores.tokens)
    with pytest.raises(RequestError) as exc:
        _job(worker, DOCUMENTS, query=queries[:2])
    assert exc.value.param == "query" and "2 queries for 3 documents" in exc.value.message
