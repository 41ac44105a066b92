"""llama-server's own completion routes: /completion (also /completions) and /infill,
through the ingress's one request path; errors in OpenAI's shape, as llama-server answers
them."""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations.

from fastapi import APIRouter, Request
from starlette.responses import Response

from deployments.errors import error_response
from deployments.ingress import Current
from deployments.llama_server.request import completion_call, infill_call

router = APIRouter()


@router.post("/completion")
@router.post("/completions")
async def completion(request: Request, ingress: Current) -> Response:
    return await ingress.generate(request, "/completion", completion_call, error_response)


@router.post("/infill")
async def infill(request: Request, ingress: Current) -> Response:
    return await ingress.generate(request, "/infill", infill_call, error_response)
