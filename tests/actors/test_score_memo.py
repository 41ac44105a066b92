"""ScoreMemo: the longest shared start among the last scored prompts, per top-logprobs
count; the oldest prompts go past the token budget."""

from __future__ import annotations

from actors.events import TokenLogprob
from actors.score_memo import ScoreMemo


def _entries(ids: list[int]) -> list[TokenLogprob]:
    return [TokenLogprob(token=str(i), logprob=None if k == 0 else -float(i), bytes=[], top=[])
            for k, i in enumerate(ids)]


def test_the_longest_shared_start_of_the_same_top_count() -> None:
    memo = ScoreMemo()
    memo.add([1, 2, 3, 4], 1, _entries([1, 2, 3, 4]))
    memo.add([1, 2, 9], 1, _entries([1, 2, 9]))
    memo.add([1, 2, 3, 4, 5], 2, _entries([1, 2, 3, 4, 5]))  # another top count
    shared, entries = memo.longest([1, 2, 3, 7, 7], 1)
    assert shared == 3 and [e.token for e in entries] == ["1", "2", "3", "4"]
    assert memo.longest([5, 1], 1) == (0, [])
    assert memo.longest([1, 2, 3, 4, 5, 6], 2)[0] == 5
    assert memo.longest([1, 2, 3], 1)[0] == 3  # a prompt inside a longer one


def test_the_oldest_go_past_the_budget_and_a_used_one_stays() -> None:
    memo = ScoreMemo(max_tokens=8)
    memo.add([1, 1, 1], 0, _entries([1, 1, 1]))
    memo.add([2, 2, 2], 0, _entries([2, 2, 2]))
    assert memo.longest([1, 1], 0)[0] == 2  # used: now the newest
    memo.add([3, 3, 3], 0, _entries([3, 3, 3]))  # 9 entries: the oldest, [2, 2, 2], goes
    assert len(memo) == 2 and memo.longest([2, 2], 0) == (0, [])
    assert memo.longest([1, 1, 1], 0)[0] == 3
    memo.add(list(range(9)), 0, _entries(list(range(9))))  # larger than the budget: not kept
    assert len(memo) == 2
