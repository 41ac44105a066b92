"""A random walk under a constraint: random logits, the mask applied, sampled to a stop."""

from __future__ import annotations

import numpy as np

from chat.decode import mask_words


def walk(constraint, vocab: list[bytes], stops: set[int], rng: np.random.Generator,
         *, max_tokens: int = 300, stop_bias: float = 0.0,
         closer_bias: float = 0.0) -> tuple[str, bool]:
    """Sample one output; returns (text, ended on a stop token).

    `closer_bias` is added to the logits of tokens holding a closing character, so that
    walks over a large vocabulary leave free-text regions within the budget."""

    size = len(vocab)
    buf = np.zeros(mask_words(size), dtype=np.uint32)
    stop_ids = np.fromiter(stops, dtype=np.int64)
    closers = _closers(vocab) if closer_bias else None
    out: list[bytes] = []
    for _ in range(max_tokens):
        logits = rng.standard_normal(size).astype(np.float32) * 2.0
        logits[stop_ids] += stop_bias
        if closers is not None:
            logits[closers] += closer_bias
        if constraint is not None and constraint.fill_mask(buf):
            allowed = np.unpackbits(buf.view(np.uint8), bitorder="little")[:size].astype(bool)
            logits[~allowed] = -np.inf
        token = int(np.argmax(logits))
        if constraint is not None:
            constraint.accept(token)
            assert constraint.active, f"the constraint gave up on its own mask: {vocab[token]!r} after {out!r}"
        if token in stops:  # a stop token ends the turn; its text is not part of it
            return b"".join(out).decode("utf-8", "replace"), True
        out.append(vocab[token])
    return b"".join(out).decode("utf-8", "replace"), False


_CLOSERS: dict[int, np.ndarray] = {}


def _closers(vocab: list[bytes]) -> np.ndarray:
    key = id(vocab)
    if key not in _CLOSERS:
        _CLOSERS[key] = np.array([i for i, b in enumerate(vocab)
                                  if any(c in b for c in (b'"', b"<", b"]", b"}", b">"))])
    return _CLOSERS[key]
