"""/completion's and /infill's answer in llama-server's own shape (not OpenAI's): one object
with `content`, `tokens` (the ids written, where `return_tokens` asks: with each piece
when streamed), `stop: true`, `model`, `tokens_predicted`, `tokens_evaluated`,
`generation_settings`, `prompt` (the prompt the model read, FIM tokens written),
`has_new_line`,
`truncated`, `stop_type` ("eos", "word" or "limit"), `stopping_word`, `tokens_cached`
and `timings` (llama-server's names: prompt_n, prompt_ms, predicted_n, ...); only the
`response_fields` paths where the request names them (`"timings/prompt_n"` is a key of
its own, as llama-server answers it). Streamed: `data: {...}` events with each piece of
`content` and `stop: false`, then the whole object with `content` empty; no [DONE]. A
batch of prompts: a JSON array of the whole objects, each with its prompt's `index`.
Errors in a stream in llama-server's shape (deployments.errors.llama_error_body)."""

from __future__ import annotations

import time
from typing import Any

import msgspec
from starlette.responses import Response

from actors.events import Accepted, Deltas, Failed, Finished, Prompt, TokenLogprob, Usage
from deployments.errors import ApiError, llama_error_body
from deployments.exchange import WholeReply

_encoder = msgspec.json.Encoder()
STOP_TYPES = {"length": "limit"}  # else "eos", or "word" where a stop string ended it


def _sse(obj: Any) -> bytes:
    return b"data: " + _encoder.encode(obj) + b"\n\n"


def probabilities(items: list[TokenLogprob]) -> list[dict]:
    """llama-server's `completion_probabilities` (its `n_probs`, before sampling): each
    token's id, text, bytes and logprob, and its most likely alternatives alike."""
    return [{"id": t.id, "token": t.token, "bytes": t.bytes, "logprob": t.logprob,
             "top_logprobs": [{"id": i, "token": s, "bytes": b, "logprob": v}
                              for i, (s, v, b) in zip(t.top_ids, t.top)]}
            for t in items]


def nested(paths: list[str], body: dict) -> dict:
    """llama-server's `response_fields`: each path (keys joined by "/") that names a value,
    under the path itself."""
    out = {}
    for path in paths:
        value: Any = body
        for key in path.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            out[path] = value
    return out


