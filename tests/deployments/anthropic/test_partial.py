"""parse_partial: a tool call's input from JSON cut anywhere reads as the anthropic SDK's
stream reads the same text (jiter's partial mode), at every cut point."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deployments.anthropic.partial import parse_partial

jiter = pytest.importorskip("jiter")

_scalars = (st.none() | st.booleans() | st.integers(-10**12, 10**12)
            | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=6))
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                       max_leaves=8)
_objects = st.dictionaries(st.text(max_size=4), _values, max_size=4)


@settings(max_examples=200, deadline=None)
@given(obj=_objects, compact=st.booleans(), ascii_only=st.booleans())
def test_every_cut_reads_as_the_sdks_stream_reads_it(obj: dict, compact: bool,
                                                     ascii_only: bool) -> None:
    text = json.dumps(obj, separators=(",", ":") if compact else (", ", ": "),
                      ensure_ascii=ascii_only)
    for cut in range(len(text) + 1):
        head = text[:cut]
        want = jiter.from_json(head.encode(), partial_mode=True) if head else {}
        assert parse_partial(head) == want, head
    assert parse_partial(text) == obj


@pytest.mark.parametrize("text,expect", [
    ("", {}),
    ('{"a": 1, "b": "x', {"a": 1}),
    ('{"a": 12', {"a": 12}),  # a number at the very end is kept whole
    ('{"a": 1.', {}),
    ('{"a": tr', {}),
    ('{"a": ["x", "y', {"a": ["x"]}),
    ('{"a": {', {"a": {}}),
    ('{"k\\"', {}),  # a key cut inside an escape
    ("[1, 2", {}),  # not an object
    ("nonsense", {}),
])
def test_what_a_cut_keeps(text: str, expect: dict) -> None:
    assert parse_partial(text) == expect
