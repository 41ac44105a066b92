"""The rerank routes: llama-server's (/rerank, /reranking, /v1/rerank, /v1/reranking),
vLLM's and Jina's (/rerank, /v1/rerank), Cohere's (/v1/rerank, /v2/rerank) and vLLM's score
API (/score, /v1/score), each through the ingress's one request path, errors in OpenAI's
shape."""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations.

from fastapi import APIRouter, Request
from starlette.responses import Response

from deployments.errors import error_response
from deployments.ingress import Current
from deployments.rerank.request import cohere_v2_call, rerank_call
from deployments.rerank.score import score_call

router = APIRouter()


@router.post("/rerank")
@router.post("/reranking")
@router.post("/v1/rerank")
@router.post("/v1/reranking")
async def rerank(request: Request, ingress: Current) -> Response:
    return await ingress.generate(request, "/v1/rerank", rerank_call, error_response)


@router.post("/v2/rerank")
async def rerank_v2(request: Request, ingress: Current) -> Response:
    return await ingress.generate(request, "/v1/rerank", cohere_v2_call, error_response)


@router.post("/score")
@router.post("/v1/score")
async def score(request: Request, ingress: Current) -> Response:
    return await ingress.generate(request, "/v1/score", score_call, error_response)
