"""ValueReader: an incremental reader of JSON, Gemma4's relaxed syntax and Python literals.

It consumes text as it arrives and sends value events (see `chat.jsonout.JSONWriter`) to a
handler. Anything whose meaning depends on text not seen yet (a number, a literal, an
escape, a partial delimiter, a Python quote that may or may not close its string) is left
unconsumed until it is decided, so feeding text in any pieces gives the same events.
(Over 400 lines because the three dialects share one state machine: splitting them would
repeat the container, number and literal handling three times.)
"""

from __future__ import annotations

import enum
import re
from typing import Any

from chat.spec import GEMMA4_QUOTE


class Dialect(enum.Enum):
    JSON = "json"
    GEMMA4 = "gemma4"
    PYTHON = "python"


class Status(enum.Enum):
    MORE = "more"  # consumed what it could; the value is not finished
    DONE = "done"  # the value is finished; the position is just after it
    ERROR = "error"  # the text is not a value of this dialect


# reader states
_VALUE, _VALUE_OR_CLOSE, _AFTER_VALUE, _KEY, _AFTER_KEY, _STRING, _DONE = range(7)

_WS = re.compile(r"[ \t\r\n]*")
_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_LOOSE_NUMBER = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_NUMBER_PREFIX = re.compile(r"[-+]?[0-9]*\.?[0-9]*(?:[eE][+-]?[0-9]*)?")
_INT = re.compile(r"[-+]?[0-9]+")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_GEMMA_KEY = re.compile(r"[A-Za-z_$][A-Za-z0-9_.$-]*")
_DQ_RUN = re.compile(r'[^"\\]+')
_SQ_RUN = re.compile(r"[^'\\]+")
_HEX4 = re.compile(r"[0-9a-fA-F]{4}")
_LITERALS = {
    "true": "true",
    "false": "false",
    "null": "null",
    "True": "true",
    "False": "false",
    "None": "null",
}
_JSON_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_PY_ESCAPES = {
    "\\": "\\", "'": "'", '"': '"', "n": "\n", "r": "\r", "t": "\t", "0": "\0",
    "a": "\a", "b": "\b", "f": "\f", "v": "\v", "\n": "",
}
# A Python quote closes its string only when one of these follows (models write unescaped
# quotes of the same style inside strings: `'sed -n '1,2p' f'`).
_PY_CLOSERS = frozenset(",)]}:")
_VALUE_ENDERS = frozenset(" \t\r\n,)]}:=")


class _Frame:
    __slots__ = ("kind", "close", "sep", "queue", "dict_keys")

    def __init__(self, kind: str, close: str, sep: str = ":", *, dict_keys: bool = False):
        self.kind = kind  # "obj" | "arr" | "brace" (Python: dict or set, not decided yet)
        self.close = close
        self.sep = sep
        self.queue: list[tuple[str, tuple]] | None = [] if kind == "brace" else None
        self.dict_keys = dict_keys  # Python dict: keys are literals, not names


