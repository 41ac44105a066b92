"""llama-server's own routes: /completion (also /completions) and /infill through the
ingress's one request path, GET /props (a model's context, slots and chat template: what
SillyTavern and llama.cpp's own clients read), GET /slots (llama-server's 501 with its slots
endpoint off: a client reading a context there falls back as from llama-server), GET /models
(GET /v1/models' list, which llama-server serves on both paths); errors in llama-server's
shape (`code`: the status as a number; /models' as /v1/models')."""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations.

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from deployments.errors import ApiError, llama_error_response
from deployments.ingress import Current
from deployments.llama_server.reply import props as props_body
from deployments.llama_server.request import completion_call, infill_call
from deployments.openai import routes as openai_routes

router = APIRouter()


@router.post("/completion")
@router.post("/completions")
async def completion(request: Request, ingress: Current) -> Response:
    return await ingress.generate(request, "/completion", completion_call,
                                  llama_error_response)


@router.post("/infill")
async def infill(request: Request, ingress: Current) -> Response:
    return await ingress.generate(request, "/infill", infill_call, llama_error_response)


@router.get("/props")
async def props(request: Request, ingress: Current) -> Response:
    """`model` from the query, optional where the server serves one model."""
    async def run() -> Response:
        ingress.authenticate(request)
        name = ingress.served(request.query_params.get("model"))
        return JSONResponse(props_body(name, await ingress.info(name, verbose=True)))

    return await ingress.respond(run, llama_error_response)


@router.get("/slots")
async def slots(request: Request, ingress: Current) -> Response:
    """llama-server's answer with its slots endpoint off (`endpoint_slots` false in
    /props): slots here are the worker's batch, not inspected or saved one by one."""
    async def run() -> Response:
        ingress.authenticate(request)
        raise ApiError(501, "This server does not support slots endpoint.",
                       type="not_supported_error")

    return await ingress.respond(run, llama_error_response)


@router.get("/models")
async def models(request: Request, ingress: Current) -> Response:
    """GET /v1/models' answer (OpenAI's model list, its errors too), on llama-server's path."""
    return await openai_routes.models(request, ingress)
