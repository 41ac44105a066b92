"""Pooling: how a model turns its last hidden states into one embedding vector per input
(mean, CLS or last token, then sentence-transformers' Dense layers if any), or a reranker's
score per query-document pair ("rank", llama.cpp's LLAMA_POOLING_TYPE_RANK: a cross-encoder's
first token through its classification head, or a decoder reranker's last token through the
difference of its two answer tokens' rows, as llama.cpp reads Qwen3-Reranker), and `pool`,
which does it for a packed batch.

The vectors are left unnormalized: L2 normalization and Matryoshka truncation are the
caller's (they depend on the request, not the model).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import numpy as np

from npu.errors import ModelError

MODES = ("mean", "cls", "last", "max", "rank")
RANK = "rank"
# llama.cpp's `{arch}.pooling_type` enum (LLAMA_POOLING_TYPE_*): 0 none, 1 mean, 2 cls,
# 3 last, 4 rank (a reranker's classification head)
GGUF_POOLING = {1: "mean", 2: "cls", 3: "last", 4: RANK}
DENSE_ACTIVATIONS = ("identity", "tanh")
# what a reranker's scores go through: sigmoid (sentence-transformers' CrossEncoder with one
# label, vLLM's default), the raw logit (llama-server's), or tanh (a config that names it)
SCORE_ACTIVATIONS = ("sigmoid", "identity", "tanh")
# the token a reranker's head reads: a cross-encoder's first ([CLS], <s>), a decoder's last
# (where it would answer its prompt's question)
RANK_POSITIONS = ("first", "last")
# what a decoder reranker's prompt is filled with (npu.load.pooling; actors.rerank fills it)
PROMPT_SLOTS = ("{query}", "{document}")


class Dense(msgspec.Struct, frozen=True, kw_only=True):
    """A sentence-transformers Dense layer: y = act(x @ weight.T + bias).

    Attributes:
        weight: float32 [out, in].
        bias: float32 [out], or None.
        activation: "identity" or "tanh" (the two sentence-transformers models use).
    """

    weight: np.ndarray
    bias: np.ndarray | None = None
    activation: str = "identity"

    def __post_init__(self) -> None:
        if self.activation not in DENSE_ACTIVATIONS:
            raise ModelError(f"Dense activation {self.activation!r} is not supported "
                             f"(supported: {', '.join(DENSE_ACTIVATIONS)})")

    def __call__(self, x: np.ndarray) -> np.ndarray:
        y = x @ self.weight.T
        if self.bias is not None:
            y = y + self.bias
        return np.tanh(y) if self.activation == "tanh" else y


class Pooling(msgspec.Struct, frozen=True, kw_only=True):
    """A model's pooling.

    Attributes:
        mode: "mean" (over the input's tokens), "cls" (the first token), "last" (the last
            token: decoder embedders such as Qwen3-Embedding), "max" (per dimension) or
            "rank" (a reranker: the token `position` names through `dense`, the
            classification head, to one score per input, then `activation`).
        dense: sentence-transformers Dense layers applied after pooling, in order (rank:
            the head's layers: BERT's pooler or RoBERTa's dense with tanh, then the output
            projection).
        activation: rank: what the scores go through ("sigmoid", "identity": the raw
            logit, "tanh"); "identity" for the other modes.
        position: rank: the token the head reads, "first" (a cross-encoder's) or "last" (a
            decoder reranker's: its head is the answer tokens' rows, true less false).
        prompt: rank on a decoder: the text a query-document pair is written into, with
            the slots {query} and {document} (llama.cpp's rerank template), and
            {instruction} where a request may name its task; None for a cross-encoder
            (the tokenizer pairs the two texts).
        source: where the mode came from (for logs and model listings).
    """

    mode: str = "mean"
    dense: tuple[Dense, ...] = ()
    activation: str = "identity"
    position: str = "first"
    prompt: str | None = None
    source: str = "default"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ModelError(f"pooling {self.mode!r} is not supported (supported: "
                             f"{', '.join(MODES)})")
        if self.activation not in SCORE_ACTIVATIONS:
            raise ModelError(f"score activation {self.activation!r} is not supported "
                             f"(supported: {', '.join(SCORE_ACTIVATIONS)})")
        if self.mode == RANK:
            if not self.dense or self.dense[-1].weight.shape[0] != 1:
                rows = self.dense[-1].weight.shape[0] if self.dense else 0
                raise ModelError(f"a reranker's head must end in one score; it gives {rows} "
                                 "(a classifier of several labels does not rerank)")
            if self.position not in RANK_POSITIONS:
                raise ModelError(f"a reranker's head reads the {self.position!r} token "
                                 f"(supported: {', '.join(RANK_POSITIONS)})")
            missing = [s for s in PROMPT_SLOTS if self.prompt is not None and s not in self.prompt]
            if missing:
                raise ModelError(f"a reranker's prompt lacks the slots {', '.join(missing)}")
        elif self.activation != "identity" or self.prompt is not None:
            raise ModelError(f"pooling {self.mode!r} takes no score activation or prompt")

    def dims(self, hidden_size: int) -> int:
        """The embedding's width for a model of `hidden_size`.

        Raises:
            ModelError: a Dense layer's input is not the width before it.
        """
        width = hidden_size
        for i, layer in enumerate(self.dense):
            if layer.weight.shape[1] != width:
                raise ModelError(f"Dense layer {i} takes {layer.weight.shape[1]} values, the "
                                 f"layer before it gives {width}")
            width = int(layer.weight.shape[0])
        return width


def pool(hidden: np.ndarray, lengths: Sequence[int], pooling: Pooling) -> np.ndarray:
    """One vector per input from the packed hidden states `hidden` [sum(lengths), H] (input
    i's rows follow input i-1's): float32 [len(lengths), dims]. Each row depends only on its
    own input's rows (the same whatever else is in the batch)."""
    ends = np.cumsum(lengths)
    starts = ends - np.asarray(lengths)
    mode = pooling.mode
    if mode == "cls" or (mode == RANK and pooling.position == "first"):
        out = hidden[starts]
    elif mode in ("last", RANK):
        out = hidden[ends - 1]
    elif mode == "mean":
        out = np.stack([hidden[s:e].mean(axis=0, dtype=np.float32) for s, e in zip(starts, ends)])
    else:
        out = np.stack([hidden[s:e].max(axis=0) for s, e in zip(starts, ends)])
    out = np.asarray(out, dtype=np.float32)
    if pooling.dense:  # row by row: a BLAS product's sums may group rows differently
        out = np.concatenate([_dense(pooling.dense, row[None]) for row in out])
    if pooling.activation == "sigmoid":  # 1 / (1 + e^-x), without overflow for large |x|
        out = np.exp(-np.logaddexp(0, -out))
    elif pooling.activation == "tanh":
        out = np.tanh(out)
    return np.ascontiguousarray(out, dtype=np.float32)


def _dense(layers: Sequence[Dense], x: np.ndarray) -> np.ndarray:
    for layer in layers:
        x = layer(x)
    return x