class NativeReply:
    """One /completion or /infill request's answer (deployments.exchange.Reply).

    Args:
        model: the model as the client named it (or the one served).
        started: `time.perf_counter()` when the request arrived (for `timings`).
        settings: `generation_settings`.
        fields: `response_fields` (None: every field).
        stream: whether the answer streams (the last object's `content` is then empty).
        index: the prompt's in a batch (llama-server's `index`).
    """

    headers: dict[str, str] = {}

    def __init__(self, model: str, started: float, *, settings: dict[str, Any],
                 fields: list[str] | None = None, stream: bool = False,
                 index: int = 0) -> None:
        self.model, self.started, self.settings = model, started, settings
        self.fields, self.stream, self.index = fields, stream, index
        self.media_type = "text/event-stream" if stream else "application/json"
        self.content: list[str] = []
        self.prompt = ""
        self.pieces = 0
        self.probs: list[dict] = []  # completion_probabilities, where asked (n_probs)
        self.ids: list[int] = []  # the tokens written, where asked (return_tokens)
        self.first_at: float | None = None
        self.finished: Finished | None = None
        self.usage: Usage | None = None
        self.prompt_tokens = 0

    def _add(self, ev: Any) -> list[dict]:
        """Fold one event; the stream objects it makes."""
        if isinstance(ev, Accepted):
            self.prompt_tokens = ev.prompt_tokens
        elif isinstance(ev, Prompt):
            self.prompt = ev.text
        elif isinstance(ev, Deltas) and ev.index == 0:
            if self.first_at is None:
                self.first_at = time.perf_counter()
            probs = probabilities(ev.logprobs) if ev.logprobs else []
            self.probs += probs
            self.ids += ev.ids or []
            if ev.text or probs or ev.ids:
                self.content.append(ev.text)
                self.pieces += 1
                piece = {"index": self.index, "content": ev.text, "tokens": ev.ids or [],
                         "stop": False,
                         "id_slot": -1, "tokens_predicted": ev.tokens or self.pieces,
                         "tokens_evaluated": self.prompt_tokens}
                return [{**piece, "completion_probabilities": probs} if probs else piece]
        elif isinstance(ev, Finished) and ev.index == 0:
            if self.first_at is None:
                self.first_at = time.perf_counter()
            self.finished = ev
        elif isinstance(ev, Usage):
            self.usage = ev
            return [self.final()]
        elif isinstance(ev, Failed):
            raise ApiError(503, ev.message, type="server_error")
        return []

    def final(self) -> dict:
        """The whole answer (its `content` empty when streamed: the pieces were sent)."""
        now = time.perf_counter()
        first = self.first_at if self.first_at is not None else now
        u = self.usage or Usage(prompt_tokens=self.prompt_tokens, completion_tokens=0)
        f = self.finished
        reason = f.finish_reason if f is not None else "stop"
        stop_type = STOP_TYPES.get(reason, "word" if f is not None and f.stop else "eos")
        content = "" if self.stream else "".join(self.content)
        computed = u.prompt_tokens - u.cached_tokens
        prompt_ms, predicted_ms = (first - self.started) * 1e3, (now - first) * 1e3
        body = {
            "index": self.index, "content": content,
            "tokens": [] if self.stream else self.ids, "id_slot": -1, "stop": True,
            "model": self.model, "tokens_predicted": u.completion_tokens,
            "tokens_evaluated": u.prompt_tokens, "generation_settings": self.settings,
            "prompt": self.prompt, "has_new_line": "\n" in "".join(self.content),
            "truncated": False, "stop_type": stop_type,
            "stopping_word": (f.stop or "") if f is not None else "",
            "tokens_cached": u.prompt_tokens + u.completion_tokens,
            "timings": {
                "cache_n": u.cached_tokens, "prompt_n": computed, "prompt_ms": prompt_ms,
                "prompt_per_token_ms": prompt_ms / max(computed, 1),
                "prompt_per_second": 1e3 * computed / prompt_ms if prompt_ms > 0 else 0.0,
                "predicted_n": u.completion_tokens, "predicted_ms": predicted_ms,
                "predicted_per_token_ms": predicted_ms / max(u.completion_tokens, 1),
                "predicted_per_second": (1e3 * u.completion_tokens / predicted_ms
                                         if predicted_ms > 0 else 0.0)}}
        if self.probs and not self.stream:  # streamed: with each piece
            body["completion_probabilities"] = self.probs
        return nested(self.fields, body) if self.fields else body  # [] as none

    # -- deployments.exchange.Reply ---------------------------------------------------
    def lead(self) -> bytes:
        return b""

    def render(self, batch: list) -> bytes:
        out = b""
        for ev in batch:
            try:
                out += b"".join(map(_sse, self._add(ev)))
            except ApiError as err:
                out += _sse(llama_error_body(err))
        return out

    def broken(self) -> bytes:
        return _sse(llama_error_body(ApiError(500, "The model worker failed during the "
                                                   "stream.", type="server_error")))

    def tail(self) -> bytes:
        return b""

    def fold(self, batch: list) -> None:
        for ev in batch:
            self._add(ev)

    def answer(self) -> Response:
        return Response(_encoder.encode(self.final()), media_type=self.media_type)


class NativeBatchReply(WholeReply):
    """The answer to a /completion of several prompts (each its own worker request, folded
    by its own NativeReply): their whole objects in one JSON array, in the prompts' order.
    Never streamed (the request path refuses a streamed batch)."""

    def __init__(self, parts: list[NativeReply]) -> None:
        self.parts = parts

    def fold(self, batch: list) -> None:  # the parts fold their own events
        raise NotImplementedError("a batch's parts fold their own events")

    def answer(self) -> Response:
        return Response(_encoder.encode([p.final() for p in self.parts]),
                        media_type=self.media_type)


def props(name: str, info: dict[str, Any]) -> dict[str, Any]:
    """llama-server's GET /props of a model's description (the worker's, with its template;
    a models folder's from its header): what clients read there, the context (`n_ctx`),
    the slots, the model's path and chat template; no media; this server's own endpoints
    (/metrics always, no /slots, no POST /props)."""
    template = info.get("template") or info.get("chat_template") or ""
    return {"default_generation_settings": {"n_ctx": info.get("context_length"),
                                            "params": {"n_predict": -1}},
            "total_slots": info.get("max_batch", 1), "model_alias": name,
            "model_path": info.get("path", ""),
            "modalities": {"vision": False, "video": False, "audio": False},
            "endpoint_slots": False, "endpoint_props": False, "endpoint_metrics": True,
            "chat_template": template, "build_info": "flm-serve", "is_sleeping": False}
