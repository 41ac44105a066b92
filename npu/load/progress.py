"""Progress: a model's load shown on stderr: one updating line on a terminal, a line per
quarter elsewhere (a log file, Ray's worker logs), nothing for a load under a second."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

QUARTERS = (25, 50, 75)
REDRAW_S = 0.1  # a terminal's line is redrawn at most this often


class Progress:
    """The load of `total` bytes called `label`.

    Args:
        stream: where it is written (default: sys.stderr when the load starts).
        after_s: nothing is shown before this many seconds (a fast load says nothing).
        clock: seconds, monotonic (tests pass their own).
    """

    def __init__(self, label: str, total: int, *, stream: TextIO | None = None,
                 after_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.label, self.total, self.done = label, max(total, 1), 0
        self.stream = stream or sys.stderr
        self.after_s, self.clock = after_s, clock
        self.start = self.last_draw = clock()
        self.terminal = bool(getattr(self.stream, "isatty", lambda: False)())
        self.shown = False
        self.quarter = 0  # the quarters already written (not on a terminal)

    def _text(self, elapsed: float) -> str:
        mb = self.done / 1e6
        pct = min(100, 100 * self.done // self.total)
        return (f"loading {self.label}: {pct:3d}% ({mb:,.0f} / {self.total / 1e6:,.0f} MB, "
                f"{mb / max(elapsed, 1e-9):,.0f} MB/s)")

    def add(self, n: int) -> None:
        self.done += n
        now = self.clock()
        elapsed = now - self.start
        if elapsed < self.after_s:
            return
        if self.terminal:
            if now - self.last_draw >= REDRAW_S or not self.shown:
                self.stream.write("\r" + self._text(elapsed) + "\x1b[K")
                self.stream.flush()
                self.last_draw, self.shown = now, True
            return
        pct = 100 * self.done // self.total
        while self.quarter < len(QUARTERS) and pct >= QUARTERS[self.quarter]:
            self.quarter += 1
            if pct < (QUARTERS[self.quarter] if self.quarter < len(QUARTERS) else 100):
                self.stream.write(self._text(elapsed) + "\n")
                self.stream.flush()
                self.shown = True

    def end(self) -> float:
        """The load's seconds; says it is done where progress was shown."""
        elapsed = self.clock() - self.start
        if self.shown:
            done = (f"loaded {self.label}: {self.total / 1e6:,.0f} MB in {elapsed:.1f} s")
            self.stream.write(("\r" + done + "\x1b[K\n") if self.terminal else done + "\n")
            self.stream.flush()
        return elapsed
