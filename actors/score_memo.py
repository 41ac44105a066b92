"""ScoreMemo: the prompt logprobs of a worker's last scored prompts (completions' `echo` with
`logprobs`), so that a prompt which starts as one of them takes the KV cache's blocks of
that start and its scores, and computes only the rest.

lm-evaluation-harness scores a multiple-choice question as one prompt per choice, the same
context before each continuation: without the memo every choice computes the context again
(a scored prompt needs the logits after every token, which the KV cache does not keep).
A prompt's entry i is the logprob of its token i after tokens 0..i-1, so it depends only on
tokens 0..i: a memo that shares L tokens with a prompt holds the prompt's entries 0..L-1.
Resuming after c cached tokens computes the rows after tokens c..n-1, so entries c+1..n-1;
entries 0..c come from the memo, which needs c < L (the scheduler takes at most L - 1
tokens from the cache).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from actors.events import TokenLogprob

# the entries the memo keeps at most (a prompt's count its tokens); the oldest go first
MAX_TOKENS = 65_536


class ScoreMemo:
    """The last scored prompts' ids and entries, per top-logprobs count (an entry lists
    that many alternatives), newest last.

    Args:
        max_tokens: entries kept at most over all prompts.
    """

    def __init__(self, max_tokens: int = MAX_TOKENS) -> None:
        self.max_tokens = max_tokens
        self._held: OrderedDict[tuple[int, int], tuple[np.ndarray, list[TokenLogprob]]] = \
            OrderedDict()
        self._tokens = 0
        self._next = 0

    def __len__(self) -> int:
        return len(self._held)

    def longest(self, ids: Sequence[int], top: int) -> tuple[int, list[TokenLogprob]]:
        """The memo sharing the longest start with `ids` (scored with `top` alternatives):
        how many tokens they share, L, and its entries (0..L-1 are `ids`' own); (0, [])
        when none does."""
        want = np.asarray(ids, dtype=np.int64)
        best, found = 0, None
        for key in reversed(self._held):  # the newest first: a tie goes to it
            if key[0] != top:
                continue
            have = self._held[key][0]
            n = min(len(have), len(want))
            differ = np.flatnonzero(have[:n] != want[:n])
            shared = int(differ[0]) if len(differ) else n
            if shared > best:
                best, found = shared, key
        if found is None:
            return 0, []
        self._held.move_to_end(found)  # (used: kept longer)
        return best, self._held[found][1]

    def add(self, ids: Sequence[int], top: int, entries: list[TokenLogprob]) -> None:
        """Keep a scored prompt's entries (one per token of `ids`); the oldest prompts go
        while the memo holds more than `max_tokens` entries."""
        if len(entries) != len(ids) or len(ids) > self.max_tokens:
            return
        self._held[(top, self._next)] = (np.asarray(ids, dtype=np.int64), list(entries))
        self._next += 1
        self._tokens += len(ids)
        while self._tokens > self.max_tokens:
            _, (old, _) = self._held.popitem(last=False)
            self._tokens -= len(old)
