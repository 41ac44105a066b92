"""Rerank requests in the worker: a query scored against each document by a reranker
(npu.engine.pooling's "rank" head), each query-document pair one input of the embedding
forward (actors.embedding: the same steps between the chats', in the same bounded share of
their time); a pair's score is the model's one output. A cross-encoder's pair is the two
texts as its tokenizer pairs them; a decoder reranker's (Qwen3-Reranker) is its prompt with
the query, the document and the instruction written in (`decoder_pairs`: llama-server's
format_prompt_rerank fills the GGUF file's rerank template alike, in one pass here, so text
in a query that looks like a slot stays text). A Rerank may give each document its own
query (vLLM's score API, N:N), cut each document to its first tokens (Cohere's
`max_tokens_per_doc`) and each pair to fewer tokens than the context (vLLM's
`truncate_prompt_tokens`).

A `Rerank` goes through the worker's `generate` as an embedding request does: Rejected
alone, or Accepted, one `Scores` (in the documents' order: the ingress sorts them) and Usage.
`build_job` also refuses what a model does not serve: a reranker asked to embed, an
embedding or generation model asked to rerank (and `rerank_only` words a reranker's refusal
of chat and completions).
"""

from __future__ import annotations

import re

import msgspec

from actors.embedding import EmbedJob, build_embedding
from actors.errors import RequestError
from actors.events import EmbedGenerate, Event, Usage
from npu import Model
from npu.engine.pooling import RANK
from npu.load.pooling import RERANK_INSTRUCTION

# what a reranker is, for the refusals that name it
RERANKERS = ("a cross-encoder: a *ForSequenceClassification checkpoint with one label, or a "
             "GGUF file with pooling_type 4; or a decoder reranker such as Qwen3-Reranker")
SLOT = re.compile(r"\{(query|document|instruction)\}")


class Rerank(msgspec.Struct, kw_only=True, tag="rerank"):
    """A query and the documents to score against it, each document paired with the query
    (`query` first, as cross-encoders are trained: [CLS] query [SEP] document [SEP]).

    Attributes:
        query: the query; or a list, each document's own (as many as the documents: vLLM's
            score API pairs text_1[i] with text_2[i]).
        instruction: a decoder reranker's task, written into its prompt (None: the model
            card's, RERANK_INSTRUCTION); a cross-encoder takes none.
        document_tokens: each document cut to this many of its own tokens before it is
            paired (Cohere's `max_tokens_per_doc`); None: uncut.
        pair_tokens: each pair (a decoder reranker's prompt) cut to this many tokens as the
            context cuts it, the document's end first (vLLM's `truncate_prompt_tokens`; -1:
            the context); None: the context.
    """

    request_id: str
    query: str | list[str]
    documents: list[str] = msgspec.field(default_factory=list)
    instruction: str | None = None
    document_tokens: int | None = None
    pair_tokens: int | None = None


class Scores(msgspec.Struct, tag="scores", tag_field="event"):
    """A Rerank's answer: each document's relevance score, in the documents' order (the
    model's output through its activation, npu.load.pooling), and each pair's token count."""

    scores: list[float]
    tokens: list[int]


class RerankJob(EmbedJob):
    """A Rerank in the worker: its pairs' token ids and types, their scores as computed."""

    __slots__ = ()

    def answer(self) -> list[Event]:
        return [Scores(scores=[float(s) for s in self.vectors[:, 0]],
                       tokens=[len(x) for x in self.ids]),
                Usage(prompt_tokens=self.tokens, completion_tokens=0)]


def is_reranker(model: Model) -> bool:
    """Whether `model` scores pairs (its pooling is a classification head)."""
    return model.pooling == RANK


def rerank_only(model: Model) -> str:
    """The refusal of a request a reranker does not serve (chat, completions, embeddings)."""
    return (f"The model '{model.name}' is a reranker ({RERANKERS}): it scores documents "
            "against a query (/v1/rerank), it does not generate or embed.")


def build_rerank(request: Rerank, model: Model) -> RerankJob:
    """The request's query-document pairs as token ids and types, checked against the model:
    a document is cut to `document_tokens` of its own tokens where asked, then at its end
    where its pair would pass the model's context (or `pair_tokens`), as
    sentence-transformers' CrossEncoder and Cohere's rerank cut it; a query never is.

    Raises:
        RequestError: the model does not rerank (`model`), there are no documents, a
            query list not one a document (`query`), a cut the model cannot make
            (`document_tokens`, `pair_tokens`), or a query (`query`) that leaves no room
            for a document in the model's context (or `pair_tokens`).
    """
    if not is_reranker(model):
        raise RequestError(f"The model '{model.name}' is {model.role}: it does not rerank "
                           f"(a reranker is {RERANKERS}).", param="model")
    if not request.documents:
        raise RequestError("'documents' holds no documents.", param="documents")
    queries = _queries(request)
    documents = _cut_documents(request, model)
    limit = _pair_limit(request.pair_tokens, model.context_length)
    if model.rerank_prompt is not None:
        return decoder_pairs(request, model, queries, documents, limit)
    if request.instruction is not None:
        raise RequestError(f"The model '{model.name}' is a cross-encoder: it takes no "
                           "instruction (a decoder reranker such as Qwen3-Reranker does).",
                           param="instruction")
    tok = model.tokenizer
    pairs: list[tuple[list[int], list[int]]] = [([], [])] * len(documents)
    groups: dict[str, list[int]] = {}
    for i, query in enumerate(queries):
        groups.setdefault(query, []).append(i)
    for query, rows in groups.items():  # each query tokenized once, with its documents
        least = tok.encode_pairs(query, [""])[0][0]  # the query with the pair's specials
        _check_query(len(least) + 1, limit, model.context_length,
                     "with the pair's special tokens and a document")
        for i, pair in zip(rows, tok.encode_pairs(query, [documents[i] for i in rows],
                                                  limit=limit)):
            pairs[i] = pair
    # a model of one token type (XLM-RoBERTa) reads every token as type 0
    types = [t for _, t in pairs] if model.config.type_vocab_size > 1 else None
    return RerankJob(request, [ids for ids, _ in pairs], model.embedding_dims, types)


