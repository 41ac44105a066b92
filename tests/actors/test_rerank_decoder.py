"""A decoder reranker (Qwen3-Reranker) in the worker (no Ray): a Rerank is answered with each
document's P("yes") of its prompt, in the documents' order, and the prompts' token counts;
the instruction is written into the prompt; a prompt over the context is refused naming the
query or the document; it does not chat or embed, it is listed as a reranker; an
instruction is refused by a model whose prompt has no place for one."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from actors.errors import RequestError
from actors.events import Accepted, ChatGenerate, EmbedGenerate, Rejected, Usage
from actors.rerank import Rerank, Scores, build_rerank
from actors.worker import Worker
from npu import load_model
from tests.bert_model import build_reranker
from tests.qwen3_reranker import DIMS, build_qwen3_reranker, write_reranker_gguf

pytestmark = pytest.mark.timeout(60)

QUERY = "where did the cat sit?"
DOCUMENTS = ["The cat sat on the mat.", "Stocks fell sharply today.", "a cat"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_qwen3_reranker(tmp_path_factory.mktemp("qrr") / "hf")


@pytest.fixture(scope="module")
def worker(folder) -> Worker:
    w = Worker(lambda: load_model(folder, name="qrr", rerank=True), max_batch=2)
    yield w
    w.close()


def _run(worker: Worker, request) -> list:
    async def events() -> list:
        return [ev async for batch in worker.generate(request) for ev in batch]
    return asyncio.run(events())


def _rerank(worker: Worker, documents: list[str], query: str = QUERY,
            instruction: str | None = None) -> list:
    return _run(worker, Rerank(request_id="r", query=query, documents=documents,
                               instruction=instruction))


def test_scores_are_each_prompts_p_yes_in_the_documents_order(worker) -> None:
    events = _rerank(worker, DOCUMENTS)
    assert [type(e) for e in events] == [Accepted, Scores, Usage]
    accepted, scores, usage = events
    job = build_rerank(Rerank(request_id="r", query=QUERY, documents=DOCUMENTS), worker.model)
    assert scores.tokens == [len(ids) for ids in job.ids]
    assert accepted.prompt_tokens == usage.prompt_tokens == sum(scores.tokens)
    want = worker.model.engine.embed(job.ids)[:, 0]
    np.testing.assert_allclose(scores.scores, want, rtol=0, atol=1e-6)
    assert all(0 < s < 1 for s in scores.scores)
    # one document alone scores as it does beside the others
    alone = _rerank(worker, DOCUMENTS[1:2])[1].scores
    np.testing.assert_allclose(alone[0], scores.scores[1], rtol=0, atol=1e-6)


def test_the_instruction_changes_the_prompt_and_the_scores(worker) -> None:
    plain = _rerank(worker, DOCUMENTS)[1]
    task = "Given a question about animals, find the sentence that answers it"
    told = _rerank(worker, DOCUMENTS, instruction=task)[1]
    job = build_rerank(Rerank(request_id="r", query=QUERY, documents=DOCUMENTS,
                              instruction=task), worker.model)
    assert told.tokens == [len(ids) for ids in job.ids] and told.tokens != plain.tokens
    assert task in worker.model.tokenizer.decode(job.ids[0], skip_special_tokens=False)
    np.testing.assert_allclose(told.scores, worker.model.engine.embed(job.ids)[:, 0],
                               rtol=0, atol=1e-6)


def test_a_document_past_the_context_is_cut_and_a_query_past_it_refused(worker) -> None:
    """A long document is cut at its end inside the prompt (the prompt's own end, the
    assistant's opening, stays); a query that leaves no room is a 400 naming it."""
    limit = DIMS["max_position_embeddings"]
    long = "cat " * limit
    _, scores, _ = _rerank(worker, ["short", long])
    assert limit - 4 <= scores.tokens[1] <= limit
    job = build_rerank(Rerank(request_id="r", query=QUERY, documents=[long]), worker.model)
    tail = worker.model.tokenizer.decode(job.ids[0], skip_special_tokens=False)
    assert tail.endswith("<think>\n\n</think>\n\n") and "cat cat" in tail
    (r,) = _rerank(worker, ["short"], query=long)
    assert isinstance(r, Rejected) and r.status == 400
    assert r.param == "query" and r.code == "context_length_exceeded"


def test_a_decoder_reranker_does_not_chat_or_embed(worker) -> None:
    chat = ChatGenerate(request_id="c", messages=[{"role": "user", "content": "hi"}])
    for request in (chat, EmbedGenerate(request_id="e", inputs=["hi"])):
        (r,) = _run(worker, request)
        assert isinstance(r, Rejected) and r.status == 400 and r.param == "model"
        assert "'qrr' is a reranker" in r.message and "/v1/rerank" in r.message
    assert not worker.model.generates and worker.model.kind == "decoder"


def test_an_instruction_without_a_place_in_the_prompt_is_refused(folder, tmp_path) -> None:
    own = ("<|im_start|>user\nQuery: {query}\nDocument: {document}<|im_end|>\n"
           "<|im_start|>assistant\n")  # a GGUF's own template, no instruction in it
    model = load_model(write_reranker_gguf(folder, tmp_path / "m.gguf", template=own))
    request = Rerank(request_id="r", query=QUERY, documents=DOCUMENTS, instruction="x")
    with pytest.raises(RequestError) as exc:
        build_rerank(request, model)
    assert exc.value.param == "instruction" and "takes no instruction" in exc.value.message
    job = build_rerank(Rerank(request_id="r", query=QUERY, documents=DOCUMENTS[:1]), model)
    text = model.tokenizer.decode(job.ids[0], skip_special_tokens=False)
    assert text == own.format(query=QUERY, document=DOCUMENTS[0])
    # a query that looks like a slot stays text (the slots are filled in one pass)
    job = build_rerank(Rerank(request_id="r", query="{document}", documents=["d"]), model)
    assert "Query: {document}\n" in model.tokenizer.decode(job.ids[0],
                                                            skip_special_tokens=False)


def test_a_cross_encoder_takes_no_instruction(tmp_path) -> None:
    model = load_model(build_reranker(tmp_path / "bert"), name="ce")
    with pytest.raises(RequestError) as exc:
        build_rerank(Rerank(request_id="r", query="q", documents=["d"], instruction="x"), model)
    assert exc.value.param == "instruction" and "'ce' is a cross-encoder" in exc.value.message


@pytest.mark.timeout(20)
def test_a_cut_inside_a_character_still_ends(worker) -> None:
    """A document whose last character is several byte tokens, one token over the
    context: cut before that character (a cut inside it decoded to U+FFFD, whose own bytes
    are three tokens: the document never got shorter)."""
    import msgspec

    model = worker.model
    for doc in ("ab\ufffd", "x\U0001F600"):
        whole = build_rerank(Rerank(request_id="r", query=QUERY, documents=[doc]), model)
        short = msgspec.structs.replace(model.config, max_position=len(whole.ids[0]) - 1)
        saved, model.config = model.config, short
        try:
            job = build_rerank(Rerank(request_id="r", query=QUERY, documents=[doc]), model)
        finally:
            model.config = saved
        assert len(job.ids[0]) < len(whole.ids[0])


def test_cuts_and_a_query_a_document_reach_the_prompts(worker) -> None:
    """Cohere's document cut (its first N tokens in the prompt), vLLM's pair cut (every
    prompt at most k tokens, the document's end cut, the prompt's end kept) and vLLM's N:N
    score pairs (each prompt with its own query) on a decoder reranker."""
    model, tok = worker.model, worker.model.tokenizer
    long = "the cat sat on the mat " * 8

    def job(documents: list[str], **kw):
        return build_rerank(Rerank(request_id="r", query=kw.pop("query", QUERY),
                                   documents=documents, **kw), model)

    assert job([long], document_tokens=4).ids == job([tok.text_prefix(long, 4)]).ids
    whole = job(["short"]).ids[0]
    (cut,) = job([long], pair_tokens=len(whole) + 3).ids
    assert len(whole) < len(cut) <= len(whole) + 3
    assert tok.decode(cut, skip_special_tokens=False).endswith("<think>\n\n</think>\n\n")
    with pytest.raises(RequestError) as exc:
        job(["d"], pair_tokens=len(whole) - 10)
    assert exc.value.param == "pair_tokens"
    mixed = job(["a cat", "dogs"], query=["what sat?", "what barks?"]).ids
    assert mixed == [job(["a cat"], query="what sat?").ids[0],
                     job(["dogs"], query="what barks?").ids[0]]
    assert "what barks?" in tok.decode(mixed[1], skip_special_tokens=False)
