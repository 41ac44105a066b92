"""llama-server's /infill route, through the ingress's one request path; errors in
OpenAI's shape, as llama-server answers them."""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations.

from fastapi import APIRouter, Request
from starlette.responses import Response

from deployments.errors import error_response
from deployments.infill.request import infill_call
from deployments.ingress import Current

router = APIRouter()


@router.post("/infill")
async def infill(request: Request, ingress: Current) -> Response:
    return await ingress.generate(request, "/infill", infill_call, error_response)
