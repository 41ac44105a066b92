"""Engine: what every engine does for the worker above it (the CPU engine, NumpyEngine,
the NPU's, XRTEngine, which extends it, and the encoder engine, EncoderEngine, which only
embeds: its generation members raise ModelError). The worker uses these members and nothing
else of an engine."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from npu.engine.steps import Steps


@runtime_checkable
class Engine(Protocol):
    """Sequences by id, each with its own paged KV cache; logits as float32 arrays."""

    @property
    def weight_bytes(self) -> int:
        """Bytes of the weights as held."""

    @property
    def kv_max_blocks(self) -> int:
        """The most KV blocks (16 tokens each) the cache may hold."""

    def weight_summary(self) -> dict[str, Any]:
        """What the weights are: parameter count, formats (for model listings)."""

    def set_threads(self, n: int) -> None:
        """Threads for the compiled kernels."""

    def prefill(self, seq_id: object, ids: Sequence[int]) -> np.ndarray:
        """Feed a new sequence's (or more of a sequence's) tokens; the last one's logits."""

    def prefill_many(self, items: Sequence[tuple[object, Sequence[int]]], *,
                     every_row: bool = False) -> np.ndarray:
        """Several sequences' tokens in one pass; each one's last logits [B, V]
        (`every_row`: the logits after every token, [sum of the pieces' lengths, V])."""

    def decode(self, seq_ids: Sequence[object], tokens: Sequence[int]) -> np.ndarray:
        """One token for each sequence; logits [B, V]."""

    @property
    def can_rewind(self) -> bool:
        """Whether `rewind` works (every layer's state is in the KV cache)."""

    def verify(self, items: Sequence[tuple[object, Sequence[int]]]) -> np.ndarray:
        """Running sequences' next tokens (each with tokens drafted after it) in one
        forward; the logits after every token [sum of lengths, V]."""

    def rewind(self, seq_id: object, length: int) -> None:
        """Take a sequence back to its first `length` tokens (drafts not kept)."""

    def reuse_prefix(self, seq_id: object, ids: Sequence[int]) -> int:
        """Take the longest cached prefix of `ids` for a new sequence: tokens taken."""

    def cached_prefix(self, ids: Sequence[int]) -> int:
        """How many tokens of `ids` the cache holds (nothing taken)."""

    def blocks_needed(self, items: Sequence[tuple[object, int]]) -> int:
        """KV blocks the sequences need to grow by these many tokens each."""

    def blocks_available(self) -> int:
        """KV blocks free or evictable now."""

    def fork(self, src: object, dst: object) -> None:
        """A new sequence sharing `src`'s KV so far (n > 1 choices)."""

    def release(self, seq_id: object) -> None:
        """The sequence is done: its blocks go back (kept for reuse if caching)."""

    def length(self, seq_id: object) -> int:
        """Tokens the sequence holds."""

    def kv_usage(self) -> dict[str, int]:
        """Sequences, blocks and bytes of the KV cache now."""

    def check_device(self) -> None:
        """Raise if the device the engine runs on is gone (a health check)."""

    def embed(self, items: Sequence[Sequence[int]]) -> np.ndarray:
        """Embedding vectors of token lists, all in one forward (`embed_steps` to its end):
        float32 [len(items), dims], row i the model's pooled vector for items[i] (after the
        final norm and any sentence-transformers Dense layers), not normalized.

        Causal attention for a decoder, bidirectional for an encoder, each list over its own
        tokens only: the KV cache is neither read, written nor evicted, and no sequence is
        left behind. A row is the same whatever else is in the batch (bit for bit with
        integer block formats).

        Raises:
            ValueError: a list is empty, or has an id outside the vocabulary (an empty
                `items` is no error: an array [0, dims]).
            ContextLengthError: a list is longer than the model's context.
            ModelError: the engine cannot embed (an NPU mode without cache-free attention).
        """

    def embed_steps(self, items: Sequence[Sequence[int]]) -> Steps[np.ndarray]:
        """`embed` as a generator of bounded steps (a layer's work for a few hundred rows),
        its value the vectors: the worker runs one between decode steps, a few steps at a
        time, so a long input does not hold the streams beside it. The same numbers as
        `embed`; its errors are raised by the first step."""

