"""Ollama's API on the same pipeline: its requests become OpenAI's (then the same
validation, worker request and constraints), and the worker's events become Ollama's
NDJSON lines and final objects.

`chat_request` and `generate_request` translate a body; `OllamaReply` renders a request's
events (streamed line by line, or folded into one object); `tags`, `show` and `ps` render
the workers' model descriptions. Errors are `ApiError`s whose `param` names Ollama's field
(`options.num_predict`, `format`, ...); the ingress writes them as `{"error": "..."}`.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from typing import Any, Literal

import msgspec

from actors.events import Deltas, Failed, Finished, GenerateRequest, TokenLogprob, Usage
from deployments.errors import ApiError
from deployments.responses import ChoiceFold
from deployments.validate import convert_request, decode_json
from deployments.validate import generate_request as openai_generate_request

# The Ollama API version this server speaks (clients probe /api/version for features).
OLLAMA_VERSION = "0.12.0"
LATEST = ":latest"
# created_at of /api/ps's far-away expiry: a model here is never unloaded
NEVER = "2999-01-01T00:00:00Z"


class Options(msgspec.Struct, kw_only=True):
    """The Modelfile parameters a request may set; the others Ollama lists (num_gpu,
    mirostat, ...) are accepted and have no effect here."""

    num_predict: int | None = None
    num_ctx: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    repeat_penalty: float | None = None
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
    keep_alive: Any = None  # accepted: a model here stays loaded
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


# OpenAI's parameter -> the Ollama field it came from (for the errors' `param`)
_PARAMS = {"max_tokens": "options.num_predict", "temperature": "options.temperature",
           "top_p": "options.top_p", "top_k": "options.top_k", "min_p": "options.min_p",
           "seed": "options.seed", "stop": "options.stop",
           "repetition_penalty": "options.repeat_penalty",
           "presence_penalty": "options.presence_penalty",
           "frequency_penalty": "options.frequency_penalty", "response_format": "format",
           "reasoning_effort": "think", "top_logprobs": "top_logprobs"}


def _ollama_param(param: str | None) -> str | None:
    if not param:
        return param
    for ours, theirs in _PARAMS.items():
        if param == ours or param.startswith((ours + ".", ours + "[")):
            return theirs + param[len(ours):] if theirs != "format" else "format"
    return param


def decode(body: bytes, kind: type) -> Any:
    """A typed Ollama request; a 400 naming the field otherwise."""
    return decode_json(body, kind)


def model_name(name: str) -> str:
    """A model's id from an Ollama name: the tag `latest` is the default one."""
    return name[: -len(LATEST)] if name.endswith(LATEST) else name


def _sampling(req: _Common) -> dict[str, Any]:
    """The OpenAI fields of `req`'s options, thinking switch, format and logprobs."""
    o = req.options or Options()
    out: dict[str, Any] = {
        "temperature": o.temperature, "top_p": o.top_p, "min_p": o.min_p, "seed": o.seed,
        "top_k": None if o.top_k is None or o.top_k < 0 else o.top_k,
        "stop": [o.stop] if isinstance(o.stop, str) else o.stop,
        "repetition_penalty": o.repeat_penalty, "presence_penalty": o.presence_penalty,
        "frequency_penalty": o.frequency_penalty,
        # -1 (no limit) and -2 (until the context is full) both run to the context's end
        "max_tokens": None if o.num_predict is None or o.num_predict < 0 else o.num_predict}
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
    n = (req.options or Options()).num_ctx
    if n is None:
        return {}
    if n < 1:
        raise ApiError(400, f"'options.num_ctx' is {n}; it must be at least 1.",
                       param="options.num_ctx")
    return {"context_limit": n}


def _openai(raw: dict, kind: str, extra: dict) -> GenerateRequest:
    try:
        req = convert_request(raw, kind)
    except ApiError as err:
        err.param = _ollama_param(err.param)
        raise
    return openai_generate_request(req, raw, kind, **extra)


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


def chat_request(req: ChatIn) -> GenerateRequest:
    """The worker's request for `/api/chat` (it has at least one message)."""
    raw = {"model": req.model, "messages": _messages(req.messages), **_sampling(req)}
    if req.tools:
        raw["tools"] = req.tools
    return _openai(raw, "chat", _context_limit(req))


