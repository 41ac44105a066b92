"""Embedding requests in OpenAI's, Ollama's and llama-server's shapes: each route's Call,
with the inputs checked here (their types, sizes and options) and against the model by the
worker (token counts, the context, dimensions).

OpenAI's `input` is a string, a list of strings, a list of token ids or a list of lists of
token ids (one type per request); Ollama's is a string or a list of strings (`/api/embed`)
or a `prompt` (the older `/api/embeddings`); llama-server's (/embedding, /embeddings) is
`input` or `content`, in its prompt forms: a string, token ids, or a list of those (a list
that holds no bare id is several inputs, strings and id lists side by side); strings and
ids mixed in one input are a 400 here. Its `embd_normalize` (default 2, Euclidean) is
applied to the worker's unit vectors (every p-norm of a vector is that of its unit vector;
0: the largest magnitude to 32760, an int16's range); -1 (none) is a 400: the vectors come
normalized. `model` is optional where the server serves one model.

vLLM's `truncate_prompt_tokens` on /v1/embeddings keeps each input's last that many tokens
(a text's special tokens kept around them; -1: the context; below -1 a 400 here, 0 or past
the context one from the worker naming it), where an input over the context is otherwise
a 400.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

import msgspec
from starlette.responses import Response

from actors.events import EmbedGenerate
from deployments.body import decode_json, is_token_id, several_prompts
from deployments.embeddings.reply import LlamaEmbedReply, OllamaEmbedReply, OpenAIEmbedReply
from deployments.errors import ApiError
from deployments.exchange import Call
from deployments.ingress import Ingress
from deployments.ollama.request import Options, decode, keep_alive, served

# the most inputs one request may carry (OpenAI's own limit)
MAX_INPUTS = 2048
# vLLM's `truncate_prompt_tokens` (its own bound: -1 is the context; 0 and past the context
# are refused by the worker, which knows it)
Truncation = Annotated[int, msgspec.Meta(ge=-1)]


class OpenAIEmbedIn(msgspec.Struct, kw_only=True):
    model: str
    input: Any
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    truncate_prompt_tokens: Truncation | None = None


class LlamaEmbedIn(msgspec.Struct, kw_only=True):
    """llama-server's /embedding (and /embeddings): `input`, else `content`."""

    input: Any = None
    content: Any = None
    model: str | None = None
    embd_normalize: int = 2


class EmbedIn(msgspec.Struct, kw_only=True):
    """Ollama's /api/embed."""

    model: str
    input: str | list[str] = msgspec.field(default_factory=list)
    truncate: bool = True
    dimensions: int | None = None
    options: Options | None = None
    keep_alive: str | int | float | None = None


class EmbeddingsIn(msgspec.Struct, kw_only=True):
    """Ollama's older /api/embeddings."""

    model: str
    prompt: str = ""
    options: Options | None = None
    keep_alive: str | int | float | None = None


def _inputs(value: Any) -> list[str | list[int]]:
    """OpenAI's `input` as a list of texts or of token id lists; a 400 naming it when it
    is none of its four forms."""
    def bad(why: str) -> ApiError:
        return ApiError(400, f"'input' {why}: it must be a string, a list of strings, a list "
                        "of token ids or a list of lists of token ids.", param="input")

    if isinstance(value, str):
        if not value:
            raise bad("is empty")
        return [value]
    if not isinstance(value, list) or not value:
        raise bad("is empty" if value == [] else "has the wrong type")
    _check_count(len(value))
    if all(isinstance(v, str) for v in value):
        for i, v in enumerate(value):
            if not v:
                raise ApiError(400, f"Input {i} is empty.", param=f"input[{i}]")
        return list(value)
    if all(map(is_token_id, value)):
        return [list(value)]
    if all(isinstance(v, list) for v in value):
        for i, v in enumerate(value):
            if not v or not all(map(is_token_id, v)):
                raise ApiError(400, f"Input {i} must be a non-empty list of token ids.",
                               param=f"input[{i}]")
        return [list(v) for v in value]
    raise bad("mixes types")


def _check_count(count: int) -> None:
    """A 400 naming the limit when one request carries more than MAX_INPUTS inputs (the
    same on OpenAI's route and Ollama's /api/embed)."""
    if count > MAX_INPUTS:
        raise ApiError(400, f"'input' holds {count} inputs; at most {MAX_INPUTS} are "
                       "allowed.", param="input")


def _dimensions(value: int | None) -> int | None:
    if value is not None and value < 1:
        raise ApiError(400, f"'dimensions' must be at least 1; got {value}.",
                       param="dimensions")
    return value


def _num_ctx(options: Options | None) -> int | None:
    """Ollama's `options.num_ctx`: the context inputs are cut to (or checked against)."""
    n = int(options.num_ctx) if options is not None and options.num_ctx is not None else None
    if n is not None and n < 1:
        raise ApiError(400, f"options.num_ctx must be at least 1; got {n}")
    return n


def _request_id() -> str:
    return f"embd-{uuid.uuid4().hex}"


