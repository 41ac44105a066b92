"""gc_paused: Python's cyclic garbage collector held off while a model loads.

A load makes a few hundred thousand long-lived objects at once (a vocabulary's tokens and
merges as strings, tuples and dicts, a GGUF header's metadata); the collector, triggered
every few hundred allocations, walks them again and again (SmolLM2's load: 146 -> 126 ms
without it, 10 of 10 paired runs). Nothing a load makes is garbage in a cycle, so
collecting can wait until it is done. Loads on several threads at once share one pause:
the collector runs again when the last of them ends (if it ran before the first began).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class _Pause:
    """How many loads hold the collector off, and whether it ran before the first."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holders = 0
        self.was_enabled = False


_PAUSE = _Pause()


@contextmanager
def gc_paused() -> Iterator[None]:
    """The collector off within the block (and on again after it, as it was before)."""
    with _PAUSE.lock:
        if _PAUSE.holders == 0:
            _PAUSE.was_enabled = gc.isenabled()
            gc.disable()
        _PAUSE.holders += 1
    try:
        yield
    finally:
        with _PAUSE.lock:
            _PAUSE.holders -= 1
            if _PAUSE.holders == 0 and _PAUSE.was_enabled:
                gc.enable()