def generate_request(req: GenerateIn) -> GenerateRequest:
    """The worker's request for `/api/generate`: the prompt (and system) in the model's
    chat template, or as given with `raw`."""
    _no_images(req.images, "images")
    for field in ("suffix", "template"):
        if getattr(req, field):
            raise ApiError(400, f"'{field}' is not supported here: "
                           + ("the models served here do not fill in the middle."
                              if field == "suffix" else
                              "prompts use the model's own chat template (or send "
                              "'raw': true with the whole prompt)."), param=field)
    if req.context:
        raise ApiError(400, "'context' is not supported; send the conversation to "
                            "/api/chat instead.", param="context")
    sampling = _sampling(req)
    if req.raw:
        if "response_format" in sampling or "think" in sampling \
                or "reasoning_effort" in sampling:
            field = "format" if "response_format" in sampling else "think"
            raise ApiError(400, f"'{field}' needs the model's chat template; it cannot be "
                                "used with 'raw': true.", param=field)
        raw = {"model": req.model, "prompt": req.prompt, **sampling}
        greq = _openai(raw, "completion", _context_limit(req))
        # /v1/completions' default of 16 tokens is OpenAI's; Ollama's is no limit
        return msgspec.structs.replace(greq, max_tokens=sampling.get("max_tokens"))
    messages = ([{"role": "system", "content": req.system}] if req.system else []) \
        + [{"role": "user", "content": req.prompt}]
    raw = {"model": req.model, "messages": messages, **sampling}
    return _openai(raw, "chat", _context_limit(req))


_encoder = msgspec.json.Encoder()


def ndjson(objects: list[dict]) -> bytes:
    """Objects as newline-delimited JSON (one line each)."""
    return b"".join(_encoder.encode(o) + b"\n" for o in objects)


def created_at() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def load_reply(model: str, endpoint: str, keep_alive: Any) -> dict:
    """The answer to a request with nothing to generate (Ollama's way to load a model)."""
    reason = "unload" if keep_alive in (0, "0", "0s", "0m") else "load"
    body: dict[str, Any] = {"model": model, "created_at": created_at()}
    if endpoint == "chat":
        body["message"] = {"role": "assistant", "content": ""}
    else:
        body["response"] = ""
    return {**body, "done": True, "done_reason": reason}


def _logprobs(items: list[TokenLogprob]) -> list[dict]:
    return [{"token": t.token, "logprob": t.logprob, "bytes": t.bytes,
             "top_logprobs": [{"token": s, "logprob": v, "bytes": b} for s, v, b in t.top]}
            for t in items]


def _tool_calls(calls: list[dict]) -> tuple[list[dict], str]:
    """Ollama's tool calls (arguments as an object) from OpenAI's; a call whose arguments
    are not a JSON object (cut by the token limit) comes back as text."""
    out, text = [], ""
    for i, c in enumerate(calls):
        f = c["function"]
        try:
            args = json.loads(f["arguments"] or "{}")
        except ValueError:
            args = None
        if isinstance(args, dict):
            out.append({"id": c.get("id"), "function": {"index": i, "name": f["name"],
                                                        "arguments": args}})
        else:
            text += f["arguments"]
    return out, text


def _done_reason(finish_reason: str | None) -> str:
    return "length" if finish_reason == "length" else "stop"


