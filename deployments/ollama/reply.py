"""Ollama's answers: a request's events as NDJSON lines (streamed) or one object
(`OllamaReply`), the answer to a load request, and the workers' model descriptions as
/api/tags, /api/ps and /api/show list them."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from typing import Any, ClassVar

import msgspec
from starlette.responses import Response

from actors.events import Accepted, Deltas, Failed, Finished, TokenLogprob, Usage
from deployments.errors import ApiError
from deployments.openai.reply import ChoiceFold

LATEST = ":latest"  # the tag of every model here (`name` and `name:latest` are one)
# created_at of /api/ps's far-away expiry: a model here is never unloaded
NEVER = "2999-01-01T00:00:00Z"

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


def _tool_calls(calls: list[dict], cut: bool) -> tuple[list[dict], str]:
    """Ollama's tool calls (arguments as an object) from OpenAI's. When the token limit
    `cut` the answer, a last call whose arguments are not yet a whole JSON object (none
    written, or part of one) comes back as text, the call as the model was writing it
    (`{"name": ..., "arguments": ...` so far): never a call a client would run without its
    arguments. (A call cut before its name was whole is the worker's `cut_block`: its
    raw text, after these.)"""
    out, text = [], ""
    for i, c in enumerate(calls):
        f = c["function"]
        raw = f["arguments"]
        whole = bool(raw) or not (cut and i == len(calls) - 1)
        try:
            args = json.loads(raw or "{}") if whole else None
        except ValueError:
            args = None
        if isinstance(args, dict):
            out.append({"id": c.get("id"), "function": {"index": i, "name": f["name"],
                                                        "arguments": args}})
        else:
            text += f'{{"name": {json.dumps(f["name"], ensure_ascii=False)}, "arguments": {raw}'
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

    media_type = "application/x-ndjson"
    headers: ClassVar[dict[str, str]] = {}

    def __init__(self, model: str, endpoint: str, started: float) -> None:
        self.model, self.endpoint, self.started = model, endpoint, started
        self.choice = ChoiceFold()
        self.first_at: float | None = None
        self.usage: Usage | None = None
        self.error: str | None = None
        self.load_s = 0.0  # the model's load, when this request waited for it
        self.cut_block = ""  # a tool block cut before its call was named: text
        self.cut = False  # the output ended inside a call (a limit or a stop string)

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
        return {"done_reason": _done_reason(self.choice.finish_reason),
                "total_duration": int((now - self.started) * 1e9),
                "load_duration": int(self.load_s * 1e9),
                "prompt_eval_count": u.prompt_tokens if u else 0,
                # the time to the first token less the model's load, as Ollama's
                "prompt_eval_duration": int(max(0.0, first - self.started - self.load_s) * 1e9),
                "eval_count": u.completion_tokens if u else 0,
                "eval_duration": int((now - first) * 1e9)}

    def add(self, batch: list) -> list[dict]:
        """Fold a batch of events; returns the stream objects they make."""
        out = []
        for ev in batch:
            if isinstance(ev, Accepted):
                self.load_s = ev.load_s
            elif isinstance(ev, Deltas):
                if self.first_at is None:
                    self.first_at = time.perf_counter()
                self.choice.add(ev)
                content = ev.text + "".join(d.text for d in ev.deltas if d.field == "content")
                thinking = "".join(d.text for d in ev.deltas
                                   if d.field == "reasoning_content")
                logprobs = _logprobs(ev.logprobs) if ev.logprobs else None
                if content or thinking or logprobs:
                    out.append(self._object(content, thinking, logprobs=logprobs))
            elif isinstance(ev, Finished):
                if self.first_at is None:
                    self.first_at = time.perf_counter()
                self.choice.finish_reason = ev.finish_reason
                self.choice.final = ev.message
                self.cut = ev.cut or ev.finish_reason == "length"
                if ev.index == 0 and self.endpoint == "chat" and ev.message is not None:
                    calls, text = _tool_calls(self.choice.chat_message().get("tool_calls", []),
                                              self.cut)
                    self.cut_block = ev.cut_block
                    text += ev.cut_block
                    if calls or text:  # Ollama sends a call whole, once it is complete
                        out.append(self._object(text, calls=calls))
            elif isinstance(ev, Usage):
                self.usage = ev
                out.append(self._object("", done=True))
            elif isinstance(ev, Failed):
                self.error = ev.message
                out.append({"error": ev.message})
        return out

    # -- deployments.exchange.Reply ---------------------------------------------------
    def lead(self) -> bytes:
        return b""

    def render(self, batch: list) -> bytes:
        return ndjson(self.add(batch))

    def broken(self) -> bytes:
        return ndjson([{"error": "The model worker failed during the stream."}])

    def tail(self) -> bytes:
        return b""

    def fold(self, batch: list) -> None:
        self.add(batch)

    def answer(self) -> Response:
        if self.error is not None:
            raise ApiError(503, self.error, type="server_error")
        return Response(ndjson([self.final()]).rstrip(), media_type="application/json")

    def final(self) -> dict:
        """The whole answer as one object (`"stream": false`)."""
        msg = self.choice.chat_message()
        calls, text = _tool_calls(msg.get("tool_calls", []), self.cut)
        logprobs = _logprobs(self.choice.logprobs) if self.choice.logprobs else None
        return self._object((msg.get("content") or "") + text + self.cut_block,
                            msg.get("reasoning_content") or "", calls, logprobs, done=True)


def _details(info: dict) -> dict:
    params = info.get("parameters") or 0
    size = (f"{params / 1e9:.1f}B" if params >= 1e9 else f"{params / 1e6:.0f}M"
            if params >= 1e6 else f"{params / 1e3:.0f}K" if params >= 1e3
            else str(params) if params else "")  # 0: not known (an unreadable file)
    arch = info.get("architecture") or ""
    return {"parent_model": info.get("alias_of", ""), "format": info.get("file_format", ""),
            "family": arch,
            "families": [arch] if arch else None, "parameter_size": size,
            "quantization_level": info.get("quantization", "")}


def modelfile(info: dict, parameters: list[str]) -> str:
    """The Modelfile `ollama show --modelfile` prints: FROM the model (a variant's: the
    model it was made from), then its TEMPLATE (the Jinja one it renders with, which
    /api/create reads back), SYSTEM, PARAMETER and LICENSE lines."""
    name = info.get("id", "")
    lines = ['# Modelfile generated by "ollama show"',
             "# To build a new Modelfile based on this, replace FROM with:",
             f"# FROM {ollama_name(name)}", "",
             f"FROM {info.get('alias_of') or info.get('path') or name}"]
    if info.get("template"):
        lines.append(f'TEMPLATE """{info["template"]}"""')
    if info.get("system") is not None:
        lines.append(f'SYSTEM """{info["system"]}"""')
    lines += [f"PARAMETER {p}" for p in parameters]
    if info.get("license"):
        lines.append(f'LICENSE """{info["license"]}"""')
    return "\n".join(lines) + "\n"


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat().replace("+00:00", "Z")


def _modified(info: dict) -> str:
    return _iso(info.get("created", 0))


def ollama_name(name: str) -> str:
    """Ollama's name of a model: with its tag (`latest` unless the name has one)."""
    return name if ":" in name else name + LATEST


