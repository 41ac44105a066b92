"""OpenAI's Responses routes: POST /v1/responses through the ingress's one request path;
POST /v1/responses/input_tokens (the request's prompt counted); GET and DELETE of a stored
response, and GET of its input items. Errors in OpenAI's shape.
The router is in deployments.server's route table, so a route added here is served."""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations.

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from deployments.errors import error_response
from deployments.ingress import Current
from deployments.responses.items import item_page
from deployments.responses.request import input_tokens, responses_call
from deployments.responses.store import ResponseStore

router = APIRouter()


@router.post("/v1/responses")
async def create(request: Request, ingress: Current) -> Response:
    return await ingress.generate(request, "/v1/responses", responses_call, error_response)


@router.post("/v1/responses/input_tokens")
async def count(request: Request, ingress: Current) -> Response:
    """The input tokens a response request would have (OpenAI's input token count)."""
    async def run() -> Response:
        return JSONResponse(await input_tokens(await ingress.body(request), ingress))

    return await ingress.respond(run, error_response)


@router.get("/v1/responses/{response_id}")
async def get(response_id: str, request: Request,
              ingress: Current) -> Response:
    async def run() -> Response:
        ingress.authenticate(request)
        return JSONResponse(ingress.state("responses", ResponseStore).get(response_id).response)

    return await ingress.respond(run, error_response)


@router.get("/v1/responses/{response_id}/input_items")
async def input_items(response_id: str, request: Request,
                      ingress: Current) -> Response:
    """The input items a stored response was made from, a page at a time (OpenAI's list)."""
    async def run() -> Response:
        ingress.authenticate(request)
        stored = ingress.state("responses", ResponseStore).get(response_id)
        return JSONResponse(item_page(stored.items, request.query_params.multi_items()))

    return await ingress.respond(run, error_response)


@router.delete("/v1/responses/{response_id}")
async def delete(response_id: str, request: Request,
                 ingress: Current) -> Response:
    async def run() -> Response:
        ingress.authenticate(request)
        ingress.state("responses", ResponseStore).delete(response_id)
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})

    return await ingress.respond(run, error_response)
