"""vLLM's score API (`POST /score`, `/v1/score`): pairs of texts scored by a reranker, on
the rerank path (one Rerank: actors.rerank), answered in vLLM's shape (reply.ScoreReply).

The pairs' two sides, as vLLM names them (the first complete pair of names wins, in vLLM's
order): `queries` and `documents`, `queries` and `items`, `data_1` and `data_2`, `text_1`
and `text_2`; each a string or a list of strings (vLLM's multimodal `{"content": [...]}` is
a 400). vLLM pairs them 1:1, 1:N (the one first text with each second) or N:N (the i-th with
the i-th); other lengths, an empty list or more than MAX_DOCUMENTS pairs are a 400 naming
the field. `truncate_prompt_tokens` cuts each pair to that many tokens (-1: the context), as
on /v1/rerank; `use_activation: false` (the raw logits) is a 400. `model` is optional where
the server serves one model.
"""

from __future__ import annotations

import uuid

import msgspec

from actors.rerank import Rerank
from deployments.body import decode_json
from deployments.errors import ApiError
from deployments.exchange import Call
from deployments.ingress import Ingress
from deployments.rerank.reply import ScoreReply
from deployments.rerank.request import MAX_DOCUMENTS, PARAMS, Truncation

# vLLM's names for the pairs' two sides, in the order its request types are tried
SIDES = (("queries", "documents"), ("queries", "items"), ("data_1", "data_2"),
         ("text_1", "text_2"))

Texts = str | list[str]


class ScoreIn(msgspec.Struct, kw_only=True):
    """A score body: one pair of the SIDES, and vLLM's options."""

    model: str | None = None
    text_1: Texts | None = None
    text_2: Texts | None = None
    queries: Texts | None = None
    documents: Texts | None = None
    items: Texts | None = None
    data_1: Texts | None = None
    data_2: Texts | None = None
    truncate_prompt_tokens: Truncation | None = None
    use_activation: bool | None = None


def _sides(req: ScoreIn) -> tuple[str, list[str], str, list[str]]:
    """The first complete pair of SIDES, each side's name and its texts as a list."""
    for first, second in SIDES:
        one, two = getattr(req, first), getattr(req, second)
        if one is not None and two is not None:
            return (first, [one] if isinstance(one, str) else one,
                    second, [two] if isinstance(two, str) else two)
    sent = next((name for pair in SIDES for name in pair
                 if getattr(req, name) is not None), None)
    missing = next((b if a == sent else a for a, b in SIDES if sent in (a, b)), "text_1")
    raise ApiError(400, f"'{missing}' is missing: send the texts to score as 'text_1' and "
                        "'text_2' (or 'queries' and 'documents', or 'data_1' and 'data_2').",
                   param=missing)


def score_call(body: bytes, ingress: Ingress) -> Call:
    """A score request's Call: its pairs as one Rerank (the first text, or each pair's).

    Raises:
        ApiError: 400 naming the field (see the module's docstring); 404 an unknown model.
    """
    req = decode_json(body, ScoreIn)
    first, ones, second, twos = _sides(req)
    for name, texts in ((first, ones), (second, twos)):
        if not texts:
            raise ApiError(400, f"'{name}' is empty: send at least one text.", param=name)
    if len(ones) > 1 and len(ones) != len(twos):
        raise ApiError(400, f"'{first}' holds {len(ones)} texts and '{second}' "
                            f"{len(twos)}: send one '{first}' text (scored against each of "
                            f"'{second}') or as many as '{second}' holds (pairwise).",
                       param=second)
    if len(twos) > MAX_DOCUMENTS:
        raise ApiError(400, f"'{second}' holds {len(twos)} texts; at most {MAX_DOCUMENTS} "
                            "pairs are allowed.", param=second)
    if req.use_activation is False:
        raise ApiError(400, "'use_activation: false' is not supported: the scores are the "
                            "model's logits through its activation (sigmoid unless its "
                            "config names another).", param="use_activation")
    model = ingress.served(req.model)
    request_id = f"score-{uuid.uuid4().hex}"
    rerank = Rerank(request_id=request_id, query=ones[0] if len(ones) == 1 else ones,
                    documents=twos, pair_tokens=req.truncate_prompt_tokens)
    return Call(model=model, request=rerank,
                reply=ScoreReply(request_id, req.model or model, len(twos)),
                params={**PARAMS, "query": first, "documents": second})
