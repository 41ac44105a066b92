"""Ollama's requests on the same pipeline: a body becomes OpenAI's request (then the same
validation, worker request and constraints); `chat_call` and `generate_call` are the
ingress's Calls for /api/chat and /api/generate.

Errors are `ApiError`s whose `param` names Ollama's field (`options.num_predict`, `format`,
...); the routes write them as `{"error": "..."}`.
"""

from __future__ import annotations

import time
from typing import Any, Literal

import msgspec
from starlette.responses import JSONResponse

from actors.events import GenerateRequest
from actors.keep_alive import keep_alive_seconds
from deployments.body import decode_json
from deployments.errors import ApiError
from deployments.exchange import Call
from deployments.ingress import Ingress
from deployments.ollama.modelfile import parse_modelfile
from deployments.ollama.reply import LATEST, OllamaReply, load_reply
from deployments.openai.request import VARIANT_FIELDS, convert_request, with_defaults
from deployments.openai.request import generate_request as openai_generate_request
from deployments.openai.schemas import ChatRequest, CompletionRequest
from deployments.prefill import continuation


class Options(msgspec.Struct, kw_only=True):
    """The Modelfile parameters a request may set; the others Ollama lists (num_gpu,
    mirostat, ...) are accepted and have no effect here."""

    # Ollama reads a JSON number into an integer option (6.0 is 6); none is range-checked
    num_predict: float | None = None
    num_ctx: float | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: float | None = None
    min_p: float | None = None
    seed: float | None = None
    stop: str | list[str] | None = None
    repeat_penalty: float | None = None
    repeat_last_n: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None


class ToolFunction(msgspec.Struct, kw_only=True):
    name: str
    arguments: dict | str = msgspec.field(default_factory=dict)


class ToolCall(msgspec.Struct, kw_only=True):
    function: ToolFunction
    id: str | None = None


class Message(msgspec.Struct, kw_only=True):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    thinking: str | None = None
    images: list[Any] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None


class _Common(msgspec.Struct, kw_only=True):
    model: str
    stream: bool | None = None  # None: streamed, Ollama's default
    format: Any = None
    options: Options | None = None
    think: bool | str | None = None
    keep_alive: Any = None  # a library model's: seconds or a duration ("5m"); configured
    # models stay loaded
    logprobs: bool | None = None
    top_logprobs: int | None = None


class ChatIn(_Common, kw_only=True):
    messages: list[Message] = msgspec.field(default_factory=list)
    tools: list[Any] | None = None


class GenerateIn(_Common, kw_only=True):
    prompt: str = ""
    system: str | None = None
    suffix: str | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool = False
    images: list[Any] | None = None


class ShowIn(msgspec.Struct, kw_only=True):
    model: str | None = None
    name: str | None = None  # older clients


class CopyIn(msgspec.Struct, kw_only=True):
    source: str
    destination: str


class DeleteIn(msgspec.Struct, kw_only=True):
    model: str | None = None
    name: str | None = None  # older clients


class CreateIn(msgspec.Struct, kw_only=True):
    """/api/create: a variant of a library model (`from`) with its own system prompt,
    template and parameters (or the same in `modelfile` text); the rest of Ollama's fields
    are refused by name."""

    model: str | None = None
    name: str | None = None  # older clients
    from_: str | None = msgspec.field(default=None, name="from")
    system: str | None = None
    parameters: dict[str, Any] | None = None
    template: str | None = None
    modelfile: str | None = None
    files: dict[str, Any] | None = None
    adapters: dict[str, Any] | None = None
    quantize: str | None = None
    license: str | list[str] | None = None
    messages: list[Any] | None = None
    stream: bool | None = None


class Variant(msgspec.Struct, frozen=True, kw_only=True):
    """What /api/create makes: `source` with its own defaults (None: the source's)."""

    source: str
    system: str | None = None
    template: str | None = None
    parameters: dict[str, Any] = msgspec.field(default_factory=dict)
    license: str | None = None


