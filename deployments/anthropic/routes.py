"""Anthropic's routes: POST /v1/messages through the ingress's one request path, and
POST /v1/messages/count_tokens (the prompt counted by a worker with the model's own
template and tools). Errors in Anthropic's shape, each answer with its `request-id`.
(GET /v1/models answers in Anthropic's shape through deployments.anthropic.models.)"""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations.

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from deployments.anthropic.errors import HEADER, error_response, new_request_id
from deployments.anthropic.request import CountIn, chat_request, decode, messages_call
from deployments.ingress import Current

router = APIRouter()


@router.post("/v1/messages")
async def messages(request: Request, ingress: Current) -> Response:
    return await ingress.generate(request, "/v1/messages", messages_call, error_response)


@router.post("/v1/messages/count_tokens")
async def count_tokens(request: Request, ingress: Current) -> Response:
    async def run() -> Response:
        req = decode(await ingress.body(request), CountIn)
        ingress.check_model(req.model)
        n = await ingress.count_tokens(req.model, chat_request(req))
        return JSONResponse({"input_tokens": n}, headers={HEADER: new_request_id()})

    return await ingress.respond(run, error_response)
