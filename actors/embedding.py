"""Embedding requests in the worker: inputs tokenized and checked against the model
(`build_embedding`), then computed between the worker's decode steps (`Embedder.run`): the
inputs of the oldest requests first, as many as MAX_STEP_TOKENS takes, in one forward of the
engine run a few steps at a time (`Engine.embed_steps`: a step is a layer's work for a few
hundred rows), so that neither a long input nor a large batch holds the streams beside it; a
request whose inputs are all done ends with its vectors (truncated to the asked dimensions,
L2-normalized) and Usage. A reranker's query-document pairs run as inputs the same way, with
their token types (actors.rerank: its job ends with the pairs' scores).

Embedding never touches the KV cache: no blocks are taken, nothing cached is written or
evicted, so the prefix cache serves the chats beside it as before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np

from actors.errors import RequestError
from actors.events import Accepted, Embeddings, EmbedGenerate, Event, Failed, Usage
from actors.mixed import position
from actors.outbox import End, Outbox
from npu import Model
from npu.engine.steps import Steps

log = logging.getLogger(__name__)
# the most tokens one embedding forward takes (bounds the activations' memory: tokens x the
# model's widest layer, in float32); a longer input is one forward of its own
MAX_STEP_TOKENS = 4096
# with chats prefilling or decoding, embedding steps take this share of the time their steps
# take (the streams then keep about 1 / (1 + share) of their pace): steps run once the chat
# steps have earned what one costs, and at most MAX_CREDIT_S (or one step's cost, if more)
# is saved up
STREAM_SHARE = 0.25
MAX_CREDIT_S = 0.1
# with no chat work, the forward runs this long before the worker looks for new requests
# (a chat that arrives meanwhile starts within about this)
IDLE_SLICE_S = 0.02


class EmbedJob:
    """One embedding request in the worker: its inputs' token ids and their vectors as
    they are computed (rows in input order). `types`: each input's token types, where the
    engine is given them (a reranker's pairs, actors.rerank.RerankJob); None: all 0."""

    __slots__ = ("request", "ids", "types", "vectors", "done", "cancelled", "outbox")

    def __init__(self, request: EmbedGenerate, ids: list[list[int]], dims: int,
                 types: list[list[int]] | None = None) -> None:
        self.request = request
        self.ids = ids
        self.types = types
        self.vectors = np.empty((len(ids), dims), dtype=np.float32)
        self.done = 0  # inputs computed, in order
        self.cancelled = False
        self.outbox: Outbox | None = None

    @property
    def tokens(self) -> int:
        return sum(len(x) for x in self.ids)

    def accepted(self, model: str) -> Accepted:
        return Accepted(request_id=self.request.request_id, model=model,
                        prompt_tokens=self.tokens)

    def answer(self) -> list[Event]:
        """The events that end the request once every input is computed: its vectors
        (truncated to the asked dimensions, L2-normalized), then Usage."""
        out = finish(self.vectors, self.request.dimensions)
        return [Embeddings(vectors=out.tobytes(), dims=out.shape[1],
                           tokens=[len(x) for x in self.ids]),
                Usage(prompt_tokens=self.tokens, completion_tokens=0)]


def build_embedding(request: EmbedGenerate, model: Model) -> EmbedJob:
    """The request's inputs as token ids, checked against the model.

    An input is cut to its last `keep_last` tokens first, where asked (`last_tokens`).

    Raises:
        RequestError: an empty or malformed input, one over the context (unless
            truncating), dimensions the model does not have, or a `keep_last` it cannot
            keep (`keep_size`); each naming the input's index or the field.
    """
    dims = model.embedding_dims
    if request.dimensions is not None and not 1 <= request.dimensions <= dims:
        raise RequestError(f"'dimensions' must be between 1 and this model's {dims}; got "
                           f"{request.dimensions}.", param="dimensions")
    if not request.inputs:
        raise RequestError("'input' holds no inputs.", param="input")
    limit = min(model.context_length, request.context_limit or model.context_length)
    keep = keep_size(request.keep_last, limit)
    vocab = model.config.vocab_size
    ids: list[list[int]] = []
    for i, item in enumerate(request.inputs):
        if isinstance(item, str) and item and keep is not None:
            tokens = last_tokens(model, item, keep, i)
        elif isinstance(item, str):  # cut (special tokens kept) when truncating
            tokens = model.embedding_ids(item, limit=limit if request.truncate else None) \
                if item else []
        else:
            bad = next((t for t in item if not 0 <= t < vocab), None)
            if bad is not None:
                raise RequestError(f"Input {i} holds token id {bad}, outside this model's "
                                   f"vocabulary of {vocab}.", param="input")
            tokens = list(item) if keep is None else list(item[-keep:])
        if not tokens:
            raise RequestError(f"Input {i} is empty.", param="input")
        if len(tokens) > limit:
            if not request.truncate:
                what = ("this model's maximum context length" if limit == model.context_length
                        else "the requested context length")
                raise RequestError(f"Input {i} has {len(tokens)} tokens; {what} is {limit} "
                                   "tokens.", param="input", code="context_length_exceeded")
            tokens = tokens[:limit]
        ids.append(tokens)
    return EmbedJob(request, ids, dims)


def keep_size(keep_last: int | None, limit: int) -> int | None:
    """How many tokens `keep_last` keeps of each input (-1: `limit`, the context; vLLM's
    `truncate_prompt_tokens`); None: inputs are not cut.

    Raises:
        RequestError: below -1, 0, or more than the context (`keep_last`).
    """
    if keep_last is None:
        return None
    if keep_last == -1:
        return limit
    if keep_last < 1:
        raise RequestError(f"'keep_last' is {keep_last}; it must be at least 1 (the tokens "
                           "kept of each input), or -1 for the model's context.",
                           param="keep_last")
    if keep_last > limit:
        raise RequestError(f"'keep_last' is {keep_last}, more than this model's maximum "
                           f"context length of {limit} tokens: ask for at most {limit} (or "
                           "-1: the context).", param="keep_last")
    return keep_last


def last_tokens(model: Model, text: str, keep: int, index: int) -> list[int]:
    """The embedding ids of `text` (`Model.embedding_ids`) cut to `keep`: its own tokens'
    last ones, the special tokens the model adds around an input kept (as transformers'
    tokenizer truncates on the left: vLLM's `truncate_prompt_tokens`).

    Raises:
        RequestError: `keep` leaves no room for a token of the text beside the special
            tokens (`keep_last`).
    """
    full = model.embedding_ids(text)
    if len(full) <= keep:
        return full
    body = model.tokenizer.encode(text)
    added = len(full) - len(body)
    start = position(full, body)
    if start is None:  # the text's tokens are not whole in the input (no such tokenizer)
        return full[-keep:]
    if keep <= added:
        raise RequestError(f"'keep_last' is {keep}; input {index} needs more: this model "
                           f"adds {added} special tokens around each input, so keep at least "
                           f"{added + 1}.", param="keep_last")
    return full[:start] + body[len(body) - (keep - added):] + full[start + len(body):]


def finish(vectors: np.ndarray, dimensions: int | None) -> np.ndarray:
    """The vectors as answered: the first `dimensions` of each, L2-normalized (a zero
    vector stays zero)."""
    v = vectors[:, :dimensions] if dimensions else vectors
    norms = np.linalg.norm(v, axis=1, keepdims=True)
    return np.ascontiguousarray(v / np.where(norms > 0, norms, 1), dtype="<f4")


class Forward:
    """The embedding forward under way: its steps and the inputs it computes (job, row)."""

    __slots__ = ("steps", "picked")

    def __init__(self, steps: Steps[np.ndarray], picked: list[tuple[EmbedJob, int]]) -> None:
        self.steps, self.picked = steps, picked


class Embedder:
    """The embedding steps of one worker's model, paced against its chats' steps.

    Args:
        model: the worker's model.
        clock: seconds, for the pacing (a test's own clock).
    """

    def __init__(self, model: Model, clock: Callable[[], float] = time.perf_counter) -> None:
        self.model = model
        self.clock = clock
        self.step_s = 0.0  # measured: what one engine step takes (a moving average)
        # seconds of embedding the chats' steps so far have earned (STREAM_SHARE of theirs)
        self.credit = 0.0
        self.forward: Forward | None = None

    def earn(self, busy_s: float) -> None:
        """Chat steps took `busy_s` while embeddings waited: their share of it."""
        cap = max(MAX_CREDIT_S, self.step_s)
        self.credit = min(cap, self.credit + STREAM_SHARE * busy_s)

    def ready(self, busy: bool) -> bool:
        """Whether embedding steps may run now: always when no chat prefills or decodes,
        else once the chats' steps have earned what a step costs."""
        return not busy or (self.credit > 0 and self.credit >= self.step_s)

    def close(self) -> None:
        """Stop the forward under way (the worker stops)."""
        if self.forward is not None:
            self.forward.steps.close()
            self.forward = None

    def drop_cancelled(self) -> None:
        """Stop the forward under way if every request it computes for is cancelled."""
        if self.forward is not None and all(job.cancelled for job, _ in self.forward.picked):
            self.forward.steps.close()
            self.forward = None

    def run(self, jobs: list[EmbedJob], busy: bool) -> list[Outbox]:
        """Steps of the forward under way (one started for the oldest jobs' next inputs, as
        many as MAX_STEP_TOKENS takes, the first whatever its length, if none is): while the
        earned time lasts when `busy` (then paid from it), else for IDLE_SLICE_S; at least
        one. Returns the outboxes of the jobs that ended."""
        if self.forward is None and not jobs:
            return []
        allowance = self.credit if busy else IDLE_SLICE_S
        t0 = self.clock()
        vectors = None
        forward = self.forward
        try:
            if forward is None:
                forward = self.forward = self._start(jobs)
            while True:
                start = self.clock()
                try:
                    next(forward.steps)
                except StopIteration as stop:
                    vectors = stop.value
                    break
                finally:
                    took = self.clock() - start
                    self.step_s = 0.8 * self.step_s + 0.2 * took if self.step_s else took
                if self.clock() - t0 >= allowance:
                    break
        except Exception as exc:  # a bug (inputs are checked before): those requests fail
            log.exception("embedding failed")
            self.forward = None
            picked = forward.picked if forward is not None else [(jobs[0], 0)]
            failed = list(dict.fromkeys(job for job, _ in picked if job in jobs))
            for job in failed:
                jobs.remove(job)
                job.outbox.put(Failed(message=f"Embedding failed: {exc}"))
                job.outbox.put(End)
            return [job.outbox for job in failed]
        finally:
            spent = self.clock() - t0
            self.credit = self.credit - spent if busy else 0.0  # an overshoot is owed
        if vectors is None:
            return []
        self.forward = None
        for (job, row), vector in zip(forward.picked, vectors):
            job.vectors[row] = vector
            job.done = row + 1
        ended = []
        for job in [j for j in jobs if j.done == len(j.ids)]:
            jobs.remove(job)
            ended.append(self._close(job))
        return ended

    def _start(self, jobs: list[EmbedJob]) -> Forward:
        """A forward of the oldest jobs' next inputs (those not under way), as many as
        MAX_STEP_TOKENS takes (the first whatever its length)."""
        picked: list[tuple[EmbedJob, int]] = []
        items: list[list[int]] = []
        taken = 0
        for job in jobs:
            for row in range(job.done, len(job.ids)):
                n = len(job.ids[row])
                if items and taken + n > MAX_STEP_TOKENS:
                    break
                picked.append((job, row))
                items.append(job.ids[row])
                taken += n
            else:
                continue
            break
        engine = self.model.engine
        if all(job.types is None for job, _ in picked):
            return Forward(engine.embed_steps(items), picked)
        types = [job.types[row] if job.types is not None else [0] * len(job.ids[row])
                 for job, row in picked]  # (only an encoder takes types: a reranker's)
        return Forward(engine.embed_steps(items, types=types), picked)

    def _close(self, job: EmbedJob) -> Outbox:
        outbox = job.outbox
        for event in job.answer():
            outbox.put(event)
        outbox.put(End)
        return outbox
