"""Embedding answers: the worker's vectors (float32, L2-normalized) as OpenAI's list of
embedding objects (floats, or base64 of the little-endian float32 bytes as the openai SDK
decodes them), as Ollama's `embeddings` (/api/embed) and `embedding` (/api/embeddings), or
as llama-server's list of `{"index", "embedding": [vector]}` (/embedding: its pooled
vector as the one row of a matrix; `--pooling none`'s per-token rows are not served here).
Never streamed."""

from __future__ import annotations

import base64
import time

import msgspec
import numpy as np
from starlette.responses import JSONResponse, Response

from actors.embedding import finish
from actors.events import Accepted, Embeddings, Failed, Usage
from deployments.errors import ApiError
from deployments.exchange import WholeReply

_encoder = msgspec.json.Encoder()


class _EmbedFold(WholeReply):
    """What every embedding reply collects of the events."""

    def __init__(self) -> None:
        self.result: Embeddings | None = None
        self.usage: Usage | None = None
        self.started = time.perf_counter()
        self.load_s = 0.0  # the model's load, when this request waited for it

    def fold(self, batch: list) -> None:
        for ev in batch:
            if isinstance(ev, Accepted):
                self.load_s = ev.load_s
            elif isinstance(ev, Embeddings):
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


INT16_RANGE = 32760.0  # llama.cpp's `embd_normalize` 0: the largest magnitude to this


def renormalized(unit: np.ndarray, p: int) -> np.ndarray:
    """Unit (L2) rows normalized as llama.cpp's `embd_normalize` `p` asks (0: the largest
    magnitude to INT16_RANGE, else the p-norm to 1): every norm scales with the vector, so
    the unit vector's is the original's; a zero row stays zero."""
    if p == 2:
        return unit
    rows = unit.astype(np.float64)
    top = np.abs(rows).max(axis=1)
    if p == 0:
        scale = top / INT16_RANGE
    else:  # a p-norm as top * norm(rows / top): the powers of values below 1 underflow
        # otherwise (a unit row's p-norm came out 0 from p = 700, and the row all zeros)
        with np.errstate(divide="ignore", invalid="ignore"):
            scaled = np.where(top[:, None] > 0, np.abs(rows) / top[:, None], 0.0)
        scale = top * (scaled ** p).sum(axis=1) ** (1.0 / p)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(scale[:, None] > 0, rows / scale[:, None], 0.0)
    return out.astype(np.float32)


class LlamaEmbedReply(_EmbedFold):
    """llama-server's /embedding answer, normalized as its `embd_normalize` asks."""

    def __init__(self, normalize: int = 2) -> None:
        super().__init__()
        self.normalize = normalize

    def answer(self) -> Response:
        rows = renormalized(self.matrix(), self.normalize).tolist()
        return Response(_encoder.encode([{"index": i, "embedding": [row]}
                                         for i, row in enumerate(rows)]),
                        media_type=self.media_type)


class OllamaEmbedReply(_EmbedFold):
    """/api/embed's answer (`legacy`: /api/embeddings', one `embedding`). `dimensions`:
    Ollama's rule, each unit vector's first this many normalized again where fewer than
    the model's (more, 0 or less: the whole vector)."""

    def __init__(self, model: str, legacy: bool, dimensions: int | None = None) -> None:
        super().__init__()
        self.model, self.legacy, self.dimensions = model, legacy, dimensions

    def empty(self, load_s: float | None = None) -> Response:
        """The answer to a request with nothing to embed (it loads the model: `load_s`, the
        load's seconds; None: the model is always loaded, no time taken)."""
        if self.legacy:
            return JSONResponse({"embedding": []})
        total = 0 if load_s is None else int((time.perf_counter() - self.started) * 1e9)
        load_s = load_s or 0.0
        return JSONResponse({"model": self.model, "embeddings": [], "total_duration": total,
                             "load_duration": int(load_s * 1e9), "prompt_eval_count": 0})

    def answer(self) -> Response:
        m = self.matrix()
        if self.dimensions is not None and 0 < self.dimensions < m.shape[1]:
            m = finish(m, self.dimensions)  # as the worker cuts OpenAI's `dimensions`
        m = m.tolist()
        if self.legacy:
            return Response(_encoder.encode({"embedding": m[0]}), media_type=self.media_type)
        total = int((time.perf_counter() - self.started) * 1e9)
        tokens = self.usage.prompt_tokens if self.usage else sum(self.result.tokens)
        return Response(_encoder.encode({"model": self.model, "embeddings": m,
                                         "total_duration": total,
                                         "load_duration": int(self.load_s * 1e9),
                                         "prompt_eval_count": tokens}),
                        media_type=self.media_type)
