"""StopMatcher: text is cut at the first stop string; text that may still become one waits."""

from __future__ import annotations

from actors.stops import StopMatcher


def test_cuts_at_the_first_stop_across_pieces() -> None:
    m = StopMatcher(["END", "!!"])
    assert m.push("hello E") == "hello "
    assert m.push("N") == ""
    assert m.push("D and more") == ""
    assert m.stopped and m.flush() == ""


def test_false_alarm_is_released() -> None:
    m = StopMatcher(["END"])
    assert m.push("aE") == "a"
    assert m.push("x") == "Ex"
    assert m.push("EN") == ""
    assert m.flush() == "EN"


def test_no_stops_passes_everything() -> None:
    m = StopMatcher([])
    assert m.push("abc") == "abc" and m.flush() == ""


def test_the_stop_that_cut_is_named() -> None:
    m = StopMatcher(["END", "!!"])
    assert m.matched is None
    assert m.push("a !! b END") == "a "
    assert m.matched == "!!"
