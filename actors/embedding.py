"""Embedding requests in the worker: inputs tokenized and checked against the model
(`build_embedding`), then computed in steps of the worker's loop between decode steps
(`Embedder.step`): the inputs of the oldest requests first, as many as the step's token
budget takes, in one forward of the engine (`Engine.embed`); a request whose inputs are all
done ends with its vectors (truncated to the asked dimensions, L2-normalized) and Usage.

Embedding never touches the KV cache: no blocks are taken, nothing cached is written or
evicted, so the prefix cache serves the chats beside it as before.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from actors.errors import RequestError
from actors.events import Accepted, EmbedGenerate, Embeddings, Failed, Usage
from actors.outbox import End, Outbox
from npu import Model

log = logging.getLogger(__name__)
# the most tokens one embedding forward takes when no stream is decoding (bounds the
# activations' memory: tokens x the model's widest layer, in float32)
MAX_STEP_TOKENS = 4096
# with streams decoding, embedding steps take this share of the decode steps' time (the
# streams then keep about 1 / (1 + share) of their pace): a step runs once the decode steps
# have earned what its first input costs, and at most MAX_CREDIT_S (or that input's cost,
# if more) is saved up for one step
STREAM_SHARE = 0.25
MAX_CREDIT_S = 0.1


class EmbedJob:
    """One embedding request in the worker: its inputs' token ids and their vectors as
    they are computed (rows in input order)."""

    __slots__ = ("request", "ids", "vectors", "done", "cancelled", "outbox")

    def __init__(self, request: EmbedGenerate, ids: list[list[int]], dims: int) -> None:
        self.request = request
        self.ids = ids
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


def build_embedding(request: EmbedGenerate, model: Model) -> EmbedJob:
    """The request's inputs as token ids, checked against the model.

    Raises:
        RequestError: an empty or malformed input, one over the context (unless
            truncating), or dimensions the model does not have; each naming the input's
            index or the field.
    """
    dims = model.embedding_dims
    if request.dimensions is not None and not 1 <= request.dimensions <= dims:
        raise RequestError(f"'dimensions' must be between 1 and this model's {dims}; got "
                           f"{request.dimensions}.", param="dimensions")
    if not request.inputs:
        raise RequestError("'input' holds no inputs.", param="input")
    limit = min(model.context_length, request.context_limit or model.context_length)
    vocab = model.config.vocab_size
    ids: list[list[int]] = []
    for i, item in enumerate(request.inputs):
        if isinstance(item, str):  # cut (special tokens kept) when truncating
            tokens = model.embedding_ids(item, limit=limit if request.truncate else None) \
                if item else []
        else:
            bad = next((t for t in item if not 0 <= t < vocab), None)
            if bad is not None:
                raise RequestError(f"Input {i} holds token id {bad}, outside this model's "
                                   f"vocabulary of {vocab}.", param="input")
            tokens = list(item)
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


def finish(vectors: np.ndarray, dimensions: int | None) -> np.ndarray:
    """The vectors as answered: the first `dimensions` of each, L2-normalized (a zero
    vector stays zero)."""
    v = vectors[:, :dimensions] if dimensions else vectors
    norms = np.linalg.norm(v, axis=1, keepdims=True)
    return np.ascontiguousarray(v / np.where(norms > 0, norms, 1), dtype="<f4")


class Embedder:
    """The embedding steps of one worker's model, paced against its decode steps.

    Args:
        model: the worker's model.
    """

    def __init__(self, model: Model) -> None:
        self.model = model
        self.tokens_per_s = 0.0  # measured: tokens one second of embedding forwards takes
        # seconds of embedding the decode steps so far have earned (STREAM_SHARE of theirs)
        self.credit = 0.0

    def next_cost(self, jobs: list[EmbedJob]) -> float:
        """Seconds the oldest job's next input should take, at the measured rate (0: not
        measured yet)."""
        if not jobs or not self.tokens_per_s:
            return 0.0
        job = jobs[0]
        return len(job.ids[job.done]) / self.tokens_per_s

    def earn(self, decode_s: float, jobs: list[EmbedJob]) -> None:
        """A decode step took `decode_s` while `jobs` waited: their share of it."""
        cap = max(MAX_CREDIT_S, self.next_cost(jobs))
        self.credit = min(cap, self.credit + STREAM_SHARE * decode_s)

    def ready(self, streaming: bool, jobs: list[EmbedJob]) -> bool:
        """Whether an embedding step may run now: always when no stream decodes, else once
        the decode steps have earned what the next input costs."""
        return not streaming or (self.credit > 0 and self.credit >= self.next_cost(jobs))

    def budget(self, streaming: bool) -> int:
        """Tokens for the next step: all it may take when no stream decodes, else what the
        earned time takes at the measured rate (at least one input)."""
        if not streaming:
            return MAX_STEP_TOKENS
        return max(1, min(MAX_STEP_TOKENS, int(self.tokens_per_s * self.credit)))

    def step(self, jobs: list[EmbedJob], streaming: bool) -> list[Outbox]:
        """Embed the oldest jobs' next inputs, as many as the budget takes (the first one
        whatever its length), in one forward; returns the outboxes of the jobs that
        ended. Beside decoding streams, the step's time is paid from the credit."""
        budget = self.budget(streaming)
        picked: list[tuple[EmbedJob, int]] = []
        items: list[list[int]] = []
        taken = 0
        for job in jobs:
            for row in range(job.done, len(job.ids)):
                n = len(job.ids[row])
                if items and taken + n > budget:
                    break
                picked.append((job, row))
                items.append(job.ids[row])
                taken += n
            else:
                continue
            break
        t0 = time.perf_counter()
        try:
            vectors = self.model.engine.embed(items)
        except Exception as exc:  # a bug (inputs are checked before): those requests fail
            log.exception("embedding failed")
            failed = list(dict.fromkeys(job for job, _ in picked))
            for job in failed:
                jobs.remove(job)
                job.outbox.put(Failed(message=f"Embedding failed: {exc}"))
                job.outbox.put(End)
            return [job.outbox for job in failed]
        elapsed = time.perf_counter() - t0
        self.credit = self.credit - elapsed if streaming else 0.0
        if elapsed > 0:
            rate = taken / elapsed
            self.tokens_per_s = rate if not self.tokens_per_s else \
                0.7 * self.tokens_per_s + 0.3 * rate
        for (job, row), vector in zip(picked, vectors):
            job.vectors[row] = vector
            job.done = row + 1
        ended = []
        for job in [j for j in jobs if j.done == len(j.ids)]:
            jobs.remove(job)
            ended.append(self._close(job))
        return ended

    def _close(self, job: EmbedJob) -> Outbox:
        out = finish(job.vectors, job.request.dimensions)
        outbox = job.outbox
        outbox.put(Embeddings(vectors=out.tobytes(), dims=out.shape[1],
                              tokens=[len(x) for x in job.ids]))
        outbox.put(Usage(prompt_tokens=job.tokens, completion_tokens=0))
        outbox.put(End)
        return outbox
