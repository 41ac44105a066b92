"""The rerank routes: llama-server's (/rerank, /reranking, /v1/rerank, /v1/reranking),
vLLM's and Jina's (/rerank, /v1/rerank) and Cohere's (/v1/rerank, /v2/rerank), one handler
through the ingress's one request path, errors in OpenAI's shape."""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations.

from fastapi import APIRouter, Request
from starlette.responses import Response

from deployments.errors import error_response
from deployments.ingress import Current
from deployments.rerank.request import rerank_call

router = APIRouter()


@router.post("/rerank")
@router.post("/reranking")
@router.post("/v1/rerank")
@router.post("/v1/reranking")
@router.post("/v2/rerank")
async def rerank(request: Request, ingress: Current) -> Response:
    return await ingress.generate(request, "/v1/rerank", rerank_call, error_response)
