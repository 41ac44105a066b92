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

Prompts are found by their first block of tokens (a shorter one could never take a cached
block: it is not kept), so a lookup compares only prompts of the same start.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from actors.events import TokenLogprob

# what the memo holds at most: a prompt costs its tokens times (1 + its alternatives per
# token), about 0.5 KB of Python objects each; the least recently used go first
MAX_COST = 65_536
# a prompt's start it is found by: the KV cache's block (npu.engine.kv_cache.BLOCK)
START = 16


class ScoreMemo:
    """The last scored prompts' ids and entries, per top-logprobs count (an entry lists
    that many alternatives), least recently used first.

    Args:
        max_cost: tokens times (1 + alternatives) kept at most over all prompts (0: none).
    """

    def __init__(self, max_cost: int = MAX_COST) -> None:
        self.max_cost = max_cost
        self._held: OrderedDict[int, tuple[np.ndarray, int, list[TokenLogprob]]] = \
            OrderedDict()
        self._by_start: dict[tuple[int, tuple[int, ...]], list[int]] = {}
        self._cost = 0
        self._next = 0

    def __len__(self) -> int:
        return len(self._held)

    def longest(self, ids: Sequence[int], top: int) -> tuple[int, list[TokenLogprob]]:
        """The memo sharing the longest start with `ids` (scored with `top` alternatives):
        how many tokens they share, L, and its entries (0..L-1 are `ids`' own); (0, [])
        when none shares a first block."""
        keys = self._by_start.get((top, tuple(ids[:START])), [])
        want = np.asarray(ids, dtype=np.int64)
        best, found = 0, None
        for key in reversed(keys):  # the newest first: a tie goes to it
            have = self._held[key][0]
            n = min(len(have), len(want))
            differ = np.flatnonzero(have[:n] != want[:n])
            shared = int(differ[0]) if len(differ) else n
            if shared > best:
                best, found = shared, key
        if found is None:
            return 0, []
        self._held.move_to_end(found)  # (used: kept longer)
        return best, self._held[found][2]

    def add(self, ids: Sequence[int], top: int, entries: list[TokenLogprob]) -> None:
        """Keep a scored prompt's entries (one per token of `ids`); the least recently used
        prompts go while the memo holds more than `max_cost`. A prompt of one block or less
        is not kept (a later one could take no cached block of it)."""
        cost = len(ids) * (1 + top)
        if len(entries) != len(ids) or len(ids) <= START or cost > self.max_cost:
            return
        key, self._next = self._next, self._next + 1
        self._held[key] = (np.asarray(ids, dtype=np.int64), top, list(entries))
        self._by_start.setdefault((top, tuple(ids[:START])), []).append(key)
        self._cost += cost
        while self._cost > self.max_cost:
            old, (old_ids, old_top, _) = self._held.popitem(last=False)
            start = (old_top, tuple(int(t) for t in old_ids[:START]))
            self._by_start[start].remove(old)
            if not self._by_start[start]:
                del self._by_start[start]
            self._cost -= len(old_ids) * (1 + old_top)
