"""A stream's outbox between the worker's decode thread and its consumer's event loop, and
the pacing of delivery: a stream's events wait in its outbox and go out together at most
once per interval (its first output and its end at once); all that is due after a step
reaches each event loop in one hand-over."""

from __future__ import annotations

import asyncio
import itertools
import time

from actors.events import Deltas


class End:
    """Marks the end of a session's events."""


class Outbox:
    """A session's events between the decode thread and its consumer's event loop."""

    __slots__ = ("loop", "queue", "pending", "sent_at")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[list] = asyncio.Queue()
        self.pending: list = []  # decode thread only
        self.sent_at: float | None = None  # when the decode thread last handed events over

    def put(self, event: object) -> None:
        self.pending.append(event)


def hand_over(items: list[tuple[asyncio.Queue, list]]) -> None:
    for q, events in items:
        q.put_nowait(events)


def deliver(outboxes: dict[int, Outbox], ended: list[Outbox], wait: float) -> None:
    """Hand over what is due (one call per event loop): ended streams, a stream's first
    output, and streams whose `wait` (seconds) has passed since their last output went
    out."""
    now = time.monotonic()
    due: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, list]]] = {}
    for outbox in itertools.chain(ended, outboxes.values()):
        pending = outbox.pending
        if not pending:
            continue
        if outbox.sent_at is None:  # nothing shown yet: go as soon as there is output
            if not (pending[-1] is End or any(isinstance(e, Deltas) for e in pending)):
                continue
        elif now - outbox.sent_at < wait and pending[-1] is not End:
            continue
        due.setdefault(outbox.loop, []).append((outbox.queue, pending))
        outbox.pending = []
        outbox.sent_at = now
    for loop, items in due.items():
        try:
            loop.call_soon_threadsafe(hand_over, items)
        except RuntimeError:  # that event loop is closed: nobody is listening
            pass
