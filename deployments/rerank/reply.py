"""Rerank answers: the worker's scores (actors.rerank.Scores, in the documents' order) as
one JSON object, the shape llama-server, vLLM, Jina and Cohere share: `id`, `model`,
`results` sorted by `relevance_score`, highest first (ties in the documents' order), each
with its `index` in the request's documents and, where asked, its `document: {"text"}`;
`usage: {prompt_tokens, total_tokens}` (every pair's tokens); or vLLM's score answer
(`ScoreReply`): the pairs' scores in their order. Never streamed."""

from __future__ import annotations

import time

import msgspec
from starlette.responses import Response

from actors.events import Failed, Usage
from actors.rerank import Scores
from deployments.errors import ApiError
from deployments.exchange import WholeReply

_encoder = msgspec.json.Encoder()


class _ScoresFold(WholeReply):
    """What every rerank and score reply collects of the events: the Scores and Usage."""

    def __init__(self) -> None:
        self.result: Scores | None = None
        self.usage: Usage | None = None

    def fold(self, batch: list) -> None:
        for ev in batch:
            if isinstance(ev, Scores):
                self.result = ev
            elif isinstance(ev, Usage):
                self.usage = ev
            elif isinstance(ev, Failed):
                raise ApiError(503, ev.message, type="server_error")

    def scores(self, count: int) -> Scores:
        """The worker's Scores, `count` of them (else a 503)."""
        r = self.result
        if r is None or len(r.scores) != count:
            raise ApiError(503, "The model worker ended without the scores.",
                           type="server_error")
        return r

    def tokens(self) -> int:
        """Every pair's tokens (the Usage's count, else the Scores')."""
        return self.usage.prompt_tokens if self.usage else sum(self.result.tokens)


class RerankReply(_ScoresFold):
    """A rerank request's answer.

    Args:
        request_id: the answer's `id`.
        model: the model as the client named it.
        documents: the request's documents' texts (for `return_documents`).
        top_n: the best this many results (None: all).
        return_documents: each result with its document.
        tei: Hugging Face TEI's answer instead: a list of `{"index", "score"}` (with
            `"text"` where `return_documents`), sorted alike.
    """

    def __init__(self, request_id: str, model: str, documents: list[str], *,
                 top_n: int | None = None, return_documents: bool = True,
                 tei: bool = False) -> None:
        super().__init__()
        self.request_id, self.model, self.documents = request_id, model, documents
        self.top_n, self.return_documents, self.tei = top_n, return_documents, tei

    def answer(self) -> Response:
        r = self.scores(len(self.documents))
        order = sorted(range(len(r.scores)), key=lambda i: -r.scores[i])  # stable: ties
        if self.tei:
            return Response(_encoder.encode([
                {"index": i, "score": r.scores[i],
                 **({"text": self.documents[i]} if self.return_documents else {})}
                for i in order[:self.top_n]]), media_type=self.media_type)
        results = []
        for i in order[:self.top_n]:
            item = {"index": i, "relevance_score": r.scores[i]}
            if self.return_documents:
                item["document"] = {"text": self.documents[i]}
            results.append(item)
        tokens = self.tokens()
        body = {"id": self.request_id, "model": self.model, "results": results,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
        return Response(_encoder.encode(body), media_type=self.media_type)


class ScoreReply(_ScoresFold):
    """vLLM's score answer: `{"id", "object": "list", "created", "model", "data", "usage"}`,
    `data` each pair's `{"index", "object": "score", "score"}` in the pairs' order (not
    sorted), `usage` vLLM's UsageInfo (every pair's tokens as `prompt_tokens`).

    Args:
        request_id: the answer's `id`.
        model: the model as the client named it.
        pairs: how many pairs were scored.
    """

    def __init__(self, request_id: str, model: str, pairs: int) -> None:
        super().__init__()
        self.request_id, self.model, self.pairs = request_id, model, pairs
        self.created = int(time.time())

    def answer(self) -> Response:
        r = self.scores(self.pairs)
        tokens = self.tokens()
        body = {"id": self.request_id, "object": "list", "created": self.created,
                "model": self.model,
                "data": [{"index": i, "object": "score", "score": s}
                         for i, s in enumerate(r.scores)],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens,
                          "completion_tokens": 0, "prompt_tokens_details": None}}
        return Response(_encoder.encode(body), media_type=self.media_type)
