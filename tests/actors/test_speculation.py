"""The n-gram drafter and the speculative option (actors.speculation)."""

from __future__ import annotations

import msgspec
import pytest

from actors.speculation import NgramDrafter, Speculation


def test_drafter_copies_what_followed_the_latest_match() -> None:
    prompt = [1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 6]
    d = NgramDrafter(prompt, lookup_max=3, lookup_min=2)
    # output "2 3": its latest earlier occurrence is followed by 7 8 6 2 3
    assert d.propose([2, 3], 4) == [7, 8, 6, 2]
    assert d.propose([2, 3, 7, 8], 2) == [6, 2]  # the longest n-gram (3 8 ...) first
    assert d.propose([2, 3, 7, 8, 42], 3) == []  # nothing ends in 8 42 before
    assert d.propose([2, 3, 7, 8, 42], 0) == []


def test_drafter_prefers_the_longest_ngram() -> None:
    # "5 6" is followed by 1 at its latest, "4 5 6" by 2
    d = NgramDrafter([4, 5, 6, 2, 0, 5, 6, 1, 0, 4, 5], lookup_max=3, lookup_min=2)
    assert d.propose([6], 1) == [2]
    d = NgramDrafter([4, 5, 6, 2, 0, 5, 6, 1, 0, 4, 5], lookup_max=2, lookup_min=2)
    assert d.propose([6], 1) == [1]


def test_drafter_matches_in_its_own_output() -> None:
    d = NgramDrafter([0], lookup_max=2, lookup_min=1)
    assert d.propose([5, 6, 7, 5], 3) == [6, 7, 5]


@pytest.mark.parametrize("raw", [{"tokens": 0}, {"lookup_min": 3, "lookup_max": 2},
                                 {"method": "eagle"}])
def test_bad_options_are_refused(raw: dict) -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert(raw, Speculation)