class OllamaReply:
    """One request's answer in Ollama's shape, from the worker's events.

    Args:
        model: the name the client asked for (echoed in every object).
        endpoint: "chat" (`message`) or "generate" (`response`).
        started: `time.perf_counter()` when the request arrived (for the durations).
    """

    def __init__(self, model: str, endpoint: str, started: float) -> None:
        self.model, self.endpoint, self.started = model, endpoint, started
        self.fold = ChoiceFold()
        self.first_at: float | None = None
        self.usage: Usage | None = None
        self.error: str | None = None

    def _object(self, content: str, thinking: str = "", calls: list | None = None,
                logprobs: list | None = None, done: bool = False) -> dict:
        body: dict[str, Any] = {"model": self.model, "created_at": created_at()}
        if self.endpoint == "chat":
            msg: dict[str, Any] = {"role": "assistant", "content": content}
            if thinking:
                msg["thinking"] = thinking
            if calls:
                msg["tool_calls"] = calls
            body["message"] = msg
        else:
            body["response"] = content
            if thinking:
                body["thinking"] = thinking
        if logprobs:
            body["logprobs"] = logprobs
        body["done"] = done
        if done:
            body.update(self._stats())
        return body

    def _stats(self) -> dict:
        now = time.perf_counter()
        first = self.first_at if self.first_at is not None else now
        u = self.usage
        return {"done_reason": _done_reason(self.fold.finish_reason),
                "total_duration": int((now - self.started) * 1e9), "load_duration": 0,
                "prompt_eval_count": u.prompt_tokens if u else 0,
                "prompt_eval_duration": int((first - self.started) * 1e9),
                "eval_count": u.completion_tokens if u else 0,
                "eval_duration": int((now - first) * 1e9)}

    def add(self, batch: list) -> list[dict]:
        """Fold a batch of events; returns the stream objects they make."""
        out = []
        for ev in batch:
            if isinstance(ev, Deltas):
                if self.first_at is None:
                    self.first_at = time.perf_counter()
                self.fold.add(ev)
                content = ev.text + "".join(d.text for d in ev.deltas if d.field == "content")
                thinking = "".join(d.text for d in ev.deltas
                                   if d.field == "reasoning_content")
                logprobs = _logprobs(ev.logprobs) if ev.logprobs else None
                if content or thinking or logprobs:
                    out.append(self._object(content, thinking, logprobs=logprobs))
            elif isinstance(ev, Finished):
                if self.first_at is None:
                    self.first_at = time.perf_counter()
                self.fold.finish_reason = ev.finish_reason
                self.fold.final = ev.message
                if ev.index == 0 and self.endpoint == "chat" and ev.message is not None:
                    calls, text = _tool_calls(self.fold.chat_message().get("tool_calls", []))
                    if calls or text:  # Ollama sends a call whole, once it is complete
                        out.append(self._object(text, calls=calls))
            elif isinstance(ev, Usage):
                self.usage = ev
                out.append(self._object("", done=True))
            elif isinstance(ev, Failed):
                self.error = ev.message
                out.append({"error": ev.message})
        return out

    def final(self) -> dict:
        """The whole answer as one object (`"stream": false`)."""
        msg = self.fold.chat_message()
        calls, text = _tool_calls(msg.get("tool_calls", []))
        logprobs = _logprobs(self.fold.logprobs) if self.fold.logprobs else None
        return self._object((msg.get("content") or "") + text,
                            msg.get("reasoning_content") or "", calls, logprobs, done=True)


def _details(info: dict) -> dict:
    params = info.get("parameters") or 0
    size = f"{params / 1e9:.1f}B" if params >= 1e9 else f"{params / 1e6:.0f}M"
    arch = info.get("architecture") or ""
    return {"parent_model": "", "format": info.get("file_format", ""), "family": arch,
            "families": [arch] if arch else None, "parameter_size": size,
            "quantization_level": info.get("quantization", "")}


def _modified(info: dict) -> str:
    return datetime.fromtimestamp(info.get("created", 0), timezone.utc).isoformat() \
        .replace("+00:00", "Z")


def tag(name: str, info: dict) -> dict:
    """A model in /api/tags."""
    return {"name": name + LATEST, "model": name + LATEST, "modified_at": _modified(info),
            "size": info.get("weight_bytes", 0), "digest": "", "details": _details(info)}


def ps_entry(name: str, info: dict) -> dict:
    """A model in /api/ps: every served model is loaded, never unloaded."""
    return {"name": name + LATEST, "model": name + LATEST,
            "size": info.get("weight_bytes", 0), "digest": "", "details": _details(info),
            "expires_at": NEVER, "size_vram": 0, "context_length": info.get("context_length")}


def show(info: dict) -> dict:
    """/api/show: details, model_info (architecture, context length) and capabilities."""
    arch = info.get("architecture") or "unknown"
    return {"license": "", "modelfile": "", "parameters": "",
            "template": info.get("template", ""), "details": _details(info),
            "model_info": {"general.architecture": arch,
                           "general.parameter_count": info.get("parameters", 0),
                           f"{arch}.context_length": info.get("context_length")},
            "capabilities": info.get("capabilities", ["completion"]),
            "modified_at": _modified(info)}
