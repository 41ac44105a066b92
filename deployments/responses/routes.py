"""OpenAI's Responses routes: POST /v1/responses through the ingress's one request path;
GET and DELETE of a stored response. Errors in OpenAI's shape."""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations.

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from deployments.errors import error_response
from deployments.ingress import Current
from deployments.responses.request import responses_call
from deployments.responses.store import ResponseStore

router = APIRouter()


@router.post("/v1/responses")
async def create(request: Request, ingress: Current) -> Response:
    return await ingress.generate(request, "/v1/responses", responses_call, error_response)


@router.get("/v1/responses/{response_id}")
async def get(response_id: str, request: Request,
              ingress: Current) -> Response:
    async def run() -> Response:
        ingress.authenticate(request)
        return JSONResponse(ingress.state("responses", ResponseStore).get(response_id)[0])

    return await ingress.respond(run, error_response)


@router.delete("/v1/responses/{response_id}")
async def delete(response_id: str, request: Request,
                 ingress: Current) -> Response:
    async def run() -> Response:
        ingress.authenticate(request)
        ingress.state("responses", ResponseStore).delete(response_id)
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})

    return await ingress.respond(run, error_response)
