"""Sampler: temperature, top-k, top-p, min-p, repetition/presence/frequency penalties and a
per-request seed, under an optional token mask.

The penalties read the whole sequence (`repeat_last_n` -1: the repetition penalty every
token of the prompt and the output, as HF and vLLM do; frequency and presence the output's
counts, OpenAI's) or, as llama.cpp and Ollama do, a window of the latest `repeat_last_n`
tokens of prompt and output for all three (0: no penalty).

The mask (uint32 words, bit i of word i // 32 set when token i may be sampled) sets the
disallowed logits to -inf on the sampler's own float32 copy, after the penalties and before
top-k/top-p; the engine's logits are never written. If a sample still lands outside the
mask (NaN logits), the best allowed token is used instead.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Sequence

import msgspec
import numpy as np


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True):
    """Sampling options; temperature 0 is greedy."""

    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_last_n: int = -1  # the penalties' window: -1 the whole sequence, 0 off
    seed: int | None = None
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit (OpenAI's)
    # vLLM's: `end_ids` (the end tokens) are not sampled before this many tokens are
    min_tokens: int = 0
    end_ids: tuple[int, ...] = ()


def allowed_from_mask(mask: np.ndarray, size: int) -> np.ndarray:
    """The bool array of allowed tokens from a uint32 bitset."""
    return np.unpackbits(mask.view(np.uint8), bitorder="little")[:size].astype(bool)


class Sampler:
    """Samples one request's tokens.

    Args:
        params: the options.
        vocab_size: the logits width.
        prompt_ids: the prompt, which the repetition penalty also counts (as HF does;
            a window's penalties too, as llama.cpp's).
    """

    def __init__(self, params: SamplingParams, vocab_size: int,
                 prompt_ids: list[int] | None = None) -> None:
        self.params = p = params
        self.vocab_size = vocab_size
        self.rng = np.random.default_rng(None if p.seed is None else p.seed % (1 << 64))
        self._seen = np.zeros(vocab_size, dtype=bool)
        # the working copy of a row, reused every step: fresh vocabulary-sized temporaries
        # are mapped and unmapped by malloc each time, and their page faults cost more than
        # the arithmetic (a 151k row: 1.5 -> 0.8 ms with top-k and a penalty)
        self._x = np.empty(vocab_size, dtype=np.float32)
        # the output's counts, or with a window the window's (prompt tokens included)
        self._counts = np.zeros(vocab_size, dtype=np.int32)
        bias = {t: v for t, v in (p.logit_bias or {}).items() if 0 <= t < vocab_size}
        self._bias_ids = np.fromiter(bias, dtype=np.int64, count=len(bias))
        self._bias = np.fromiter(bias.values(), dtype=np.float32, count=len(bias))
        penalties = p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 \
            or p.frequency_penalty != 0.0
        self._written = 0  # tokens accepted (for min_tokens)
        self._end_ids = np.array([t for t in p.end_ids if 0 <= t < vocab_size], dtype=np.int64)
        if not p.min_tokens:
            self._end_ids = self._end_ids[:0]
        # whether a row needs _prepare's arithmetic (the end ids' part ends at min_tokens)
        self._adjusted = (penalties and p.repeat_last_n != 0) or bool(bias)
        self._penalized = self._adjusted or bool(self._end_ids.size)
        self._window: deque[int] | None = None
        ids = np.asarray(prompt_ids or [], dtype=np.int64)
        ids = ids[(ids >= 0) & (ids < vocab_size)]
        if p.repeat_last_n > 0:
            # no sequence is longer than sys.maxsize: a window past it (an API's 2**70) is
            # that one, which deque can hold
            last_n = min(p.repeat_last_n, sys.maxsize)
            self._window = deque(maxlen=last_n)
            for token in ids[-last_n:].tolist():
                self._slide(token)
        else:
            self._seen[ids] = True

    def _slide(self, token: int) -> None:
        """Take `token` into the window, the oldest out of it when full."""
        window = self._window
        if len(window) == window.maxlen:
            self._counts[window[0]] -= 1
        window.append(token)
        self._counts[token] += 1

    def accept(self, token: int) -> None:
        """Count a generated token (for the penalties and min_tokens)."""
        self._written += 1
        if self._end_ids.size and self._written >= self.params.min_tokens:
            self._end_ids = self._end_ids[:0]  # the end tokens may come now
            self._penalized = self._adjusted
        if not 0 <= token < self.vocab_size:
            return
        if self._window is not None:
            self._slide(token)
        else:
            self._seen[token] = True
            self._counts[token] += 1

    def sample(self, logits: np.ndarray, mask: np.ndarray | None = None) -> int:
        """One token from `logits` [V] (not modified), under `mask` if given."""
        x, allowed = self._prepare(logits, mask)
        return self._checked(self._draw(x), logits, allowed)

    def _prepare(self, logits: np.ndarray, mask: np.ndarray | None
                 ) -> tuple[np.ndarray, np.ndarray | None]:
        """A float32 copy of the logits (the sampler's working row, valid until its next
        call) with the penalties and the mask applied, and the allowed tokens (None without
        a mask)."""
        p = self.params
        x = self._x
        x[:] = logits[: self.vocab_size]
        if self._penalized and p.repeat_last_n != 0:
            if p.repetition_penalty != 1.0:
                seen = self._seen if self._window is None else self._counts > 0
                x[seen] = np.where(x[seen] > 0, x[seen] / p.repetition_penalty,
                                   x[seen] * p.repetition_penalty)
            if p.frequency_penalty or p.presence_penalty:
                x -= p.frequency_penalty * self._counts + p.presence_penalty * (self._counts > 0)
        if self._bias.size:
            x[self._bias_ids] += self._bias
        if self._end_ids.size:
            x[self._end_ids] = -np.inf
        allowed = None
        if mask is not None:
            allowed = allowed_from_mask(mask, self.vocab_size)
            x[~allowed] = -np.inf
        return x, allowed

    def _checked(self, token: int, logits: np.ndarray, allowed: np.ndarray | None) -> int:
        """`token`, or the best allowed token if it lies outside the mask (NaN logits)."""
        if allowed is not None and not allowed[token]:
            return self._best_allowed(logits, allowed)
        return token

    def _draw(self, x: np.ndarray) -> int:
        """A token from the prepared row `x`, which it overwrites."""
        p = self.params
        if p.temperature <= 0.0:
            token = int(np.argmax(x))
            return token if not np.isnan(x[token]) else _nanargmax(x)
        x /= np.float32(p.temperature)
        kept = None  # with top-k: the tokens it keeps (ties included), the rest has p = 0
        if p.top_k and 0 < p.top_k < x.size:
            kth = np.partition(x, -p.top_k)[-p.top_k]
            if not np.isnan(kth):  # NaN: answered below as the best non-NaN token
                kept = np.flatnonzero(x >= kth if kth > -np.inf else x > -np.inf)
        top = np.max(x)
        if not np.isfinite(top):
            return _nanargmax(x)
        if kept is not None:
            x = x[kept]
        x -= top
        probs = np.exp(x, out=x)
        probs /= probs.sum()
        if p.min_p > 0.0:
            probs[probs < p.min_p * probs.max()] = 0.0
        if p.top_p < 1.0:
            ids, weights = _top_p(probs, p.top_p)
        else:
            ids, weights = None, probs
        pick = _pick(weights, self.rng)
        if pick is None:
            token = int(np.argmax(probs))
        else:
            token = int(ids[pick]) if ids is not None else pick
        return int(kept[token]) if kept is not None else token

    def verify(self, logits: np.ndarray, draft: int, mask: np.ndarray | None = None) -> int:
        """A token from `logits` [V] under `mask` where a deterministic drafter proposed
        `draft` (speculative decoding); the draft is kept when the token is the draft.

        The token is `sample`'s own draw, so the draft is kept with probability p(draft)
        and, when it is not, the token follows p without the draft, renormalized: the
        standard acceptance rule (Leviathan et al. 2023) for a draft distribution that is
        a point mass, in the coupling that keeps the draw of every place what it would be
        without drafts. p is the sampler's final distribution (penalties, mask,
        temperature, top-k, min-p, top-p); a seeded request gives the same tokens with or
        without drafts, and greedy keeps the draft only when it is the argmax."""
        return self.sample(logits, mask)

    @staticmethod
    def _best_allowed(logits: np.ndarray, allowed: np.ndarray) -> int:
        x = np.where(np.isnan(logits[: allowed.size]), -np.inf, logits[: allowed.size])
        x = np.where(allowed, x, -np.inf)
        if np.isneginf(x).all():
            return int(np.flatnonzero(allowed)[0]) if allowed.any() else 0
        return int(np.argmax(x))


BLOCK_ELEMENTS = 1 << 13  # logits sampled together (32 KB of float32)


def sample_rows(samplers: list[Sampler], logits: np.ndarray,
                masks: list[np.ndarray | None] | None = None) -> list[int]:
    """One token for each row of `logits` [B, V] from that row's sampler: the tokens (and
    random draws) are exactly those of calling each sampler's `sample` in turn, but rows
    with the same temperature, top-p and min-p (and no top-k, which one row samples from
    its k best alone) go through one set of array operations (penalties and masks are
    applied per row first), so a decode step samples its batch in a few calls.
    """
    masks = masks if masks is not None else [None] * len(samplers)
    tokens = [0] * len(samplers)
    groups: dict[tuple[float, float, float], list[int]] = {}
    for i, smp in enumerate(samplers):
        p = smp.params
        if p.temperature > 0.0 and not p.top_k and smp.vocab_size == logits.shape[1]:
            groups.setdefault((p.temperature, p.top_p, p.min_p), []).append(i)
        else:
            tokens[i] = smp.sample(logits[i], masks[i])
    # blocks of rows that stay in the CPU's cache through the several passes of a draw
    # (a [32, 151k] block does not: batched it is 2x slower than row by row)
    per_block = max(1, BLOCK_ELEMENTS // max(1, logits.shape[1]))
    blocks = [(key, rows[k : k + per_block]) for key, rows in groups.items()
              for k in range(0, len(rows), per_block)]
    for (temperature, top_p, min_p), rows in blocks:
        if len(rows) == 1:
            i = rows[0]
            tokens[i] = samplers[i].sample(logits[i], masks[i])
            continue
        x = np.array(logits[rows], dtype=np.float32)
        allowed: list[np.ndarray | None] = [None] * len(rows)
        for j, i in enumerate(rows):
            smp = samplers[i]
            if smp._penalized or masks[i] is not None:
                x[j], allowed[j] = smp._prepare(logits[i], masks[i])
        for j, token in enumerate(_draw_rows(x, [samplers[i].rng for i in rows],
                                             temperature, top_p, min_p)):
            i = rows[j]
            tokens[i] = samplers[i]._checked(token, logits[i], allowed[j])
    return tokens


def _draw_rows(x: np.ndarray, rngs: list[np.random.Generator], temperature: float,
               top_p: float, min_p: float) -> list[int]:
    """`Sampler._draw` (without top-k) for every row of `x` [B, V] with the same options,
    each row drawing from its own generator."""
    x /= np.float32(temperature)
    top = x.max(axis=1)
    finite = np.isfinite(top)  # other rows are answered as one-row sampling does
    tokens = [_nanargmax(x[j]) if not finite[j] else 0 for j in range(len(rngs))]
    with np.errstate(all="ignore"):
        x -= np.where(finite, top, 0)[:, None]
        probs = np.exp(x, out=x)
        probs /= probs.sum(axis=1, keepdims=True)
        if min_p > 0.0:
            probs[probs < min_p * probs.max(axis=1, keepdims=True)] = 0.0
        picked = [_top_p(row, top_p) if top_p < 1.0 else (None, row) for row in probs]
    for j, rng in enumerate(rngs):
        if not finite[j]:
            continue
        ids, weights = picked[j]
        pick = _pick(weights, rng)
        if pick is None:
            tokens[j] = int(np.argmax(probs[j]))
            continue
        tokens[j] = int(ids[pick]) if ids is not None else pick
    return tokens


PICK_BLOCK = 1024  # weights summed together by `_pick` over a large vocabulary


def _pick(weights: np.ndarray, rng: np.random.Generator) -> int | None:
    """An index drawn in proportion to `weights` (>= 0) with one `rng.random()`: the first
    index whose running sum passes it times the total; None (nothing drawn) when the total
    is not finite and positive. Past 16 blocks of PICK_BLOCK, the running sum is found by
    blocks (their sums, then one block's own running sum: a whole vocabulary's `np.cumsum`
    cost 1 ms a token of Gemma 3's 262,144, this 0.1), and the index is one of weight > 0."""
    n = weights.size
    if n <= 16 * PICK_BLOCK:
        cum = np.cumsum(weights)
        total = cum[-1]
        if not np.isfinite(total) or total <= 0:
            return None
        return min(int(np.searchsorted(cum, rng.random() * total, side="right")), n - 1)
    whole = n - n % PICK_BLOCK
    sums = weights[:whole].reshape(-1, PICK_BLOCK).sum(axis=1, dtype=np.float64)
    if whole < n:
        sums = np.append(sums, weights[whole:].sum(dtype=np.float64))
    cum = np.cumsum(sums)
    total = cum[-1]
    if not np.isfinite(total) or total <= 0:
        return None
    target = rng.random() * total
    # the block the target falls in (one with weight: the sums rise there), then the place
    b = min(int(np.searchsorted(cum, target, side="right")), cum.size - 1)
    while b > 0 and sums[b] <= 0:  # rounding past the last block with weight
        b -= 1
    block = weights[b * PICK_BLOCK : (b + 1) * PICK_BLOCK]
    inner = np.cumsum(block, dtype=np.float64)
    rest = target - (cum[b - 1] if b else 0.0)
    at = int(np.searchsorted(inner, rest, side="right"))
    positive = np.flatnonzero(block > 0)
    return b * PICK_BLOCK + min(at, int(positive[-1]))


# Candidates for the nucleus: the tokens within these factors of the most likely one
# (one comparison pass over the vocabulary), tried in turn before a partition search
NUCLEUS_FLOORS = (2.0 ** -4, 2.0 ** -8, 2.0 ** -12, 2.0 ** -16, 2.0 ** -20)
NUCLEUS_MAX_CANDIDATES = 4096


def _top_p(probs: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """The smallest set of most likely tokens whose mass reaches `top_p`, most likely
    first (ties by token id): (ids, their probabilities).

    Exact, but sorts only as many candidates as it needs: first the tokens within a factor
    of the best one (found with one comparison over the vocabulary); when their mass falls
    short of the threshold, the k best (k = 64, 256, ...) found with a partition. A full
    argsort of a 150k vocabulary costs milliseconds a token."""
    target = top_p * probs.sum()
    n = probs.size
    best = probs.max()
    for floor in NUCLEUS_FLOORS:
        idx = np.flatnonzero(probs >= best * floor)
        if not 0 < idx.size <= NUCLEUS_MAX_CANDIDATES:  # none: NaN
            break
        if probs[idx].sum() < target:
            continue
        order = idx[np.argsort(-probs[idx], kind="stable")]
        cum = np.cumsum(probs[order])
        if cum[-1] >= target:
            cut = int(np.searchsorted(cum, target)) + 1
            return order[:cut], probs[order[:cut]]
    k = min(64, n)
    while True:
        idx = np.sort(np.argpartition(-probs, k - 1)[:k]) if k < n else np.arange(n)
        order = idx[np.argsort(-probs[idx], kind="stable")]
        cum = np.cumsum(probs[order])
        if cum[-1] >= target or k >= n:
            cut = int(np.searchsorted(cum, target)) + 1
            return order[:cut], probs[order[:cut]]
        k = min(n, k * 4)


def _nanargmax(x: np.ndarray) -> int:
    """The best token ignoring NaN (0 when every logit is NaN)."""
    return 0 if np.isnan(x).all() else int(np.nanargmax(x))


def row_logprobs(logits: np.ndarray, tokens: Sequence[int], top: int = 0,
                 block: int = 32) -> list[tuple[float, list[tuple[int, float]]]]:
    """`logprobs` of each row of `logits` [T, V] for its token in `tokens` (a prompt's
    rows), `block` rows at a time: the same values as row by row, within float rounding."""
    out: list[tuple[float, list[tuple[int, float]]]] = []
    for a in range(0, len(tokens), block):
        b = min(a + block, len(tokens))
        x = np.asarray(logits[a:b], dtype=np.float32)
        m = x.max(axis=1, keepdims=True)
        lse = m[:, 0].astype(np.float64) + np.log(
            np.exp(x - m).sum(axis=1, dtype=np.float64))
        rows = np.arange(b - a)
        picked = x[rows, np.asarray(tokens[a:b])].astype(np.float64) - lse
        best = np.empty((b - a, min(top, x.shape[1])), dtype=np.int64)
        rest = x.copy() if top > 1 else x
        for j in range(best.shape[1]):  # the best, then the best of the rest (top is small)
            best[:, j] = rest.argmax(axis=1)
            if j + 1 < best.shape[1]:
                rest[rows, best[:, j]] = -np.inf
        for r in rows:
            tops = [(int(i), float(np.float64(x[r, i]) - lse[r])) for i in best[r]]
            out.append((float(picked[r]), tops))
    return out


def logprobs(logits: np.ndarray, token: int, top: int = 0) -> tuple[float, list[tuple[int, float]]]:
    """The model's log-probability of `token` and the `top` most likely tokens."""
    x = logits.astype(np.float64)
    m = np.max(x)
    lse = m + np.log(np.sum(np.exp(x - m)))
    lp = x - lse
    best: list[tuple[int, float]] = []
    if top:
        idx = np.argpartition(-lp, min(top, lp.size - 1))[:top]
        idx = idx[np.argsort(-lp[idx], kind="stable")]
        best = [(int(i), float(lp[i])) for i in idx]
    return float(lp[token]), best