def _queries(request: Rerank) -> list[str]:
    """Each document's query."""
    if isinstance(request.query, str):
        return [request.query] * len(request.documents)
    if len(request.query) != len(request.documents):
        raise RequestError(f"'query' holds {len(request.query)} queries for "
                           f"{len(request.documents)} documents: send one query, or one a "
                           "document.", param="query")
    return list(request.query)


def _cut_documents(request: Rerank, model: Model) -> list[str]:
    """The documents, each cut at a token's end to `document_tokens` of its own tokens."""
    n = request.document_tokens
    if n is None:
        return list(request.documents)
    if n < 1:
        raise RequestError(f"'document_tokens' is {n}; it must be at least 1.",
                           param="document_tokens")
    return [model.tokenizer.text_prefix(d, n) for d in request.documents]


def _pair_limit(pair_tokens: int | None, context: int) -> int:
    """The most tokens of a pair: `pair_tokens` (-1 or None: the context).

    Raises:
        RequestError: `pair_tokens` below -1, 0, or more than the context.
    """
    if pair_tokens is None or pair_tokens == -1:
        return context
    if not 1 <= pair_tokens <= context:
        raise RequestError(f"'pair_tokens' is {pair_tokens}; it must be between 1 and this "
                           f"model's maximum context length of {context} tokens (or -1: the "
                           "context).", param="pair_tokens")
    return pair_tokens


def decoder_pairs(request: Rerank, model: Model, queries: list[str], documents: list[str],
                  limit: int) -> RerankJob:
    """A decoder reranker's job: each document's prompt (the model's, its slots filled with
    its query, the document and the instruction) as the ids a generation prompt has (BOS
    where the tokenizer adds one; special-token text is those tokens, as in llama-server
    and the model card's tokenization).

    A document whose prompt would pass `limit` (the context, or `pair_tokens`) is cut at
    its end (at a token's end, never inside a character) until the prompt fits.

    Raises:
        RequestError: an instruction the model's prompt has no slot for (`instruction`), or
            a query (`query`) that leaves no room for a document within `limit`.
    """
    prompt = model.rerank_prompt
    if request.instruction is not None and "{instruction}" not in prompt:
        raise RequestError(f"The model '{model.name}' has a rerank prompt without an "
                           "instruction in it (its GGUF file's own): it takes no instruction.",
                           param="instruction")
    instruction = RERANK_INSTRUCTION if request.instruction is None else request.instruction

    def ids(query: str, document: str) -> list[int]:
        values = {"query": query, "document": document, "instruction": instruction}
        return model.prompt_ids(SLOT.sub(lambda m: values[m[1]], prompt))

    def fitted(query: str, document: str) -> list[int]:
        """The prompt's ids, the document cut at its end where they would pass the
        limit: by the tokens over, then again while the prompt's tokens at the cut (which
        may merge across it) still pass; each pass shortens the document."""
        out = ids(query, document)
        tok = model.tokenizer
        while len(out) > limit and document:
            keep = len(tok.encode(document)) - (len(out) - limit)
            shorter = tok.text_prefix(document, keep)
            document = shorter if len(shorter) < len(document) else document[:-1]
            out = ids(query, document)
        return out

    how = ("with the instruction " if request.instruction is not None else "") + \
        "in the model's rerank prompt and a document"
    for query in dict.fromkeys(queries):
        _check_query(len(ids(query, "")) + 1, limit, model.context_length, how)
    return RerankJob(request, [fitted(q, d) for q, d in zip(queries, documents)],
                     model.embedding_dims)


def _check_query(tokens: int, limit: int, context: int, how: str) -> None:
    """A query of `tokens` (with what a pair adds) against `limit`, the context or the
    asked `pair_tokens` (then named where the query fits the context)."""
    if tokens <= limit:
        return
    if tokens <= context:
        raise RequestError(f"The query has {tokens} tokens {how}; 'pair_tokens' keeps "
                           f"{limit} tokens of each pair: ask for more (at most this model's "
                           f"maximum context length, {context}).", param="pair_tokens")
    raise RequestError(f"The query has {tokens} tokens {how}; this model's maximum "
                       f"context length is {context} tokens.", param="query",
                       code="context_length_exceeded")


def build_job(request: EmbedGenerate | Rerank, model: Model) -> EmbedJob:
    """The worker's job for an embedding or rerank request, where `model` serves it.

    Raises:
        RequestError: the model does not serve the request (`model`), or its inputs are
            refused (`build_embedding`, `build_rerank`).
    """
    if isinstance(request, Rerank):
        return build_rerank(request, model)
    if is_reranker(model):
        raise RequestError(rerank_only(model), param="model")
    return build_embedding(request, model)