def openai_call(body: bytes, ingress: Ingress) -> Call:
    """/v1/embeddings' Call: an input over the context is a 400 (OpenAI does not cut),
    unless vLLM's `truncate_prompt_tokens` keeps its last tokens."""
    req = decode_json(body, OpenAIEmbedIn)
    ingress.check_model(req.model)
    greq = EmbedGenerate(request_id=_request_id(), inputs=_inputs(req.input),
                         dimensions=_dimensions(req.dimensions),
                         keep_last=req.truncate_prompt_tokens)
    return Call(model=req.model, request=greq,
                reply=OpenAIEmbedReply(req.model, req.encoding_format),
                params={"keep_last": "truncate_prompt_tokens"})


def embed_call(body: bytes, ingress: Ingress) -> Call:
    """/api/embed's Call: inputs over the context are cut to it unless `truncate` is false;
    `dimensions` cuts the vectors as Ollama does (OllamaEmbedReply: one past the model's, or
    0 and below, is the whole vector, not a 400);
    no input at all loads the model (answered with no embeddings); more than MAX_INPUTS
    inputs is a 400, as on /v1/embeddings. (/api/embeddings takes one `prompt`: no cap.)"""
    req = decode(body, EmbedIn)
    model = served(ingress, req.model)
    texts = [req.input] if isinstance(req.input, str) else req.input
    if not texts or texts == [""]:
        return _load_call(ingress, model, keep_alive(req), OllamaEmbedReply(req.model,
                                                                             legacy=False))
    _check_count(len(texts))
    for i, text in enumerate(texts):
        if not text:
            raise ApiError(400, f"input {i} is empty")
    greq = EmbedGenerate(request_id=_request_id(), inputs=list(texts), truncate=req.truncate,
                         context_limit=_num_ctx(req.options))
    return Call(model=model, request=greq,
                reply=OllamaEmbedReply(req.model, legacy=False, dimensions=req.dimensions),
                keep_loaded_s=keep_alive(req))


def embeddings_call(body: bytes, ingress: Ingress) -> Call:
    """/api/embeddings' Call (the older form: one `prompt`, one `embedding`; an empty
    prompt answers an empty embedding, as Ollama does)."""
    req = decode(body, EmbeddingsIn)
    model = served(ingress, req.model)
    reply = OllamaEmbedReply(req.model, legacy=True)
    if not req.prompt:
        return _load_call(ingress, model, keep_alive(req), reply)
    greq = EmbedGenerate(request_id=_request_id(), inputs=[req.prompt], truncate=True,
                         context_limit=_num_ctx(req.options))
    return Call(model=model, request=greq, reply=reply, params={"input": "prompt"},
                keep_loaded_s=keep_alive(req))


def _load_call(ingress: Ingress, model: str, keep: float | None,
               reply: OllamaEmbedReply) -> Call:
    """An Ollama embedding request with nothing to embed: as Ollama, it loads the model
    (keep_alive 0: unloads it) and answers no embeddings; a configured model is always
    loaded."""
    if model in ingress.streams:
        return Call(now=reply.empty())

    async def load() -> Response:
        out = await ingress.load(model, keep)
        return reply.empty(load_s=out.get("load_s", 0.0))
    return Call(later=load)


def _llama_inputs(value: Any, field: str) -> list[str | list[int]]:
    """llama-server's prompt forms as inputs (its `tokenize_input_prompts`); a 400 naming
    the input that is none of them, is empty, or comes in pieces."""
    several = several_prompts(value)
    items = value if several else [value]
    _check_count(len(items))
    out: list[str | list[int]] = []
    for i, item in enumerate(items):
        param = f"{field}[{i}]" if several else field
        if isinstance(item, str) and item:
            out.append(item)
        elif isinstance(item, list) and item and all(map(is_token_id, item)):
            out.append(list(item))
        elif item == "" or item == []:
            raise ApiError(400, f"'{param}' is empty.", param=param)
        elif isinstance(item, list) and all(is_token_id(t) or isinstance(t, str) for t in item):
            raise ApiError(400, f"'{param}' is one input in pieces (strings, or strings "
                                "and token ids), which embeddings do not take: send it as one "
                                "string or as token ids.", param=param)
        else:
            raise ApiError(400, f"'{param}' must be a string or an array of token ids; "
                                "several inputs: an array of those.", param=param)
    return out


def llama_call(body: bytes, ingress: Ingress) -> Call:
    """/embedding's Call (llama-server's): an input over the context is a 400 (llama-server
    does not cut either)."""
    req = decode_json(body, LlamaEmbedIn)
    field = "input" if req.input is not None else "content"
    value = req.input if req.input is not None else req.content
    if value is None:
        raise ApiError(400, "'input' or 'content' must be provided: the text to embed.",
                       param="content")
    if req.embd_normalize < 0:
        raise ApiError(400, f"'embd_normalize' is {req.embd_normalize}; it must be 0 (the "
                            "largest magnitude), 1 (taxicab), 2 (Euclidean) or above (a "
                            "p-norm): the vectors come normalized, so -1 (none) is not "
                            "supported.", param="embd_normalize")
    model = ingress.served(req.model)
    greq = EmbedGenerate(request_id=_request_id(), inputs=_llama_inputs(value, field))
    return Call(model=model, request=greq, reply=LlamaEmbedReply(req.embd_normalize),
                params={"input": field} if field != "input" else {})
