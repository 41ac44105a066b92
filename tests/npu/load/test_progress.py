"""A model's load progress (npu/load/progress.py): one line redrawn on a terminal, a line
per quarter in a log, nothing for a fast load."""

from __future__ import annotations

import io

from npu.load.progress import Progress


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _load(stream: io.StringIO, steps: int = 40, step_s: float = 0.2) -> str:
    clock = Clock()
    bar = Progress("model.gguf", 100_000_000, stream=stream, clock=clock)
    for _ in range(steps):
        clock.now += step_s
        bar.add(100_000_000 // steps)
    bar.end()
    return stream.getvalue()


def test_log_gets_a_line_per_quarter_and_the_end() -> None:
    lines = _load(io.StringIO()).splitlines()
    assert [line.split(":")[1].split("(")[0].strip() for line in lines[:-1]] == \
        ["25%", "50%", "75%"]
    assert lines[-1] == "loaded model.gguf: 100 MB in 8.0 s"
    assert "\r" not in "".join(lines)


def test_terminal_gets_one_line_redrawn() -> None:
    out = _load(Terminal())
    assert out.count("\n") == 1 and out.endswith("loaded model.gguf: 100 MB in 8.0 s\x1b[K\n")
    assert out.count("\r") <= 40 and "\rloading model.gguf:  97% (98 / 100 MB" in out


def test_fast_load_says_nothing() -> None:
    assert _load(io.StringIO(), steps=4, step_s=0.1) == ""
