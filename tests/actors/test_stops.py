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


def test_stops_are_not_looked_for_before_the_matcher_is_armed() -> None:
    """min_tokens: text written before it is reached goes out whole, a stop string's start
    held before that too; once armed, the next stop string cuts."""
    m = StopMatcher(["END"])
    assert m.push("aE", armed=False) == "aE"
    assert m.push("END b", armed=False) == "END b"
    assert m.push("x", armed=False) == "x" and not m.stopped
    assert m.push("yE") == "y" and m.push("ND z") == "" and m.stopped


def test_the_stop_that_cut_is_named() -> None:
    m = StopMatcher(["END", "!!"])
    assert m.matched is None
    assert m.push("a !! b END") == "a "
    assert m.matched == "!!"


def _dedent_cut(text: str, n: int) -> str | None:
    """llama-server's `n_indent` on a whole text: where it ends (None: it does not)."""
    start = text.find("\n") + 1
    while start:
        ws = len(text[start:]) - len(text[start:].lstrip(" \t"))
        if start + ws < len(text) and ws < n:
            return text[:start + ws]
        start = text.find("\n", start) + 1
    return None


CODE = "    return a\n    b = 1\n\n  c\nd\n        e"


def test_a_line_indented_less_than_min_indent_ends_the_text_as_llama_server_cuts_it() -> None:
    m = StopMatcher([], min_indent=4)
    assert m.push("x = 1\n    y = 2\n  z") == "x = 1\n    y = 2\n  "
    assert m.stopped and m.dedented and m.matched is None
    assert m.push("more") == "" and m.flush() == ""
    # the first line is never checked; a blank line's newline counts as a character
    m = StopMatcher([], min_indent=4)
    assert m.push("z\n    a\n\n    b") == "z\n    a\n" and m.dedented
    # text held for a stop string that never completes is checked when it is released
    m = StopMatcher(["\nEND"], min_indent=4)
    assert m.push("    a\nEN") + m.flush() == "    a\n" and m.dedented


def test_the_cut_is_the_same_however_the_text_arrives() -> None:
    from hypothesis import given
    from hypothesis import strategies as st

    @given(st.lists(st.integers(0, len(CODE)), max_size=6), st.integers(0, 9),
           st.sampled_from([[], ["c\n"], ["\n\n"], ["\n        e!"], ["\nd\n "]]))
    def check(cuts: list[int], n: int, stops: list[str]) -> None:
        m = StopMatcher(stops, min_indent=n)
        bounds = [0, *sorted(cuts), len(CODE)]
        out = "".join(m.push(CODE[a:b]) for a, b in zip(bounds, bounds[1:])) + m.flush()
        whole = CODE
        for s in stops:  # the stop strings first, as the matcher applies them
            whole = whole.split(s)[0]
        cut = _dedent_cut(whole, n) if n else None
        assert out == (whole if cut is None else cut)
        assert m.dedented == (cut is not None)

    check()