def variant_request(req: CreateIn) -> Variant:
    """A create request's variant (its fields over its `modelfile`'s), checked; a 400
    naming what cannot be made here."""
    for field, why in (("files", "models come from the models_dir folder"),
                       ("adapters", "adapters are not supported"),
                       ("quantize", "a GGUF file keeps its own formats"),
                       ("messages", "a variant holds no conversation")):
        if getattr(req, field):
            raise ApiError(400, f"'{field}' is not supported here: {why}.", param=field)
    mf = parse_modelfile(req.modelfile) if req.modelfile else {}
    source = req.from_ or mf.get("from")
    if not source:
        raise ApiError(400, "'from' is required: the library model the variant is made "
                            "from.", param="from")
    params = {**mf.get("parameters", {}), **(req.parameters or {})}
    known = set(VARIANT_FIELDS) | {"num_ctx"}  # num_ctx: the variant's requests' context
    unknown = sorted(set(params) - known)
    if unknown:
        raise ApiError(400, f"'parameters.{unknown[0]}' is not supported here (supported: "
                            f"{', '.join(sorted(known))}).",
                       param=f"parameters.{unknown[0]}")
    try:
        options = msgspec.convert({k: v for k, v in params.items()}, Options)
    except msgspec.ValidationError as exc:
        raise ApiError(400, f"parameters: {exc}", param="parameters") from None
    if options.num_ctx is not None and options.num_ctx < 1:
        raise ApiError(400, f"'parameters.num_ctx' is {params['num_ctx']}; it must be at "
                            "least 1.", param="parameters.num_ctx")
    for key in ("num_predict", "top_k", "num_ctx", "seed", "repeat_last_n"):
        if isinstance(params.get(key), float):  # into integers, as Ollama does
            params[key] = int(params[key])
    if isinstance(params.get("repeat_last_n"), int):  # below -1: the whole context, as -1
        params["repeat_last_n"] = max(-1, params["repeat_last_n"])
    # a variant's parameters are every API's requests' defaults: what one of them would
    # refuse is refused here, once, not at each request
    probe = with_defaults({"model": "m", "messages": [{"role": "user", "content": "x"}]},
                          None, params)
    try:
        convert_request(probe, ChatRequest)
    except ApiError as err:
        raise ApiError(400, f"parameters: {err.message}", param="parameters") from None
    licenses = req.license if req.license is not None else mf.get("license")
    return Variant(source=source,
                   system=req.system if req.system is not None else mf.get("system"),
                   template=req.template if req.template is not None else mf.get("template"),
                   parameters=params,
                   license=("\n\n".join(licenses) if isinstance(licenses, list) else licenses)
                   or None)


class PullIn(msgspec.Struct, kw_only=True):
    model: str | None = None
    name: str | None = None  # older clients
    insecure: bool | None = None
    stream: bool | None = None  # None: streamed, Ollama's default


# OpenAI's parameter -> the Ollama field it came from (for the errors' `param`)
_PARAMS = {"max_tokens": "options.num_predict", "temperature": "options.temperature",
           "top_p": "options.top_p", "top_k": "options.top_k", "min_p": "options.min_p",
           "seed": "options.seed", "stop": "options.stop",
           "repetition_penalty": "options.repeat_penalty",
           "repeat_last_n": "options.repeat_last_n",
           "presence_penalty": "options.presence_penalty",
           "frequency_penalty": "options.frequency_penalty", "response_format": "format",
           "reasoning_effort": "think", "top_logprobs": "top_logprobs"}


def _ollama_param(param: str | None, names: dict[str, str] | None = None) -> str | None:
    if not param:
        return param
    for ours, theirs in {**_PARAMS, **(names or {})}.items():
        if param == ours or param.startswith((ours + ".", ours + "[")):
            return theirs + param[len(ours):] if theirs != "format" else "format"
    return param


def decode(body: bytes, kind: type) -> Any:
    """A typed Ollama request; a 400 naming the field otherwise."""
    return decode_json(body, kind)


def model_name(name: str) -> str:
    """A model's id from an Ollama name: the tag `latest` is the default one."""
    return name[: -len(LATEST)] if name.endswith(LATEST) else name


def _whole(value: float | None) -> int | None:
    return None if value is None else int(value)


