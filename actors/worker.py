"""Worker: one device's model and its decode loop (continuous batching), without Ray.

`generate(request)` is an async generator of events. Requests become sessions (built in a
helper thread: template, tokens, grammar compile), which a single decode thread steps
together: new prompts are prefilled in chunks between decode steps so running streams keep
flowing, every running sequence advances in one batched forward, and the grammar masks
for the batch are computed in a second thread while that forward runs (xgrammar and BLAS
both release the GIL). A session whose consumer goes away is cancelled at the next step,
and its KV cache and slot are freed.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor

from actors.errors import RequestError
from actors.events import Accepted, Event, Failed, GenerateRequest, Rejected, Usage
from actors.session import Choice, Session, build_session
from chat import GrammarEngine, detect_format
from npu import Model

log = logging.getLogger(__name__)
PREFILL_CHUNK = 256


class _End:
    """Marks the end of a session's events."""


class Worker:
    """Holds a model and serves requests on it.

    Args:
        model_factory: loads the model (called once, in the constructor).
        max_batch: sequences decoded together (and so admitted at once).
        stream_interval_s: after the first output, events are sent at most this often
            (what is ready is sent together): each message through Serve costs CPU that
            the decode loop shares, so fewer, larger messages stream faster. default: 0.
    """

    def __init__(self, model_factory: Callable[[], Model], *, max_batch: int = 8,
                 stream_interval_s: float = 0.0) -> None:
        self.model = model_factory()
        self.spec = detect_format(self.model.chat_template_source, self.model.tokenizer.is_token)
        self.max_batch = max_batch
        self.stream_interval_s = stream_interval_s
        self._grammar: GrammarEngine | None = None
        self._grammar_lock = threading.Lock()
        self._incoming: queue.Queue[tuple[Session, Callable[[object], None]]] = queue.Queue()
        self._masks = ThreadPoolExecutor(1, thread_name_prefix="flm-masks")
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self.active = 0
        self.started = time.time()
        self.model.token_table  # noqa: B018  (built now, not on a request)
        log.info("Chat format: %s%s", self.spec.kind.value,
                 " with reasoning" if self.spec.reasoning else "")

    # -- the grammar engine, built lazily once -------------------------------------------------
    def grammar_engine(self) -> GrammarEngine:
        with self._grammar_lock:
            if self._grammar is None:
                t0 = time.perf_counter()
                m = self.model
                self._grammar = GrammarEngine(m.token_table, list(m.eos_token_ids))
                log.info("Grammar engine ready in %.0f ms", (time.perf_counter() - t0) * 1000)
            return self._grammar

    # -- requests -------------------------------------------------------------------------------
    async def generate(self, request: GenerateRequest) -> AsyncIterator[list[Event]]:
        """Events for one request, in batches: [Accepted] or [Rejected] first, then
        Deltas/Finished per choice, then Usage (or Failed if the worker breaks). A batch
        holds every event that was ready, so a slow consumer gets fewer, larger messages."""
        try:
            session = await asyncio.to_thread(build_session, request, self.model, self.spec,
                                              self.grammar_engine)
        except RequestError as exc:
            yield [Rejected(status=exc.status, message=exc.message, param=exc.param,
                            code=exc.code, type=exc.type)]
            return
        except Exception:  # a bug: answer cleanly, keep serving
            log.exception("preparing request %s failed", request.request_id)
            yield [Rejected(status=500, message="Internal error while preparing the request.",
                            type="server_error")]
            return
        if self.error is not None:
            yield [Rejected(status=503, message="The model worker has failed.",
                            type="server_error")]
            return
        yield [Accepted(request_id=request.request_id, model=self.model.name,
                        prompt_tokens=len(session.prompt_ids))]
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def sink(item: object) -> None:
            loop.call_soon_threadsafe(events.put_nowait, item)

        self._ensure_thread()
        self._incoming.put((session, sink))
        first = True
        try:
            while True:
                batch = [await events.get()]
                if not first and self.stream_interval_s and batch[0] is not _End:
                    await asyncio.sleep(self.stream_interval_s)
                first = False
                while not events.empty():
                    batch.append(events.get_nowait())
                end = batch[-1] is _End
                if end:
                    batch.pop()
                if batch:
                    yield batch  # type: ignore[misc]
                if end:
                    return
        finally:
            session.cancelled = True  # the decode thread frees it at its next step

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            if self.error is not None:
                return
            self._thread = threading.Thread(target=self._run, name="flm-decode", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._masks.shutdown(wait=False)

    @property
    def healthy(self) -> bool:
        return self.error is None

    # -- the decode loop ------------------------------------------------------------------------
    def _run(self) -> None:
        sinks: dict[int, Callable[[object], None]] = {}
        waiting: list[Session] = []  # admitted, prompt not fully prefilled
        running: list[Session] = []
        # A decode step holds the GIL in short bursts; a smaller switch interval lets the
        # event loop thread forward events promptly.
        sys.setswitchinterval(0.001)
        try:
            while not self._stop.is_set():
                # admit what has arrived; when idle, wait a little for the next request
                block = not waiting and not running
                try:
                    while True:
                        if block:
                            session, sink = self._incoming.get(timeout=0.05)
                            block = False
                        else:
                            session, sink = self._incoming.get_nowait()
                        sinks[session.id] = sink
                        waiting.append(session)
                except queue.Empty:
                    pass
                self._drop_cancelled(waiting, running, sinks)
                self.active = len(running) + len(waiting)
                if not waiting and not running:
                    continue
                # one prefill chunk per step, for the oldest waiting session with room
                if waiting and self._running_seqs(running) + len(waiting[0].choices) \
                        <= max(self.max_batch, len(waiting[0].choices)):
                    session = waiting[0]
                    if self._prefill_chunk(session, sinks[session.id]):
                        waiting.pop(0)
                        if session.done:
                            self._close(session, sinks)
                        else:
                            running.append(session)
                if running:
                    self._decode_step(running, sinks)
                self.active = len(running) + len(waiting)
        except BaseException as exc:  # the worker is broken: tell every stream
            log.exception("decode loop failed")
            self.error = exc
            for session in waiting + running:
                sink = sinks.get(session.id)
                if sink:
                    sink(Failed(message=f"The model worker failed: {exc}"))
                    sink(_End)

    @staticmethod
    def _running_seqs(running: list[Session]) -> int:
        return sum(1 for s in running for c in s.choices if not c.done)

    def _drop_cancelled(self, waiting, running, sinks) -> None:
        for group in (waiting, running):
            for session in [s for s in group if s.cancelled]:
                group.remove(session)
                self._release(session)
                sinks.pop(session.id, None)

    def _release(self, session: Session) -> None:
        for c in session.choices:
            self.model.engine.release(c.seq_id)

    def _close(self, session: Session, sinks) -> None:
        self._release(session)
        sink = sinks.pop(session.id, None)
        if sink:
            sink(Usage(prompt_tokens=len(session.prompt_ids),
                       completion_tokens=sum(c.generated for c in session.choices)))
            sink(_End)

    def _prefill_chunk(self, session: Session, sink) -> bool:
        """Prefill one chunk; True when the prompt is done (and first tokens sampled)."""
        engine = self.model.engine
        first = session.choices[0]
        ids = session.prompt_ids[session.prefilled : session.prefilled + PREFILL_CHUNK]
        logits = engine.prefill(first.seq_id, ids)
        session.prefilled += len(ids)
        if session.prefilled < len(session.prompt_ids):
            return False
        for c in session.choices[1:]:
            engine.fork(first.seq_id, c.seq_id)
        for c in session.choices:
            c.prepare_mask()
            for event in c.take(logits):
                sink(event)
        return True

    def _decode_step(self, running: list[Session], sinks) -> None:
        batch: list[Choice] = [c for s in running for c in s.choices if not c.done]
        if batch:
            masks = self._masks.submit(lambda: [c.prepare_mask() for c in batch])
            logits = self.model.engine.decode([c.seq_id for c in batch],
                                              [c.next_token for c in batch])
            masks.result()
            for row, c in enumerate(batch):
                sink = sinks.get(c.session.id)
                for event in c.take(logits[row]):
                    if sink:
                        sink(event)
        for session in [s for s in running if s.done]:
            running.remove(session)
            self._close(session, sinks)
