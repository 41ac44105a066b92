"""actors/keep_alive.py: Ollama's keep_alive values as seconds."""

from __future__ import annotations

import math

import pytest

from actors.keep_alive import keep_alive_seconds


@pytest.mark.parametrize("value,seconds", [
    ("5m", 300.0), ("1h30m", 5400.0), ("1.5s", 1.5), ("250ms", 0.25), ("0", 0.0), ("0s", 0.0),
    (0, 0.0), (30, 30.0), (2.5, 2.5), ("300", 300.0), (None, None),
    (-1, math.inf), ("-1", math.inf), ("-1m", math.inf), ("-5s", math.inf),
    (10**400, math.inf), (-10**400, math.inf), ("1e400", math.inf)])  # past float's range
def test_keep_alive_values_become_seconds(value, seconds) -> None:
    assert keep_alive_seconds(value) == seconds


@pytest.mark.parametrize("value", ["", "abc", "5x", "5m3", "m", True, [1], {"s": 1}, "nan"])
def test_other_values_are_errors_that_say_what_is_accepted(value) -> None:
    with pytest.raises(ValueError, match="is not a duration.*5m"):
        keep_alive_seconds(value)