def _seed(value: float | None) -> int | None:
    """A seed read as Ollama's runner reads one: -1 (any negative) is a random seed."""
    seed = _whole(value)
    return None if seed is None or seed < 0 else seed


def _clamped(value: float | None, low: float, high: float) -> float | None:
    return None if value is None else min(max(value, low), high)


# OpenAI's ranges, which Ollama does not check: a value past them is held out of the OpenAI
# request (typed without it) and given to the worker as it is (its sampler takes any)
_HELD = {"temperature": (0.0, 2.0), "presence_penalty": (-2.0, 2.0),
         "frequency_penalty": (-2.0, 2.0), "repetition_penalty": (0.0, 10.0)}
MAX_STOPS = 8  # OpenAI's
REPEAT_LAST_N = 64  # the tokens Ollama's penalties read unless told


def _held(out: dict[str, Any]) -> dict[str, Any]:
    """The values of `out` (OpenAI's fields, from Ollama's options) that OpenAI's ranges
    refuse, taken out of it: the worker's request gets them after it is typed."""
    held = {k: out.pop(k) for k, (low, high) in _HELD.items()
            if out.get(k) is not None and not low <= out[k] <= high}
    stop = out.get("stop")
    if stop and len(stop) > MAX_STOPS:
        held["stop"] = out.pop("stop")
    if out.get("max_tokens") == 0:  # nothing written: the prompt alone (Ollama's 0)
        held["max_tokens"] = out.pop("max_tokens")
    return held


