"""StopMatcher: cuts generated text at the first stop string, holding back text that could
still become one."""

from __future__ import annotations


class StopMatcher:
    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in dict.fromkeys(stops) if s]
        self._held = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that cut the text

    def push(self, text: str) -> str:
        """Text that is safe to emit; sets `stopped` when a stop string completes."""
        if self.stopped or not text:
            return ""
        if not self.stops:
            return text
        buf = self._held + text
        found = [(i, s) for s in self.stops if (i := buf.find(s)) >= 0]
        if found:
            cut, self.matched = min(found, key=lambda f: f[0])
            self.stopped = True
            self._held = ""
            return buf[:cut]
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(buf)), 0, -1):
                if s.startswith(buf[-k:]):
                    hold = max(hold, k)
                    break
        self._held = buf[len(buf) - hold :]
        return buf[: len(buf) - hold]

    def flush(self) -> str:
        out, self._held = ("" if self.stopped else self._held), ""
        return out
