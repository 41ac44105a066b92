"""The embedding routes: OpenAI's (errors in OpenAI's shape), Ollama's (in Ollama's) and
llama-server's /embedding and /embeddings (in llama-server's), each through the ingress's
one request path."""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations.

from fastapi import APIRouter, Request
from starlette.responses import Response

from deployments.embeddings.request import (
    embed_call,
    embeddings_call,
    llama_call,
    openai_call,
)
from deployments.errors import error_response, llama_error_response, ollama_error_response
from deployments.ingress import Current

router = APIRouter()


@router.post("/v1/embeddings")
async def embeddings(request: Request, ingress: Current) -> Response:
    return await ingress.generate(request, "/v1/embeddings", openai_call, error_response)


@router.post("/api/embed")
async def ollama_embed(request: Request, ingress: Current) -> Response:
    return await ingress.generate(request, "/api/embed", embed_call, ollama_error_response)


@router.post("/api/embeddings")
async def ollama_embeddings(request: Request, ingress: Current) -> Response:
    return await ingress.generate(request, "/api/embeddings", embeddings_call,
                                  ollama_error_response)


@router.post("/embedding")
@router.post("/embeddings")
async def llama_embedding(request: Request, ingress: Current) -> Response:
    return await ingress.generate(request, "/embedding", llama_call, llama_error_response)
