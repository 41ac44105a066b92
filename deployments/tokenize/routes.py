"""The tokenizer's routes: POST /tokenize and /detokenize (llama-server's and vLLM's paths;
/v1/tokenize and /v1/detokenize too), GET /tokenizer_info (vLLM's) and POST /apply-template
(llama-server's: a conversation rendered with the chat template), each through the
ingress's one request path; errors in llama-server's shape, whose numeric `code` vLLM's
body has too."""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations.

from fastapi import APIRouter, Request
from starlette.responses import Response

from deployments.errors import llama_error_response
from deployments.ingress import Current
from deployments.tokenize.request import (
    apply_template_call,
    detokenize_call,
    tokenize_call,
    tokenizer_info_call,
)

router = APIRouter()


@router.post("/tokenize")
@router.post("/v1/tokenize")
async def tokenize(request: Request, ingress: Current) -> Response:
    return await ingress.generate(request, "/tokenize", tokenize_call, llama_error_response)


@router.post("/detokenize")
@router.post("/v1/detokenize")
async def detokenize(request: Request, ingress: Current) -> Response:
    return await ingress.generate(request, "/detokenize", detokenize_call,
                                  llama_error_response)


@router.get("/tokenizer_info")
@router.get("/v1/tokenizer_info")
async def tokenizer_info(request: Request, ingress: Current) -> Response:
    model = request.query_params.get("model")
    return await ingress.generate(request, "/tokenizer_info",
                                  lambda _body, ing: tokenizer_info_call(model, ing),
                                  llama_error_response)


@router.post("/apply-template")
async def apply_template(request: Request, ingress: Current) -> Response:
    return await ingress.generate(request, "/apply-template", apply_template_call,
                                  llama_error_response)
