"""OpenAI's routes: chat completions and completions through the ingress's one request
path; the model list and model cards (in Anthropic's shape to a client that sends
`anthropic-version`: the two APIs share the path). Errors in OpenAI's shape."""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations.

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from deployments.anthropic import models as anthropic_models
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


@router.get("/v1/models")
async def models(request: Request, ingress: Current) -> Response:
    if anthropic_models.wants_anthropic(request):  # the anthropic SDK's models.list()
        return await anthropic_models.list_models(request, ingress)

    async def run() -> Response:
        ingress.authenticate(request)
        infos = await ingress.infos()
        return JSONResponse({"object": "list",
                             "data": [model_card(n, i) for n, i in infos.items()]})

    return await ingress.respond(run, error_response)


@router.get("/v1/models/{model_id:path}")
async def model(model_id: str, request: Request, ingress: Current) -> Response:
    if anthropic_models.wants_anthropic(request):
        return await anthropic_models.get_model(model_id, request, ingress)

    async def run() -> Response:
        ingress.authenticate(request)
        ingress.check_model(model_id)
        return JSONResponse(model_card(model_id, await ingress.info(model_id)))

    return await ingress.respond(run, error_response)


def model_card(name: str, info: dict) -> dict:
    """A model's card; one that could not load is `"status": "unavailable"` with the
    reason under "error"."""
    card = {"id": name, "object": "model", "created": info.get("created", 0),
            "owned_by": "flm-serve", "context_length": info.get("context_length")}
    if info.get("error"):
        card.update(status="unavailable", error=info["error"])
    return card
