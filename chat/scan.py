"""Markers: find the first of several markers in text, and hold back a marker cut off at
the end of the text seen so far."""

from __future__ import annotations

import re


class Markers:
    """A set of markers searched together.

    `find(buf, pos)` returns (index, marker) of the earliest marker at or after `pos`
    (the longest when two start at the same place), or (-1, "").
    `hold(buf, pos)` is the length of the longest tail of buf[pos:] that could still
    become a marker.
    """

    __slots__ = ("markers", "_re", "_prefixes", "_longest")

    def __init__(self, *markers: str) -> None:
        self.markers = tuple(sorted({m for m in markers if m}, key=len, reverse=True))
        self._re = re.compile("|".join(map(re.escape, self.markers))) if self.markers else None
        self._prefixes = {m[:k] for m in self.markers for k in range(1, len(m))}
        self._longest = max((len(m) for m in self.markers), default=0)

    def find(self, buf: str, pos: int) -> tuple[int, str]:
        if self._re is None:
            return -1, ""
        m = self._re.search(buf, pos)
        return (m.start(), m.group()) if m else (-1, "")

    def hold(self, buf: str, pos: int) -> int:
        n = len(buf)
        for k in range(min(self._longest - 1, n - pos), 0, -1):
            if buf[n - k :] in self._prefixes:
                return k
        return 0
