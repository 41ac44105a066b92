"""ScoreMemo: the longest shared start among the last scored prompts of the same first
block, per top-logprobs count; prompts of one block or less are not kept; the least
recently used go past the cost budget (tokens times 1 + alternatives)."""

from __future__ import annotations

from actors.events import TokenLogprob
from actors.score_memo import START, ScoreMemo

HEAD = list(range(100, 100 + START))  # a first block the prompts below share


def _entries(ids: list[int]) -> list[TokenLogprob]:
    return [TokenLogprob(token=str(i), logprob=None if k == 0 else -float(i), bytes=[], top=[])
            for k, i in enumerate(ids)]


def _add(memo: ScoreMemo, ids: list[int], top: int = 1) -> None:
    memo.add(ids, top, _entries(ids))


def test_the_longest_shared_start_of_the_same_top_count() -> None:
    memo = ScoreMemo()
    _add(memo, HEAD + [1, 2, 3, 4])
    _add(memo, HEAD + [1, 2, 9])
    _add(memo, HEAD + [1, 2, 3, 4, 5], top=2)  # another top count
    shared, entries = memo.longest(HEAD + [1, 2, 3, 7, 7], 1)
    assert shared == START + 3 and [e.token for e in entries[START:]] == ["1", "2", "3", "4"]
    assert memo.longest([5] + HEAD, 1) == (0, [])  # another first block
    assert memo.longest(HEAD + [1, 2, 3, 4, 5, 6], 2)[0] == START + 5
    assert memo.longest(HEAD + [1, 2, 3], 1)[0] == START + 3  # inside a longer one
    _add(memo, HEAD)  # one block: nothing later could take a cached block of it
    _add(memo, [7] * 5)
    assert len(memo) == 3


def test_the_least_recently_used_go_past_the_budget() -> None:
    n = START + 2
    memo = ScoreMemo(max_cost=3 * n * 2)  # three prompts of n tokens with 1 alternative
    _add(memo, HEAD + [1, 1])
    _add(memo, HEAD + [2, 2])
    _add(memo, HEAD + [3, 3])
    assert memo.longest(HEAD + [1, 1], 1)[0] == n  # used: now the most recent
    _add(memo, HEAD + [4, 4])  # over the budget: [2, 2], the least recently used, goes
    assert len(memo) == 3 and memo.longest(HEAD + [2, 2], 1)[0] == START
    assert memo.longest(HEAD + [1, 1], 1)[0] == n
    _add(memo, HEAD + list(range(200)))  # larger than the whole budget: not kept
    assert len(memo) == 3
    assert ScoreMemo(max_cost=0).longest(HEAD, 1) == (0, [])
