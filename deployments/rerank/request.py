"""Rerank requests, one shape on every path (llama-server's, vLLM's, Jina's and Cohere's
bodies are the same fields): `query`, `documents` (strings, or Cohere's and Jina's
`{"text": ...}` objects), `top_n`, `return_documents`, `instruction` (a decoder reranker's
task), `model` (optional where the server serves one model, as llama-server's and vLLM's; a
name it does not serve is a 404); or Hugging Face TEI's (`texts`, `return_text`), answered
in TEI's shape. Cohere's `max_tokens_per_doc` cuts each document to that many of its own
tokens before it is paired (on /v2/rerank 4096 when not sent, Cohere's default); vLLM's
`truncate_prompt_tokens` cuts each pair to that many tokens (-1: the context) as the context
cuts it, the document's end first. Cohere's `max_chunks_per_doc` and `rank_fields` are not
read.

Checked here: the types, an empty query or document list, `top_n` below 0, more than
MAX_DOCUMENTS documents, `max_tokens_per_doc` below 1, `truncate_prompt_tokens` below -1
and TEI's `raw_scores: true` (a 400 naming the field); by the worker, against the model: a
query that leaves no room for a document (`query`), a `truncate_prompt_tokens` of 0 or past
the context, a model that does not rerank (`model`).
"""

from __future__ import annotations

import uuid
from typing import Annotated

import msgspec

from actors.rerank import Rerank
from deployments.body import decode_json
from deployments.errors import ApiError
from deployments.exchange import Call
from deployments.ingress import Ingress
from deployments.rerank.reply import RerankReply

# the most documents one request may carry (as /v1/embeddings' inputs)
MAX_DOCUMENTS = 2048
# Cohere's default `max_tokens_per_doc` (its v2 API's)
COHERE_DOCUMENT_TOKENS = 4096
# the worker's names for the fields it may refuse, as the rerank APIs name them
PARAMS = {"document_tokens": "max_tokens_per_doc", "pair_tokens": "truncate_prompt_tokens"}
# vLLM's `truncate_prompt_tokens` (its own bound: -1 is the context; 0 and past the context
# are refused by the worker, which knows it)
Truncation = Annotated[int, msgspec.Meta(ge=-1)]


class TextIn(msgspec.Struct):
    """Cohere's and Jina's document (or query) object."""

    text: str


class RerankIn(msgspec.Struct, kw_only=True):
    """A rerank body.

    Attributes:
        top_n: the best this many results (None, or 0 as vLLM's default: every document;
            more than there are: every document).
        return_documents: each result with its `document: {"text": ...}` (default true, as
            vLLM and Jina answer; llama-server never sends them, Cohere's v1 when asked).
        instruction: a decoder reranker's task (Qwen3-Reranker's `<Instruct>`, the
            `instruction` of its model card's format; default: its model card's).
        texts, return_text, raw_scores, truncate: Hugging Face TEI's body (llama-server
            takes it too), `texts` for `documents`: the answer is TEI's, a list of
            `{"index", "score"}` (`"text"` with `return_text`); `raw_scores: true` (the
            logits before the activation) is a 400; a text past the context is cut whatever
            `truncate` says.
        max_tokens_per_doc: Cohere's: each document cut to this many of its own tokens.
        truncate_prompt_tokens: vLLM's: each pair cut to this many tokens (-1: the context).
    """

    query: str | TextIn
    documents: list[str | TextIn] | None = None
    texts: list[str] | None = None
    model: str | None = None
    top_n: int | None = None
    return_documents: bool | None = None
    instruction: str | None = None
    return_text: bool = False
    raw_scores: bool = False
    truncate: bool | None = None
    max_tokens_per_doc: int | None = None
    truncate_prompt_tokens: Truncation | None = None


def _text(value: str | TextIn) -> str:
    return value.text if isinstance(value, TextIn) else value


def rerank_call(body: bytes, ingress: Ingress, *,
                document_tokens: int | None = None) -> Call:
    """A rerank request's Call (every rerank path's). `document_tokens`: the
    `max_tokens_per_doc` of a body that sends none (Cohere's v2: COHERE_DOCUMENT_TOKENS).

    Raises:
        ApiError: 400 naming the field (see the module's docstring); 404 an unknown model.
    """
    req = decode_json(body, RerankIn)
    query = _text(req.query)
    if not query:
        raise ApiError(400, "'query' is empty.", param="query")
    tei = req.texts is not None and req.documents is None  # TEI's body
    field = "texts" if tei else "documents"
    given = req.texts if tei else req.documents
    if not given:
        raise ApiError(400, f"'{field}' is empty: send at least one document.", param=field)
    if len(given) > MAX_DOCUMENTS:
        raise ApiError(400, f"'{field}' holds {len(given)} documents; at most "
                            f"{MAX_DOCUMENTS} are allowed.", param=field)
    if req.raw_scores:
        raise ApiError(400, "'raw_scores' is not supported: the scores are the model's "
                            "logits through its activation (sigmoid unless its config names "
                            "another).", param="raw_scores")
    if req.max_tokens_per_doc is not None and req.max_tokens_per_doc < 1:
        raise ApiError(400, f"'max_tokens_per_doc' must be at least 1; got "
                            f"{req.max_tokens_per_doc}.", param="max_tokens_per_doc")
    if req.top_n is not None and req.top_n < 0:
        raise ApiError(400, f"'top_n' must be at least 1 (0 or none: every document); got "
                            f"{req.top_n}.", param="top_n")
    model = ingress.served(req.model)
    documents = [_text(d) for d in given]
    request_id = f"rerank-{uuid.uuid4().hex}"
    reply = RerankReply(request_id, req.model or model, documents, top_n=req.top_n or None,
                        return_documents=(req.return_text if tei
                                          else req.return_documents is not False),
                        tei=tei)
    cut = req.max_tokens_per_doc if req.max_tokens_per_doc is not None else document_tokens
    return Call(model=model, request=Rerank(request_id=request_id, query=query,
                                            documents=documents, instruction=req.instruction,
                                            document_tokens=cut,
                                            pair_tokens=req.truncate_prompt_tokens),
                reply=reply, params=PARAMS)


def cohere_v2_call(body: bytes, ingress: Ingress) -> Call:
    """Cohere's /v2/rerank: `rerank_call`, each document cut to COHERE_DOCUMENT_TOKENS of its
    own tokens unless the body's `max_tokens_per_doc` says otherwise."""
    return rerank_call(body, ingress, document_tokens=COHERE_DOCUMENT_TOKENS)
