"""JSONWriter: turns value events into canonical JSON text, piece by piece.

Every argument dialect (JSON, Qwen XML, Gemma4, Python calls) is read into the same
events; this writer prints them as JSON with ", " and ": " separators. A piece is only
written once it is final, so the text so far is always a prefix of the finished text.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

_encode_str = json.encoder.encode_basestring  # type: ignore[attr-defined]


def escape(text: str) -> str:
    """`text` as the inside of a JSON string literal (non-ASCII kept as is)."""
    return _encode_str(text)[1:-1]


class JSONWriter:
    """Event handler writing canonical JSON text to `out`.

    Events: obj_start, obj_end, arr_start, arr_end, key(name), str_start, str_chunk(text),
    str_end, scalar(json_text). A separator is written only when the next member starts.
    """

    __slots__ = ("out", "_counts", "_after_key", "depth_zero_done")

    def __init__(self, out: Callable[[str], None]) -> None:
        self.out = out
        self._counts: list[int] = []  # members written per open container
        self._after_key = False
        self.depth_zero_done = False

    def _value_start(self) -> None:
        if self._after_key:
            self._after_key = False
        elif self._counts:
            if self._counts[-1]:
                self.out(", ")
            self._counts[-1] += 1

    def _value_end(self) -> None:
        if not self._counts:
            self.depth_zero_done = True

    def obj_start(self) -> None:
        self._value_start()
        self.out("{")
        self._counts.append(0)

    def arr_start(self) -> None:
        self._value_start()
        self.out("[")
        self._counts.append(0)

    def obj_end(self) -> None:
        self._counts.pop()
        self.out("}")
        self._value_end()

    def arr_end(self) -> None:
        self._counts.pop()
        self.out("]")
        self._value_end()

    def key(self, name: str) -> None:
        if self._counts[-1]:
            self.out(", ")
        self._counts[-1] += 1
        self.out(_encode_str(name) + ": ")
        self._after_key = True

    def str_start(self) -> None:
        self._value_start()
        self.out('"')

    def str_chunk(self, text: str) -> None:
        if text:
            self.out(escape(text))

    def str_end(self) -> None:
        self.out('"')
        self._value_end()

    def scalar(self, text: str) -> None:
        self._value_start()
        self.out(text)
        self._value_end()

    def value(self, obj: Any) -> None:
        """Write a whole decoded value (from json.loads or a typed XML parameter)."""
        if isinstance(obj, dict):
            self.obj_start()
            for k, v in obj.items():
                self.key(str(k))
                self.value(v)
            self.obj_end()
        elif isinstance(obj, (list, tuple)):
            self.arr_start()
            for v in obj:
                self.value(v)
            self.arr_end()
        elif isinstance(obj, str):
            self.str_start()
            self.str_chunk(obj)
            self.str_end()
        else:
            self.scalar(json.dumps(obj))
