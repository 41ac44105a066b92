"""StopMatcher: cuts generated text at the first stop string, holding back text that could
still become one; and, where asked, at the first line less indented than a minimum
(llama-server's `n_indent`, which editor plugins send: a completion ends where its block
does)."""

from __future__ import annotations


class StopMatcher:
    """Args:
        stops: the stop strings.
        min_indent: a line after the output's first whose first character that is not a
            space or tab (a blank line's newline too) comes after fewer spaces and tabs
            than this ends the output there, its indentation kept (as llama-server cuts
            it); 0: no such rule.
    """

    def __init__(self, stops: list[str], min_indent: int = 0) -> None:
        self.stops = [s for s in dict.fromkeys(stops) if s]
        self.min_indent = min_indent
        self._held = ""
        self._indent: int | None = None  # spaces and tabs so far at a line's start
        self.stopped = False
        self.matched: str | None = None  # the stop string that cut the text
        self.dedented = False  # a line's indentation ended the text (`min_indent`)

    def push(self, text: str, armed: bool = True) -> str:
        """Text that is safe to emit; sets `stopped` when a stop string completes or a line
        is indented less than `min_indent`. Not `armed` (the output is shorter than the
        request's min_tokens, as vLLM reads it): the stop strings are not looked for."""
        if not armed and not self.stopped:
            text, self._held = self._held + text, ""
            return self._indentation(text)
        return self._indentation(self._stop_strings(text))

    def _indentation(self, text: str) -> str:
        if self.min_indent <= 0:
            return text
        for i, ch in enumerate(text):
            if self._indent is not None:  # at a line's start (after a newline)
                if ch in " \t":
                    self._indent += 1
                    continue
                if self._indent < self.min_indent:
                    self.stopped = self.dedented = True
                    return text[:i]
                self._indent = None
            if ch == "\n":
                self._indent = 0
        return text

    def _stop_strings(self, text: str) -> str:
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
        return self._indentation(out)
