"""Embedding answers: the worker's vectors (float32, L2-normalized) as OpenAI's list of
embedding objects (floats, or base64 of the little-endian float32 bytes as the openai SDK
decodes them) or as Ollama's `embeddings` (/api/embed) and `embedding` (/api/embeddings).
Never streamed."""

from __future__ import annotations

import base64
import time

import msgspec
import numpy as np
from starlette.responses import JSONResponse, Response

from actors.events import Embeddings, Failed, Usage
from deployments.errors import ApiError
from deployments.exchange import WholeReply

_encoder = msgspec.json.Encoder()


class _EmbedFold(WholeReply):
    """What every embedding reply collects of the events."""

    def __init__(self) -> None:
        self.result: Embeddings | None = None
        self.usage: Usage | None = None
        self.started = time.perf_counter()

    def fold(self, batch: list) -> None:
        for ev in batch:
            if isinstance(ev, Embeddings):
                self.result = ev
            elif isinstance(ev, Usage):
                self.usage = ev
            elif isinstance(ev, Failed):
                raise ApiError(503, ev.message, type="server_error")

    def matrix(self) -> np.ndarray:
        r = self.result
        if r is None:
            raise ApiError(503, "The model worker ended without the embeddings.",
                           type="server_error")
        return np.frombuffer(r.vectors, dtype="<f4").reshape(len(r.tokens), r.dims)



class OpenAIEmbedReply(_EmbedFold):
    def __init__(self, model: str, encoding_format: str) -> None:
        super().__init__()
        self.model, self.encoding_format = model, encoding_format

    def answer(self) -> Response:
        m = self.matrix()
        if self.encoding_format == "base64":
            rows = [base64.b64encode(row.tobytes()).decode() for row in m]
        else:
            rows = m.tolist()
        tokens = self.usage.prompt_tokens if self.usage else sum(self.result.tokens)
        body = {"object": "list", "model": self.model,
                "data": [{"object": "embedding", "index": i, "embedding": row}
                         for i, row in enumerate(rows)],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
        return Response(_encoder.encode(body), media_type=self.media_type)


class OllamaEmbedReply(_EmbedFold):
    """/api/embed's answer (`legacy`: /api/embeddings', one `embedding`)."""

    def __init__(self, model: str, legacy: bool) -> None:
        super().__init__()
        self.model, self.legacy = model, legacy

    def empty(self) -> Response:
        """The answer to a request with nothing to embed (it loads the model)."""
        if self.legacy:
            return JSONResponse({"embedding": []})
        return JSONResponse({"model": self.model, "embeddings": [], "total_duration": 0,
                             "load_duration": 0, "prompt_eval_count": 0})

    def answer(self) -> Response:
        m = self.matrix().tolist()
        if self.legacy:
            return Response(_encoder.encode({"embedding": m[0]}), media_type=self.media_type)
        total = int((time.perf_counter() - self.started) * 1e9)
        tokens = self.usage.prompt_tokens if self.usage else sum(self.result.tokens)
        return Response(_encoder.encode({"model": self.model, "embeddings": m,
                                         "total_duration": total, "load_duration": 0,
                                         "prompt_eval_count": tokens}),
                        media_type=self.media_type)
