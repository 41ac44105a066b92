"""Ollama's routes: /api/chat and /api/generate through the ingress's one request path;
the model listings (/api/tags, /api/ps, /api/show), a models_dir library's /api/pull,
/api/copy and /api/delete, /api/version and the root's "Ollama is running". Errors in
Ollama's shape ({"error": "..."})."""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations.

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from deployments.errors import ApiError, ollama_error_response
from deployments.ingress import Current, Ingress
from deployments.ollama import reply
from deployments.ollama.request import (
    CopyIn,
    CreateIn,
    DeleteIn,
    PullIn,
    ShowIn,
    chat_call,
    decode,
    generate_call,
    served,
    variant_request,
)

# The Ollama API version this server speaks (clients probe /api/version for features).
OLLAMA_VERSION = "0.12.0"

router = APIRouter()


@router.api_route("/", methods=["GET", "HEAD"])
async def root() -> Response:
    return PlainTextResponse("Ollama is running")


@router.api_route("/api/version", methods=["GET", "HEAD"])  # HEAD: as Ollama answers
async def version() -> dict:
    return {"version": OLLAMA_VERSION}


@router.post("/api/chat")
async def chat(request: Request, ingress: Current) -> Response:
    return await ingress.generate(request, "/api/chat", chat_call, ollama_error_response)


@router.post("/api/generate")
async def generate(request: Request, ingress: Current) -> Response:
    return await ingress.generate(request, "/api/generate", generate_call,
                                  ollama_error_response)


@router.api_route("/api/tags", methods=["GET", "HEAD"])
async def tags(request: Request, ingress: Current) -> Response:
    return await _listing(request, ingress, reply.tag)


@router.get("/api/ps")
async def ps(request: Request, ingress: Current) -> Response:
    """The configured models (always loaded) and the library models loaded now."""
    async def run() -> Response:
        ingress.authenticate(request)
        infos = await ingress.infos()
        models = [reply.ps_entry(n, i) for n, i in infos.items() if not i.get("library")]
        models += [reply.ps_entry(i["id"], i) for i in await ingress.running()]
        return JSONResponse({"models": models})

    return await ingress.respond(run, ollama_error_response)


async def _listing(request: Request, ingress: Ingress, entry) -> Response:
    """Every model as `entry(name, info)` renders it, under "models"."""

    async def run() -> Response:
        ingress.authenticate(request)
        infos = await ingress.infos()
        return JSONResponse({"models": [entry(n, i) for n, i in infos.items()]})

    return await ingress.respond(run, ollama_error_response)


@router.post("/api/show")
async def show(request: Request, ingress: Current) -> Response:
    async def run() -> Response:
        req = decode(await ingress.body(request), ShowIn)
        name = served(ingress, req.model or req.name or "")
        return JSONResponse(reply.show(await ingress.info(name, verbose=True)))

    return await ingress.respond(run, ollama_error_response)


# what Ollama streams for a pull that has nothing left to download
PULL_STATUSES = ("pulling manifest", "verifying sha256 digest", "writing manifest", "success")


@router.post("/api/pull")
async def pull(request: Request, ingress: Current) -> Response:
    """A model that is served already: Ollama's statuses of a pull with nothing to fetch
    (clients such as Open WebUI pull before use). Any other name: a 404 saying that models
    come from files here, not from a registry."""
    async def run() -> Response:
        req = decode(await ingress.body(request), PullIn)
        name = req.model or req.name or ""
        try:
            served(ingress, name)
        except ApiError:
            where = ("it serves the models its config names" if ingress.library is None
                     else "put the model's GGUF file (or Hugging Face directory) in its "
                          "models_dir, where it shows up without a restart")
            raise ApiError(404, f"/api/pull: model '{name}' is not here, and pulling from a "
                                f"registry is not available on this server: {where}; see "
                                "/api/tags.") from None
        if req.stream is False:
            return JSONResponse({"status": "success"})
        return Response(reply.ndjson([{"status": s} for s in PULL_STATUSES]),
                        media_type="application/x-ndjson")

    return await ingress.respond(run, ollama_error_response)


@router.post("/api/copy")
async def copy(request: Request, ingress: Current) -> Response:
    """`destination` becomes another name of the library model `source` (kept in the
    folder's alias file: it survives a restart)."""
    async def run() -> Response:
        req = decode(await ingress.body(request), CopyIn)
        ingress.edit_library(lambda lib: lib.copy(req.source, req.destination),
                             {"source": req.source, "destination": req.destination})
        return Response(status_code=200)

    return await ingress.respond(run, ollama_error_response)


@router.post("/api/create")
async def create(request: Request, ingress: Current) -> Response:
    """A variant of a library model: `from` with its own system prompt, template and
    parameters (Ollama's Modelfile SYSTEM, TEMPLATE and PARAMETER; a Go template is made
    Jinja, actors.go_template), kept beside the aliases."""
    async def run() -> Response:
        req = decode(await ingress.body(request), CreateIn)
        name = req.model or req.name or ""
        v = variant_request(req)
        ingress.edit_library(lambda lib: lib.copy(v.source, name, system=v.system,
                                                  parameters=v.parameters,
                                                  template=v.template, license=v.license),
                             {"model": name, "from": v.source})
        if req.stream is False:
            return JSONResponse({"status": "success"})
        return Response(reply.ndjson([{"status": "using existing layer"},
                                      {"status": "writing manifest"}, {"status": "success"}]),
                        media_type="application/x-ndjson")

    return await ingress.respond(run, ollama_error_response)


@router.delete("/api/delete")
async def delete(request: Request, ingress: Current) -> Response:
    """Remove an alias; a library model's GGUF files only when the config allows it."""
    async def run() -> Response:
        req = decode(await ingress.body(request), DeleteIn)
        await ingress.delete(req.model or req.name or "")
        return Response(status_code=200)

    return await ingress.respond(run, ollama_error_response)
