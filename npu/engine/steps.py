"""Work done in steps: a generator that yields after each bounded piece of work and returns
its result (`Steps`), so that its caller can put other work between the pieces (the worker
runs an embedding forward between decode steps); `run_steps` runs one to its end."""

from __future__ import annotations

from collections.abc import Generator
from typing import TypeVar

T = TypeVar("T")
Steps = Generator[None, None, T]


def run_steps(steps: Steps[T]) -> T:
    """Every step of `steps`; its result."""
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value
