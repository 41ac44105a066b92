"""The chat page's routes: `/` for a browser (a request that accepts text/html) and the
page's script and style under /page/. Any other `GET /` is Ollama's "Ollama is running",
which Ollama's clients probe.

The page is package data read once (no build step; it fetches nothing from elsewhere, so it
works offline) and holds no secret: the API routes it calls check the key. Its
Content-Security-Policy lets it run only its own script and talk only to this server.
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations.

import html
from functools import cache
from importlib.resources import files

from fastapi import APIRouter, Request
from starlette.responses import HTMLResponse, Response

from deployments.errors import ApiError, error_response
from deployments.ollama.routes import root as ollama_root

# the page's files besides index.html, with their media types
ASSETS = {"page.js": "text/javascript; charset=utf-8", "page.css": "text/css; charset=utf-8"}
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "connect-src 'self'; img-src 'self' data:; base-uri 'self'; "
                               "form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}

router = APIRouter()


@cache
def asset(name: str) -> str:
    """A file of the page (static/NAME), read once."""
    return (files("deployments.page") / "static" / name).read_text(encoding="utf-8")


def wants_html(request: Request) -> bool:
    return "text/html" in request.headers.get("accept", "")


def page_html(root_path: str) -> str:
    """index.html with its base URL: the app's route prefix (the page's requests are
    relative to it, so the page works under any prefix)."""
    return asset("index.html").replace("{{base}}", html.escape(root_path.rstrip("/") + "/"))


@router.api_route("/", methods=["GET", "HEAD"])
async def root(request: Request) -> Response:
    if not wants_html(request):
        return await ollama_root()
    return HTMLResponse(page_html(request.scope.get("root_path", "")), headers=HEADERS)


@router.get("/page/{name}")
async def page_file(name: str) -> Response:
    if name not in ASSETS:
        return error_response(ApiError(404, f"Unknown path '/page/{name}'.",
                                       code="not_found"))
    return Response(asset(name), media_type=ASSETS[name], headers=HEADERS)