class ValueReader:
    """Reads one value of a dialect, incrementally.

    Args:
        handler: receives the value events (a `JSONWriter`, or a router above one).
        dialect: the syntax to read.
        kwargs_close: Python only: read keyword arguments `k=v, ...` up to this closing
            character instead of one value; they are reported as one object.
    """

    def __init__(self, handler: Any, dialect: Dialect, *, kwargs_close: str | None = None):
        self.h = handler
        self.dialect = dialect
        self.stack: list[_Frame] = []
        self.state = _VALUE
        self._str_key = False  # the open string is a key
        self._quote = '"'
        self._key_parts: list[str] = []
        if kwargs_close is not None:
            self._emit("obj_start")
            self.stack.append(_Frame("obj", kwargs_close, "="))
            self.state = _KEY
            self._kwargs = True
        else:
            self._kwargs = False

    @property
    def done(self) -> bool:
        return self.state == _DONE

    # -- events -----------------------------------------------------------------------
    def _emit(self, name: str, *args: Any) -> None:
        for frame in reversed(self.stack):
            if frame.queue is not None:
                frame.queue.append((name, args))
                return
        getattr(self.h, name)(*args)

    # -- driver -----------------------------------------------------------------------
    def feed(self, buf: str, pos: int, final: bool) -> tuple[int, Status]:
        """Consume `buf` from `pos`; returns the new position and the status.

        At `final`, text that waited for a terminator is decided with the end of input
        as the terminator; an unfinished value still returns MORE.
        """
        n = len(buf)
        while True:
            state = self.state
            if state == _DONE:
                return pos, Status.DONE
            if state == _STRING:
                pos, status = self._string(buf, pos, final)
                if status is not None:
                    return pos, status
                continue
            pos = _WS.match(buf, pos).end()
            if pos >= n:
                return pos, Status.MORE
            c = buf[pos]
            if state == _VALUE_OR_CLOSE:
                top = self.stack[-1]
                if c == top.close:
                    pos = self._close(pos)
                    continue
                state = self.state = _VALUE
            if state == _VALUE:
                pos, status = self._value(buf, pos, final)
                if status is not None:
                    return pos, status
            elif state == _AFTER_VALUE:
                pos, status = self._after_value(buf, pos, c)
                if status is not None:
                    return pos, status
            elif state == _KEY:
                pos, status = self._key(buf, pos, final, c)
                if status is not None:
                    return pos, status
            elif state == _AFTER_KEY:
                if c != self.stack[-1].sep:
                    return pos, Status.ERROR
                pos += 1
                self.state = _VALUE

    # -- values -----------------------------------------------------------------------
    def _value(self, buf: str, pos: int, final: bool) -> tuple[int, Status | None]:
        c = buf[pos]
        d = self.dialect
        if c == "{":
            if d is Dialect.PYTHON:
                self.stack.append(_Frame("brace", "}"))
                self.state = _VALUE_OR_CLOSE
            else:
                self._emit("obj_start")
                self.stack.append(_Frame("obj", "}"))
                self.state = _KEY
            return pos + 1, None
        if c == "[" or (c == "(" and d is Dialect.PYTHON):
            self._emit("arr_start")
            self.stack.append(_Frame("arr", "]" if c == "[" else ")"))
            self.state = _VALUE_OR_CLOSE
            return pos + 1, None
        if d is Dialect.GEMMA4 and c == "<":
            if buf.startswith(GEMMA4_QUOTE, pos):
                return self._open_string(GEMMA4_QUOTE, pos + len(GEMMA4_QUOTE), key=False)
            if GEMMA4_QUOTE.startswith(buf[pos:]) and not final:
                return pos, Status.MORE
            return pos, Status.ERROR
        if c == '"' or (c == "'" and d is Dialect.PYTHON):
            return self._open_string(c, pos + 1, key=False)
        if c in "-+.0123456789":
            return self._number(buf, pos, final)
        m = _IDENT.match(buf, pos)
        if m is None:
            return pos, Status.ERROR
        end = m.end()
        if end == len(buf) and not final:
            return pos, Status.MORE
        word = m.group()
        if d is Dialect.PYTHON and word in ("r", "u", "R", "U") and end < len(buf) and buf[end] in "'\"":
            return self._open_string(buf[end], end + 1, key=False)
        lit = _LITERALS.get(word)
        if lit is None:
            return pos, Status.ERROR
        self._scalar(lit)
        return end, None

    def _number(self, buf: str, pos: int, final: bool) -> tuple[int, Status | None]:
        if not final and _NUMBER_PREFIX.fullmatch(buf, pos):
            return pos, Status.MORE  # the number may go on
        m = _LOOSE_NUMBER.match(buf, pos)
        end = m.end() if m else pos
        if m is None or (end < len(buf) and buf[end] not in _VALUE_ENDERS):
            return pos, Status.ERROR
        text = m.group()
        if _JSON_NUMBER.fullmatch(text):
            self._scalar(text)
        elif _INT.fullmatch(text):
            self._scalar(str(int(text)))
        else:
            try:
                value = float(text)
            except ValueError:
                return pos, Status.ERROR
            if value != value or value in (float("inf"), float("-inf")):
                return pos, Status.ERROR
            self._scalar(repr(value))
        return end, None

    def _scalar(self, text: str) -> None:
        self._emit("scalar", text)
        self._after_item()

    def _after_item(self) -> None:
        self.state = _AFTER_VALUE if self.stack else _DONE

    # -- containers -------------------------------------------------------------------
    def _after_value(self, buf: str, pos: int, c: str) -> tuple[int, Status | None]:
        top = self.stack[-1]
        if c == ",":
            if top.kind == "brace":
                self._resolve_set(top)
            self.state = _KEY if top.kind == "obj" else _VALUE_OR_CLOSE
            return pos + 1, None
        if c == top.close:
            return self._close(pos), None
        if c == ":" and top.kind == "brace":
            if not self._resolve_dict(top):
                return pos, Status.ERROR
            self.state = _VALUE
            return pos + 1, None
        return pos, Status.ERROR

    def _close(self, pos: int) -> int:
        top = self.stack[-1]
        if top.kind == "brace":
            if top.queue:
                self._resolve_set(top)
            else:  # `{}` is an empty dict
                self.stack.pop()
                self._emit("obj_start")
                self._emit("obj_end")
                self._after_item()
                return pos + 1
        self.stack.pop()
        self._emit("obj_end" if top.kind == "obj" else "arr_end")
        self._after_item()
        return pos + 1

    def _resolve_set(self, top: _Frame) -> None:
        queue, top.queue = top.queue or [], None
        top.kind = "arr"
        self._emit("arr_start")
        for name, args in queue:
            self._emit(name, *args)

    def _resolve_dict(self, top: _Frame) -> bool:
        queue, top.queue = top.queue or [], None
        names = [q[0] for q in queue]
        if names and names[0] == "str_start" and names[-1] == "str_end":
            key = "".join(args[0] for name, args in queue if name == "str_chunk")
        elif names == ["scalar"]:
            key = queue[0][1][0]
        else:
            return False
        top.kind, top.dict_keys = "obj", True
        self._emit("obj_start")
        self._emit("key", key)
        return True

    # -- keys -------------------------------------------------------------------------
    def _key(self, buf: str, pos: int, final: bool, c: str) -> tuple[int, Status | None]:
        top = self.stack[-1]
        if c == top.close:
            return self._close(pos), None
        d = self.dialect
        if c == '"' or (c == "'" and d is Dialect.PYTHON):
            return self._open_string(c, pos + 1, key=True)
        if d is Dialect.GEMMA4 and c == "<":
            if buf.startswith(GEMMA4_QUOTE, pos):
                return self._open_string(GEMMA4_QUOTE, pos + len(GEMMA4_QUOTE), key=True)
            if GEMMA4_QUOTE.startswith(buf[pos:]) and not final:
                return pos, Status.MORE
            return pos, Status.ERROR
        if d is Dialect.JSON or (d is Dialect.PYTHON and top.dict_keys):
            if d is Dialect.PYTHON and c in "-+0123456789":
                m = _LOOSE_NUMBER.match(buf, pos)
                if m is None:
                    return pos, Status.ERROR
                if m.end() == len(buf) and not final:
                    return pos, Status.MORE
                self._emit("key", m.group())
                self.state = _AFTER_KEY
                return m.end(), None
            return pos, Status.ERROR
        m = (_GEMMA_KEY if d is Dialect.GEMMA4 else _IDENT).match(buf, pos)
        if m is None:
            return pos, Status.ERROR
        if m.end() == len(buf) and not final:
            return pos, Status.MORE
        self._emit("key", m.group())
        self.state = _AFTER_KEY
        return m.end(), None

    # -- strings ----------------------------------------------------------------------
    def _open_string(self, quote: str, pos: int, *, key: bool) -> tuple[int, None]:
        self._quote = quote
        self._str_key = key
        if key:
            self._key_parts = []
        else:
            self._emit("str_start")
        self.state = _STRING
        return pos, None

    def _chunk(self, text: str) -> None:
        if text:
            if self._str_key:
                self._key_parts.append(text)
            else:
                self._emit("str_chunk", text)

    def _end_string(self) -> None:
        if self._str_key:
            self._emit("key", "".join(self._key_parts))
            self.state = _AFTER_KEY
        else:
            self._emit("str_end")
            self._after_item()

    def _kwarg_value(self) -> bool:
        """The open string is the value of a top-level keyword argument."""
        return self._kwargs and len(self.stack) == 1 and not self._str_key

    def _string(self, buf: str, pos: int, final: bool) -> tuple[int, Status | None]:
        q = self._quote
        n = len(buf)
        if q == GEMMA4_QUOTE:
            end = buf.find(q, pos)
            if end >= 0:
                self._chunk(buf[pos:end])
                self._end_string()
                return end + len(q), None
            hold = _partial_suffix(buf, pos, q)
            self._chunk(buf[pos : n - hold])
            return n - hold, Status.MORE
        python = self.dialect is Dialect.PYTHON
        run = (_SQ_RUN if q == "'" else _DQ_RUN) if python or q == "'" else _DQ_RUN
        while pos < n:
            m = run.match(buf, pos)
            if m:
                self._chunk(m.group())
                pos = m.end()
                if pos >= n:
                    break
            c = buf[pos]
            if c == q:
                if not python:
                    self._end_string()
                    return pos + 1, None
                after = _WS.match(buf, pos + 1).end()
                if after >= n and not final:
                    return pos, Status.MORE  # cannot tell yet whether it closes
                closes = after >= n or buf[after] in _PY_CLOSERS
                if closes and after < n and buf[after] == "," and self._kwarg_value():
                    # `f(text='a', 'b')`: after a keyword argument's value a comma must
                    # lead to the next `name=`; otherwise the quote is inside the string
                    closes = _next_kwarg(buf, after + 1, final)
                    if closes is None:
                        return pos, Status.MORE
                if closes:
                    self._end_string()
                    return pos + 1, None
                self._chunk(c)  # an unescaped quote inside the string
                pos += 1
                continue
            # a backslash escape
            if pos + 1 >= n:
                return pos, Status.MORE
            e = buf[pos + 1]
            if e == "u":
                text, used = _unicode_escape(buf, pos, final)
                if used == 0:
                    return pos, Status.MORE
                self._chunk(text)
                pos += used
                continue
            if python:
                if e == "x":
                    if pos + 4 > n:
                        return pos, Status.MORE
                    try:
                        self._chunk(chr(int(buf[pos + 2 : pos + 4], 16)))
                    except ValueError:
                        self._chunk(buf[pos : pos + 2])
                        pos += 2
                        continue
                    pos += 4
                    continue
                self._chunk(_PY_ESCAPES.get(e, "\\" + e))
            else:
                self._chunk(_JSON_ESCAPES.get(e, e))
            pos += 2
        return pos, Status.MORE


