"""OpenAI's routes: chat completions and completions through the ingress's one request
path; the model list and model cards (their paths are Anthropic's too: deployments.server
routes them by the client's dialect). Errors in OpenAI's shape."""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations.

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from deployments.errors import error_response
from deployments.ingress import Current
from deployments.openai.request import chat_call, completion_call

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, ingress: Current) -> Response:
    return await ingress.generate(request, "/v1/chat/completions", chat_call, error_response)


@router.post("/v1/completions")
async def completions(request: Request, ingress: Current) -> Response:
    return await ingress.generate(request, "/v1/completions", completion_call, error_response)


async def models(request: Request, ingress: Current) -> Response:
    """GET /v1/models in OpenAI's shape (deployments.server routes the shared path)."""
    async def run() -> Response:
        ingress.authenticate(request)
        infos = await ingress.infos()
        return JSONResponse({"object": "list",
                             "data": [model_card(n, i) for n, i in infos.items()]})

    return await ingress.respond(run, error_response)


async def model(model_id: str, request: Request, ingress: Current) -> Response:
    """GET /v1/models/{model_id} in OpenAI's shape (deployments.server routes the path)."""
    async def run() -> Response:
        ingress.authenticate(request)
        ingress.check_model(model_id)
        return JSONResponse(model_card(model_id, await ingress.info(model_id)))

    return await ingress.respond(run, error_response)


def model_card(name: str, info: dict) -> dict:
    """A model's card; one that could not load is `"status": "unavailable"` with the
    reason under "error". `capabilities` (where known: "completion", "embedding",
    "rerank", as Ollama's /api/show lists them) tells a chat front end which to offer."""
    card = {"id": name, "object": "model", "created": info.get("created", 0),
            "owned_by": "flm-serve", "context_length": info.get("context_length")}
    if info.get("capabilities"):
        card["capabilities"] = info["capabilities"]
    if info.get("error"):
        card.update(status="unavailable", error=info["error"])
    return card