def _digest(info: dict) -> str:
    """A model's digest as Ollama lists one: 64 hex digits, without `sha256:`."""
    return info.get("digest", "").removeprefix("sha256:")


def tag(name: str, info: dict) -> dict:
    """A model in /api/tags."""
    full = ollama_name(name)
    return {"name": full, "model": full, "modified_at": _modified(info),
            "size": info.get("weight_bytes", 0), "digest": _digest(info),
            "details": _details(info)}


def ps_entry(name: str, info: dict) -> dict:
    """A model in /api/ps: a configured model never expires; a library model's
    `expires_at` is when its keep_alive ends (seconds since the epoch, inf: never)."""
    full = ollama_name(name)
    expires = info.get("expires_at", float("inf"))
    return {"name": full, "model": full, "size": info.get("weight_bytes", 0),
            "digest": _digest(info), "details": _details(info),
            "expires_at": NEVER if expires == float("inf") else _iso(expires), "size_vram": 0,
            "context_length": info.get("context_length")}


def show(info: dict) -> dict:
    """/api/show: details, model_info (architecture, context length) and capabilities; a
    library variant's system prompt, parameters (Modelfile lines: `temperature 0.2`) and
    license; the Modelfile that makes the model again (`modelfile`)."""
    arch = info.get("architecture") or "unknown"
    lines = [f"{k} {json.dumps(x) if isinstance(x, str) else x}"
             for k, v in (info.get("variant_options") or {}).items()
             for x in (v if isinstance(v, list) else [v])]
    params = "\n".join(lines)
    return {"license": info.get("license", ""), "modelfile": modelfile(info, lines),
            "parameters": params,
            **({"system": info["system"]} if info.get("system") is not None else {}),
            "template": info.get("template", ""), "details": _details(info),
            "model_info": {"general.architecture": arch,
                           "general.parameter_count": info.get("parameters", 0),
                           f"{arch}.context_length": info.get("context_length"),
                           # an embedding model's vector size, where RAG tools read it
                           **({f"{arch}.embedding_length": info["embedding_length"]}
                              if info.get("embedding_length") else {})},
            "capabilities": info.get("capabilities", ["completion"]),
            "modified_at": _modified(info)}