def _sampling(req: _Common) -> dict[str, Any]:
    """The OpenAI fields of `req`'s options, thinking switch, format and logprobs; values
    past OpenAI's ranges as Ollama (llama.cpp's samplers) reads them: a temperature below 0
    is greedy, top_p at most 0 keeps the likeliest token and above 1 is off, min_p within
    0..1, a repeat_penalty of 0 or less is off; the penalties read the last repeat_last_n
    tokens (64 unless set; 0: none, -1: the whole context)."""
    o = req.options or Options()
    top_k, num_predict = _whole(o.top_k), _whole(o.num_predict)
    last_n = _whole(o.repeat_last_n)
    repeat = o.repeat_penalty
    out: dict[str, Any] = {
        "temperature": None if o.temperature is None else max(o.temperature, 0.0),
        "top_p": _clamped(o.top_p, 1e-9, 1.0), "min_p": _clamped(o.min_p, 0.0, 1.0),
        "seed": _seed(o.seed), "top_k": None if top_k is None else max(top_k, 0),
        "stop": [o.stop] if isinstance(o.stop, str) else o.stop,
        "repetition_penalty": None if repeat is None else repeat if repeat > 0 else 1.0,
        "presence_penalty": o.presence_penalty, "frequency_penalty": o.frequency_penalty,
        "repeat_last_n": None if last_n is None else max(last_n, -1),
        # -1 (no limit) and -2 (until the context is full) both run to the context's end
        "max_tokens": None if num_predict is None or num_predict < 0 else num_predict}
    if isinstance(req.think, bool):
        out["think"] = req.think
    elif isinstance(req.think, str):
        out["reasoning_effort"] = req.think
    fmt = req.format
    if fmt == "json":
        out["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict):
        out["response_format"] = {"type": "json_schema",
                                  "json_schema": {"name": "format", "schema": fmt}}
    elif fmt not in (None, ""):
        raise ApiError(400, f"'format' is {fmt!r}; use \"json\" or a JSON schema object.",
                       param="format")
    if req.logprobs:
        out["logprobs"] = True
        out["top_logprobs"] = req.top_logprobs
    return {k: v for k, v in out.items() if v is not None}


def _context_limit(req: _Common) -> dict[str, Any]:
    n = _whole((req.options or Options()).num_ctx)
    if n is None:
        return {}
    if n < 1:
        raise ApiError(400, f"'options.num_ctx' is {n}; it must be at least 1.",
                       param="options.num_ctx")
    return {"context_limit": n}


# Ollama's defaults where neither the request (its options, a variant's parameters) nor the
# model's generation_config sets one (its docs' Modelfile parameters; Open WebUI sends no
# options); its penalties' window (`repeat_last_n`) is the API's, whatever the model
DEFAULT_SAMPLING = {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "repetition_penalty": 1.1}


def _openai(raw: dict, schema: type[ChatRequest | CompletionRequest],
            extra: dict, variant: tuple | None = None,
            names: dict[str, str] | None = None) -> GenerateRequest:
    """`names`: this request's own OpenAI -> Ollama field names, beside _PARAMS."""
    if variant is not None:  # a library variant's defaults (/api/create)
        raw = with_defaults(raw, *variant)
    if raw.get("repeat_last_n") is None:
        raw = {**raw, "repeat_last_n": REPEAT_LAST_N}
    try:
        greq = openai_generate_request(convert_request(raw, schema), raw, **extra)
    except ApiError as err:  # named as the Ollama request has it, in the text too
        raise err.renamed(_ollama_param(err.param, names)) from None
    return msgspec.structs.replace(greq, sampling_fallback=DEFAULT_SAMPLING)


def _no_images(images: list | None, where: str) -> None:
    if images:
        raise ApiError(400, f"'{where}' holds images; this server's models read text only.",
                       param=where)


def _messages(messages: list[Message]) -> list[dict]:
    out = []
    for i, m in enumerate(messages):
        _no_images(m.images, f"messages[{i}].images")
        msg: dict[str, Any] = {"role": m.role, "content": m.content or ""}
        if m.thinking:
            msg["reasoning_content"] = m.thinking
        if m.tool_calls:
            msg["tool_calls"] = [{"id": c.id or f"call_{i}_{j}", "type": "function",
                                  "function": {"name": c.function.name,
                                               "arguments": c.function.arguments}}
                                 for j, c in enumerate(m.tool_calls)]
        if m.role == "tool":
            if m.tool_name:
                msg["name"] = m.tool_name
            if m.tool_call_id:
                msg["tool_call_id"] = m.tool_call_id
        out.append(msg)
    return out


def chat_request(req: ChatIn, variant: tuple | None = None) -> GenerateRequest:
    """The worker's request for `/api/chat` (it has at least one message); `variant`: a
    library variant's (system prompt, parameters)."""
    sampling = _sampling(req)
    held = _held(sampling)
    raw = {"model": req.model, "messages": _messages(req.messages), **sampling}
    if req.tools:
        raw["tools"] = req.tools
    greq = _thinks(req, _openai(raw, ChatRequest, _context_limit(req), variant))
    greq = msgspec.structs.replace(greq, drop_history=True, require_tools=bool(req.tools),
                                   **held)
    if greq.constraint.response_format != "text":  # a document from its start: as before
        return greq
    messages, prefilled = continuation(greq.messages)  # a last assistant message goes on
    return msgspec.structs.replace(greq, messages=messages, continue_final=prefilled)


def _thinks(req: _Common, greq: GenerateRequest) -> GenerateRequest:
    """`greq`, refused by a model that cannot think when `think` asks for thinking (true or
    an effort), as Ollama refuses it; the effort "none" is thinking off, as `false`."""
    if req.think in (None, False, "none"):
        return greq
    return msgspec.structs.replace(greq, require_thinking=True)


def generate_request(req: GenerateIn, variant: tuple | None = None) -> GenerateRequest:
    """The worker's request for `/api/generate`: the prompt (and system) in the model's
    chat template, or as given with `raw`."""
    _no_images(req.images, "images")
    if req.template:
        raise ApiError(400, "'template' is not supported here: prompts use the model's own "
                            "chat template (or send 'raw': true with the whole prompt).",
                       param="template")
    if req.context:
        raise ApiError(400, "'context' is not supported; send the conversation to "
                            "/api/chat instead.", param="context")
    sampling = _sampling(req)
    held = _held(sampling)
    # `suffix`: fill in the middle (an insert model's template writes the prompt and the
    # suffix in its FIM tokens, the system prompt not at all); `raw`: the prompt as it is.
    # In both, `format` constrains the continuation itself
    if req.raw or req.suffix:
        if sampling.get("think") or sampling.get("reasoning_effort", "none") != "none":
            raise ApiError(400, "'think' needs the model's chat template; it cannot be "
                                "used with " + ("'suffix'." if req.suffix else "'raw': true."),
                           param="think")
        sampling.pop("think", None)  # false: nothing to switch off without a template
        raw = {"model": req.model, "prompt": req.prompt, **sampling}
        if req.suffix:
            raw["suffix"] = req.suffix
        if raw.pop("logprobs", None):  # completions' logprobs: the top alternatives' count
            raw["logprobs"] = raw.pop("top_logprobs", None) or 0
        greq = _openai(raw, CompletionRequest, _context_limit(req),
                       (None, variant[1]) if variant else None,
                       names={"logprobs": "top_logprobs"})
        # /v1/completions' default of 16 tokens is OpenAI's; Ollama's is no limit
        return msgspec.structs.replace(greq, **{"max_tokens": sampling.get("max_tokens"),
                                                **held})
    messages = ([{"role": "system", "content": req.system}] if req.system else []) \
        + [{"role": "user", "content": req.prompt}]
    raw = {"model": req.model, "messages": messages, **sampling}
    greq = _thinks(req, _openai(raw, ChatRequest, _context_limit(req), variant))
    return msgspec.structs.replace(greq, **held)


def served(ingress: Ingress, name: str) -> str:
    """The served model a client's name means (`name:latest` is `name`); 404 in Ollama's
    words when there is none."""
    if not name:
        raise ApiError(400, "model is required", param="model")  # Ollama's own words
    model = ingress.resolve(model_name(name)) or ingress.resolve(name)
    if model is None:
        raise ApiError(404, f"model '{name}' not found; see /api/tags.")
    return model


def keep_alive(req: _Common) -> float | None:
    """The request's keep_alive in seconds (None: the server's default)."""
    try:
        return keep_alive_seconds(req.keep_alive)
    except ValueError as exc:
        raise ApiError(400, str(exc), param="keep_alive") from None


def chat_call(body: bytes, ingress: Ingress) -> Call:
    """/api/chat's Call (no messages: Ollama's way to load a model, answered at once)."""
    req = decode(body, ChatIn)
    return _call(req, "chat", not req.messages, ingress)


def generate_call(body: bytes, ingress: Ingress) -> Call:
    """/api/generate's Call (no prompt, system or suffix: a load request, answered at
    once)."""
    req = decode(body, GenerateIn)
    return _call(req, "generate", not req.prompt and not req.system and not req.suffix,
                 ingress)


def _call(req: ChatIn | GenerateIn, endpoint: str, empty: bool, ingress: Ingress) -> Call:
    keep = keep_alive(req)
    if empty and keep == 0 and req.model and ingress.resolve(req.model) is None and \
            ingress.resolve(model_name(req.model)) is None:
        # an unload of a model no longer listed (its file removed while it was loaded): the
        # workers look it up among the models they hold (404 when none does)
        model = model_name(req.model)
        return Call(later=lambda: _load(ingress, model, req.model, endpoint, keep))
    model = served(ingress, req.model)
    if empty and model in ingress.streams:  # configured models are always loaded
        return Call(now=JSONResponse(load_reply(req.model, endpoint, req.keep_alive)))
    if empty:
        return Call(later=lambda: _load(ingress, model, req.model, endpoint, keep))
    variant = ingress.variant(model)
    greq = (chat_request(req, variant) if endpoint == "chat"
            else generate_request(req, variant))
    return Call(model=model, request=greq, stream=req.stream is not False,
                reply=OllamaReply(req.model, endpoint, time.perf_counter()),
                params={"context_limit": "options.num_ctx"}, keep_loaded_s=keep)


async def _load(ingress: Ingress, model: str, asked: str, endpoint: str,
                keep: float | None) -> JSONResponse:
    """A library model's load request (keep_alive 0: its unload request)."""
    started = time.perf_counter()
    out = await ingress.load(model, keep)
    body = load_reply(asked, endpoint, 0 if out["done_reason"] == "unload" else None)
    body["total_duration"] = int((time.perf_counter() - started) * 1e9)
    body["load_duration"] = int(out.get("load_s", 0.0) * 1e9)
    return JSONResponse(body)
