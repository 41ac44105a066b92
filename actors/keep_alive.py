"""keep_alive_seconds: Ollama's `keep_alive` (a Go duration string such as "5m" or "1h30m",
or a number of seconds) as seconds: 0 unloads at once, any negative value keeps the model
loaded until it is evicted (`inf`)."""

from __future__ import annotations

import math
import re

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0,
          "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def keep_alive_seconds(value: object) -> float | None:
    """Seconds for a `keep_alive` value (None when it is absent or null).

    Raises:
        ValueError: not a duration; the message says what is accepted.

    >>> keep_alive_seconds("1h30m"), keep_alive_seconds(0), keep_alive_seconds("-1")
    (5400.0, 0.0, inf)
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(_WHAT.format(value=value))
    if isinstance(value, (int, float)):
        try:
            seconds = float(value)
        except OverflowError:  # an integer past float's range: as long as there is
            seconds = math.inf if value > 0 else -math.inf
    elif isinstance(value, str):
        seconds = _parse(value.strip())
    else:
        raise ValueError(_WHAT.format(value=value))
    if math.isnan(seconds):
        raise ValueError(_WHAT.format(value=value))
    return math.inf if seconds < 0 else seconds


_WHAT = ("keep_alive {value!r} is not a duration: send seconds (300, 0 to unload, -1 to "
         "keep loaded) or a duration such as \"5m\", \"1h30m\", \"-1m\"")


def _parse(text: str) -> float:
    try:
        return float(text)  # "300", "-1": seconds
    except ValueError:
        pass
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    total, at = 0.0, 0
    for m in _PART.finditer(body):
        if m.start() != at:
            break
        total += float(m[1]) * _UNITS[m[2]]
        at = m.end()
    if not body or at != len(body):
        raise ValueError(_WHAT.format(value=text))
    return sign * total