_KWARG = re.compile(r"[ \t\r\n]*[A-Za-z_][A-Za-z0-9_]*[ \t\r\n]*=")
_KWARG_PREFIX = re.compile(r"[ \t\r\n]*(?:[A-Za-z_][A-Za-z0-9_]*[ \t\r\n]*)?")


def _next_kwarg(buf: str, pos: int, final: bool) -> bool | None:
    """Whether a keyword argument `name=` starts at `pos` (None: cannot tell yet)."""
    if _KWARG.match(buf, pos):
        return True
    if _KWARG_PREFIX.match(buf, pos).end() == len(buf):  # the text may still go on to `=`
        return True if final else None
    return False


def _unicode_escape(buf: str, pos: int, final: bool) -> tuple[str, int]:
    """Decode `\\uXXXX` (and a following low surrogate) at `pos`; (text, chars used).

    Returns used == 0 while the escape is not complete yet.
    """
    n = len(buf)
    if pos + 6 > n:
        return ("", 0) if not final else (buf[pos:], n - pos)
    if not _HEX4.fullmatch(buf, pos + 2, pos + 6):
        return buf[pos + 1 : pos + 2], 2
    code = int(buf[pos + 2 : pos + 6], 16)
    if 0xD800 <= code < 0xDC00:
        if pos + 12 > n and not final and buf.startswith("\\u"[: n - pos - 6], pos + 6):
            return "", 0
        if buf.startswith("\\u", pos + 6) and _HEX4.fullmatch(buf, pos + 8, pos + 12):
            low = int(buf[pos + 8 : pos + 12], 16)
            if 0xDC00 <= low < 0xE000:
                return chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)), 12
        return "\ufffd", 6
    if 0xDC00 <= code < 0xE000:
        return "\ufffd", 6
    return chr(code), 6


def _partial_suffix(buf: str, pos: int, marker: str) -> int:
    """Length of the longest tail of buf[pos:] that is a proper prefix of `marker`."""
    for k in range(min(len(marker) - 1, len(buf) - pos), 0, -1):
        if marker.startswith(buf[len(buf) - k :]):
            return k
    return 0
