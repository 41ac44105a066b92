"""Worker: one device's model and its decode loop (continuous batching), without Ray.

`generate(request)` is an async generator of events. Requests become sessions (built in a
helper thread: template, tokens, grammar compile), which a single decode thread steps
together: new prompts are prefilled in chunks between decode steps so running streams keep
flowing (several short prompts share one prefill forward), every running sequence advances
in one batched forward, and the grammar masks for the batch are computed in a second
thread while that forward runs (xgrammar and BLAS both release the GIL). A session whose
consumer goes away is cancelled at the next step, and its KV cache and slot are freed.
When the KV cache cannot hold the next step of every running sequence, the newest session
is paused (vLLM's recompute preemption): its blocks go back to the cache, and when there is
room again it takes back what the cache still holds of its tokens, recomputes the rest and
goes on where it stopped; its client only waits.

The decode thread also paces delivery: a stream's events wait in its outbox and go out
together at most once per stream interval (its first token and its end at once), and all
that is due after a step reaches the event loop in one hand-over. Every message through
Serve costs CPU that the decode loop shares, so the interval grows with the number of
open streams to keep the worker's total message rate bounded.
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
from actors.events import (
    Accepted,
    Event,
    Failed,
    GenerateRequest,
    Rejected,
    Usage,
    coalesce,
)
from actors.metrics import Metrics
from actors.outbox import End, Outbox, deliver
from actors.session import Choice, Session, build_session
from chat import GrammarEngine, detect_format
from npu import KVCacheFull, Model
from npu.sampler import sample_rows

log = logging.getLogger(__name__)
PREFILL_CHUNK = 256
class Worker:
    """Holds a model and serves requests on it.

    Args:
        model_factory: loads the model (called once, in the constructor).
        max_batch: sequences decoded together (and so admitted at once).
        stream_interval_s: after the first output, a stream's events are sent at most this
            often (what is ready is sent together). default: 0.
        max_messages_per_s: the messages per second all streams together aim not to
            exceed: with many open streams each one's interval grows to
            streams / max_messages_per_s. 0: no bound. default: 0.
    """

    def __init__(self, model_factory: Callable[[], Model], *, max_batch: int = 8,
                 stream_interval_s: float = 0.0, max_messages_per_s: float = 0.0) -> None:
        self.model = model_factory()
        self.spec = detect_format(self.model.chat_template_source, self.model.tokenizer.is_token)
        self.max_batch = max_batch
        self.stream_interval_s = stream_interval_s
        self.max_messages_per_s = max_messages_per_s
        self._grammar: GrammarEngine | None = None
        self._grammar_lock = threading.Lock()
        self._incoming: queue.Queue[tuple[Session, Outbox]] = queue.Queue()
        self._masks = ThreadPoolExecutor(1, thread_name_prefix="flm-masks")
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self.active = 0
        self.running_seqs = 0  # sequences being decoded
        self.waiting = 0  # admitted sessions that wait: prompt not prefilled yet, or paused
        self.requests = 0  # requests received, answered or not
        self.metrics = Metrics()
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
                self._grammar = GrammarEngine(m.token_table, list(m.eos_token_ids),
                                              on_compile=self._on_compile)
                log.info("Grammar engine ready in %.0f ms", (time.perf_counter() - t0) * 1000)
            return self._grammar

    def _on_compile(self, cached: bool, seconds: float) -> None:
        name = self.model.name
        self.metrics.inc("flm_grammar_compiles_total", name, "cached" if cached else "cold")
        if not cached:
            self.metrics.observe("flm_grammar_compile_seconds", name, value=seconds)

    def metrics_snapshot(self, replica: str) -> dict:
        """This worker's metrics, its gauges read now and labelled with `replica`."""
        name, m = self.model.name, self.metrics
        kv = self.model.engine.kv_usage()
        m.set("flm_running_sequences", name, replica, value=self.running_seqs)
        m.set("flm_waiting_requests", name, replica, value=self.waiting)
        m.set("flm_kv_cache_bytes", name, replica, value=kv["kv_bytes"])
        m.set("flm_kv_cache_blocks", name, replica, value=kv["kv_blocks"])
        m.set("flm_kv_cache_cached_blocks", name, replica, value=kv["cached_blocks"])
        return m.snapshot()

    # -- requests -------------------------------------------------------------------------------
    async def generate(self, request: GenerateRequest) -> AsyncIterator[list[Event]]:
        """Events for one request, in batches: Rejected alone, or Accepted first (together
        with the first output), then Deltas/Finished per choice, then Usage (or Failed if the
        worker breaks). A batch holds every event that was ready, so a slow consumer gets
        fewer, larger messages."""
        self.requests += 1
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
        outbox = Outbox(asyncio.get_running_loop())
        # Accepted goes out with the first output (one message less before the first token)
        outbox.pending.append(Accepted(request_id=request.request_id, model=self.model.name,
                                       prompt_tokens=len(session.prompt_ids)))
        self._ensure_thread()
        self._incoming.put((session, outbox))
        try:
            while True:
                batch = await outbox.queue.get()
                while not outbox.queue.empty():  # a slow consumer gets larger messages
                    batch += outbox.queue.get_nowait()
                end = bool(batch) and batch[-1] is End
                if end:
                    batch.pop()
                if batch:
                    yield coalesce(batch)
                if end:
                    return
        finally:
            session.cancelled = True  # the decode thread frees it at its next step

    def interval(self, streams: int) -> float:
        """Seconds a stream's events may wait to go out together, with `streams` open."""
        spread = streams / self.max_messages_per_s if self.max_messages_per_s else 0.0
        return max(self.stream_interval_s, spread)

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
        outboxes: dict[int, Outbox] = {}
        waiting: list[Session] = []  # admitted, prompt not fully prefilled
        running: list[Session] = []
        paused: list[Session] = []  # running ones whose KV gave way to the others
        # A decode step holds the GIL in short bursts; a smaller switch interval lets the
        # event loop thread forward events promptly.
        sys.setswitchinterval(0.001)
        try:
            while not self._stop.is_set():
                # admit what has arrived; when idle, wait a little for the next request
                block = not waiting and not running and not paused
                try:
                    while True:
                        if block:
                            session, outbox = self._incoming.get(timeout=0.05)
                            block = False
                        else:
                            session, outbox = self._incoming.get_nowait()
                        outboxes[session.id] = outbox
                        waiting.append(session)
                except queue.Empty:
                    pass
                self._drop_cancelled((waiting, running, paused), outboxes)
                self._count(waiting, running, paused)
                if not waiting and not running and not paused:
                    continue
                if paused:  # they go on before new prompts start
                    self._deliver(outboxes, self._resume_step(paused, running, outboxes))
                elif waiting:  # a first token goes out before the decode step
                    self._deliver(outboxes, self._prefill_step(waiting, running, outboxes))
                if running:
                    self._deliver(outboxes, self._decode_step(running, paused, outboxes))
                self._count(waiting, running, paused)
        except BaseException as exc:  # the worker is broken: tell every stream
            log.exception("decode loop failed")
            self.error = exc
            for session in waiting + running + paused:
                outbox = outboxes.pop(session.id, None)
                if outbox is not None:
                    outbox.put(Failed(message=f"The model worker failed: {exc}"))
                    outbox.put(End)
                    self._deliver({}, [outbox])

    def _deliver(self, outboxes: dict[int, Outbox], ended: list[Outbox]) -> None:
        """Hand over what is due, at this many open streams' interval (actors.outbox)."""
        deliver(outboxes, ended, self.interval(len(outboxes)))

    def _count(self, waiting: list[Session], running: list[Session],
               paused: list[Session]) -> None:
        self.active = len(running) + len(waiting) + len(paused)
        self.waiting = len(waiting) + len(paused)
        self.running_seqs = self._running_seqs(running)

    @staticmethod
    def _running_seqs(running: list[Session]) -> int:
        return sum(1 for s in running for c in s.choices if not c.done)

    def _drop_cancelled(self, groups, outboxes) -> None:
        for group in groups:
            for session in [s for s in group if s.cancelled]:
                group.remove(session)
                self._release(session)
                outboxes.pop(session.id, None)

    def _release(self, session: Session) -> None:
        for c in session.choices:
            self.model.engine.release(c.seq_id)
            if c.constraint is not None and c.constraint.gave_up:
                self.metrics.inc("flm_constraint_giveups_total", self.model.name)

    def _close(self, session: Session, outboxes: dict[int, Outbox]) -> Outbox:
        """Free a finished session; its outbox ends with Usage (delivered at once)."""
        self._release(session)
        outbox = outboxes.pop(session.id)
        outbox.put(Usage(prompt_tokens=len(session.prompt_ids),
                         completion_tokens=sum(c.generated for c in session.choices),
                         cached_tokens=session.cached or 0))
        outbox.put(End)
        return outbox

    def _prefill_step(self, waiting: list[Session], running: list[Session],
                      outboxes: dict[int, Outbox]) -> list[Outbox]:
        """Prefill the oldest waiting prompt's next chunk and, in the same forward, the
        waiting prompts behind it that fit whole in the rest of the chunk budget and of
        the batch. The oldest prompt takes at least half the budget; the rest goes to
        whole prompts in arrival order, skipping those too long for it (they start when
        they are the oldest), so a long prompt does not hold up the short ones behind it.
        A session whose prompt is done samples its first tokens and starts running.
        Returns the outboxes of sessions that ended on their first token."""
        seqs = self._running_seqs(running)
        head = waiting[0]
        n = len(head.choices)
        if seqs + n > max(self.max_batch, n):
            return []
        seqs += n
        self._start(head)
        head_left = len(head.prompt_ids) - head.prefilled
        room = PREFILL_CHUNK - min(head_left, PREFILL_CHUNK // 2)
        riders: list[tuple[Session, int]] = []
        for session in waiting[1:]:
            if room <= 0 or seqs + len(session.choices) > self.max_batch:
                break
            # a prompt starts (takes its cached prefix) when it rides or heads the queue:
            # one that waits may find more cached by then (the head's, if they share it)
            done = session.prefilled if session.cached is not None else \
                self.model.engine.cached_prefix(session.prompt_ids)
            left = len(session.prompt_ids) - done
            if left <= room:
                self._start(session)
                left = len(session.prompt_ids) - session.prefilled
                riders.append((session, left))
                room -= left
                seqs += len(session.choices)
        picked = [(head, min(head_left, PREFILL_CHUNK - sum(t for _, t in riders)))] + riders
        engine = self.model.engine
        # KV room for the pieces and for a step of every running sequence; without it,
        # prompts wait for running sequences to end (a prompt never takes the blocks
        # running sequences need next)
        headroom = self._running_seqs(running)
        while engine.blocks_needed([(s.choices[0].seq_id, take) for s, take in picked]) \
                + headroom > engine.blocks_available():
            if len(picked) > 1:
                picked.pop()
            elif running:
                return []
            else:  # nothing will free more: the oldest prompt does not fit at all
                return [self._reject_unfittable(head, waiting, outboxes)]
        try:
            logits = engine.prefill_many(
                [(s.choices[0].seq_id, s.prompt_ids[s.prefilled : s.prefilled + take])
                 for s, take in picked])
        except KVCacheFull:  # (the check above makes this a bug; answer it cleanly)
            log.exception("prefill ran out of KV blocks")
            return [self._reject_unfittable(head, waiting, outboxes)]
        ended: list[Outbox] = []
        for row, (session, take) in enumerate(picked):
            session.prefilled += take
            if session.prefilled < len(session.prompt_ids):
                continue
            waiting.remove(session)
            first = session.choices[0]
            for c in session.choices[1:]:
                engine.fork(first.seq_id, c.seq_id)
            outbox = outboxes[session.id]
            for c in session.choices:
                c.prepare_mask()
                outbox.pending += c.take(logits[row])
            if session.done:
                ended.append(self._close(session, outboxes))
            else:
                running.append(session)
        return ended

    def _decode_step(self, running: list[Session], paused: list[Session],
                     outboxes: dict[int, Outbox]) -> list[Outbox]:
        """One token for every running choice; returns the outboxes of ended sessions."""
        ended = self._make_room(running, paused, outboxes)
        batch: list[Choice] = [c for s in running for c in s.choices if not c.done]
        if batch:
            constrained = [c for c in batch if c.constraint is not None]
            masks = (self._masks.submit(lambda: [c.prepare_mask() for c in constrained])
                     if constrained else None)
            logits = self.model.engine.decode([c.seq_id for c in batch],
                                              [c.next_token for c in batch])
            if masks is not None:
                masks.result()
            tokens = sample_rows([c.sampler for c in batch], logits,
                                 [c.mask if c.masked else None for c in batch])
            for row, c in enumerate(batch):
                outboxes[c.session.id].pending += c.take(logits[row], tokens[row])
        done = [s for s in running if s.done]
        for session in done:
            running.remove(session)
        return ended + [self._close(s, outboxes) for s in done]

    def _reject_unfittable(self, session: Session, waiting: list[Session],
                           outboxes: dict[int, Outbox]) -> Outbox:
        """`session`'s prompt cannot fit in the KV cache: it ends with a 503."""
        waiting.remove(session)
        self._release(session)
        outbox = outboxes.pop(session.id)
        outbox.pending = [Rejected(
            status=503, message=f"The KV cache is full: the prompt's {len(session.prompt_ids)} "
            f"tokens do not fit in kv_cache_bytes ({self.model.engine.kv_max_blocks} blocks "
            "of 16 tokens) with what is running; retry later, or raise kv_cache_bytes.",
            type="server_error"), End]
        return outbox

    def _start(self, session: Session) -> None:
        """Before a prompt's first chunk: take what the KV cache holds of it."""
        if session.cached is None:
            session.cached = self.model.engine.reuse_prefix(session.choices[0].seq_id,
                                                            session.prompt_ids)
            session.prefilled = session.cached

    def _make_room(self, running: list[Session], paused: list[Session],
                   outboxes: dict[int, Outbox]) -> list[Outbox]:
        """KV blocks for the step: while the running choices need more than the cache can
        give, the newest session is paused (its blocks go back to the cache), or, when it is
        the only one left, stops with an error; returns the outboxes of those stopped."""
        engine = self.model.engine
        ended: list[Outbox] = []
        while running and engine.blocks_needed(
                [(c.seq_id, 1) for s in running for c in s.choices if not c.done]) \
                > engine.blocks_available():
            session = max(running, key=lambda s: s.id)
            running.remove(session)
            for c in session.choices:
                engine.release(c.seq_id)
            if running:
                paused.append(session)
                paused.sort(key=lambda s: s.id)
                self.metrics.inc("flm_preemptions_total", self.model.name)
                log.info("KV cache full: request %s paused", session.request.request_id)
                continue
            ended.append(self._fail_for_room(session, outboxes))
        return ended

    def _resume_step(self, paused: list[Session], running: list[Session],
                     outboxes: dict[int, Outbox]) -> list[Outbox]:
        """The oldest paused session goes on once its tokens fit beside a step of every
        running sequence: each live choice takes back what the cache holds of its prompt and
        output so far and recomputes the rest, then it runs again (its next token was
        sampled before it was paused). Alone and still too big, it stops with an error."""
        session = paused[0]
        engine = self.model.engine
        live = [c for c in session.choices if not c.done]
        fed = {c.index: session.prompt_ids + c.tokens[:-1] for c in live}
        # (the blocks the cache still holds count as available until taken back)
        need = engine.blocks_needed([(c.seq_id, len(fed[c.index]) + 1) for c in live])
        if need + self._running_seqs(running) > engine.blocks_available():
            if running:
                return []
            paused.pop(0)
            return [self._fail_for_room(session, outboxes)]
        paused.pop(0)
        try:
            for c in live:
                ids = fed[c.index]
                done = engine.reuse_prefix(c.seq_id, ids)
                while done < len(ids):
                    engine.prefill_many([(c.seq_id, ids[done : done + PREFILL_CHUNK])])
                    done += PREFILL_CHUNK
        except KVCacheFull:  # (the check above makes this a bug; answer it cleanly)
            log.exception("resuming request %s ran out of KV blocks",
                          session.request.request_id)
            for c in session.choices:
                engine.release(c.seq_id)
            return [self._fail_for_room(session, outboxes)]
        running.append(session)
        return []

    def _fail_for_room(self, session: Session, outboxes: dict[int, Outbox]) -> Outbox:
        """`session` cannot go on even alone in the KV cache: it ends with an error."""
        self._release(session)
        log.warning("KV cache full: request %s stopped", session.request.request_id)
        outbox = outboxes.pop(session.id)
        outbox.put(Failed(message="The KV cache is full (kv_cache_bytes): this request "
                          "cannot go on in it; retry it shorter, or raise kv_cache_bytes."))
        outbox.put(End)
        return outbox
