"""The HTTP app and the Serve ingress deployment: every API's router in one route table,
the server's own routes (/health, /metrics), CORS, the access log (a line per request),
and the routing errors (an unknown path or method) in the shape of the API the path
belongs to.

An API surface is a sub-package with a `routes.router`; adding one is a line in ROUTERS.
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations.

from typing import Any

from fastapi import APIRouter, FastAPI, Request
from ray import serve
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response

from deployments.access import AccessLog
from deployments.anthropic import models as anthropic_models
from deployments.anthropic.errors import error_response as anthropic_error_response
from deployments.anthropic.routes import router as anthropic_router
from deployments.embeddings.routes import router as embeddings_router
from deployments.errors import ApiError, error_response, ollama_error_response
from deployments.ingress import Current, Ingress
from deployments.llama_server.routes import router as llama_server_router
from deployments.metrics import render
from deployments.ollama.routes import router as ollama_router
from deployments.openai import routes as openai_routes
from deployments.openai.routes import router as openai_router
from deployments.page.routes import router as page_router
from deployments.rerank.routes import router as rerank_router
from deployments.responses.routes import router as responses_router
from deployments.tokenize.routes import router as tokenize_router

server_router = APIRouter()


@server_router.api_route("/health", methods=["GET", "HEAD"])
async def health() -> dict:
    return {"status": "ok"}


@server_router.get("/metrics")
async def metrics(request: Request, ingress: Current) -> Response:
    """Prometheus text of every replica's metrics (this one's as of now)."""
    async def run() -> Response:
        ingress.authenticate(request)
        snapshot = ingress.metrics.snapshot()
        text = (render([snapshot]) if ingress.hub is None
                else await ingress.hub.text.remote(ingress.replica, snapshot))
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    return await ingress.respond(run, error_response)


# paths two API surfaces share, answered in the dialect of the client that asks (Anthropic's
# SDKs send `anthropic-version`, OpenAI's never do)
@server_router.get("/v1/models")
async def models(request: Request, ingress: Current) -> Response:
    if anthropic_models.wants_anthropic(request):
        return await anthropic_models.list_models(request, ingress)
    return await openai_routes.models(request, ingress)


@server_router.get("/v1/models/{model_id:path}")
async def model(model_id: str, request: Request, ingress: Current) -> Response:
    if anthropic_models.wants_anthropic(request):
        return await anthropic_models.get_model(model_id, request, ingress)
    return await openai_routes.model(model_id, request, ingress)


# the route table: each API surface's router (its paths are its own; the page's `/` goes
# before Ollama's, which it answers for a client that is not a browser)
ROUTERS = (server_router, page_router, openai_router, responses_router, ollama_router,
           embeddings_router, anthropic_router, tokenize_router, rerank_router,
           llama_server_router)


async def _routing_error(request: Request, exc: HTTPException) -> Response:
    """An unknown path (404) or method (405): the routing's errors, in OpenAI's shape
    (Ollama's under /api/: its clients read `error` as a string; Anthropic's under
    /v1/messages)."""
    path = request.url.path
    ollama_route = path.startswith("/api/")
    text = {404: f"Unknown path {path!r}; see " + ("/api/tags." if ollama_route
                                                  else "/v1/models."),
            405: f"{request.method} is not allowed on {path!r}."}
    err = ApiError(exc.status_code, text.get(exc.status_code, exc.detail),
                   headers=dict(exc.headers or {}))
    if path.startswith("/v1/messages"):
        return anthropic_error_response(err)
    return ollama_error_response(err) if ollama_route else error_response(err)


# the origins CORS allows whatever the config adds, Ollama's own defaults: pages served from
# this machine (any port) and the schemes of desktop apps and editors' webviews
LOCAL_ORIGINS = (r"https?://(localhost|127\.0\.0\.1|0\.0\.0\.0|\[::1\])(:\d+)?"
                 r"|(app|file|tauri|vscode-webview|vscode-file)://.*")


def make_app(cors_origins: list[str] | None = None) -> FastAPI:
    """The FastAPI app of every route (handlers find their Ingress through `current`);
    CORS allows `cors_origins` and, as Ollama, LOCAL_ORIGINS."""
    app = FastAPI(title="flm-serve", docs_url=None, redoc_url=None)
    app.add_middleware(CORSMiddleware, allow_origins=cors_origins or [],
                       allow_origin_regex=LOCAL_ORIGINS, allow_methods=["*"],
                       allow_headers=["*"])
    app.add_middleware(AccessLog)  # outermost: a line per request, CORS answers included
    app.add_exception_handler(HTTPException, _routing_error)
    for router in ROUTERS:
        app.include_router(router)
    return app


def make_ingress(config: dict[str, Any]):
    """The ingress deployment (not yet bound) for an app config's `cors_origins`."""
    return serve.deployment(serve.ingress(make_app(config.get("cors_origins")))(Ingress))
