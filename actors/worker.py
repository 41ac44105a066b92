"""Worker: one device's model and its decode loop (continuous batching), without Ray.

`generate(request)` is an async generator of events. Requests become sessions (built in a
helper thread: template, tokens, grammar compile), which a single decode thread steps
together as actors.scheduler decides (prompts in chunks between decode steps, one batched
forward for every running sequence, recompute preemption when the KV cache is full). A
session whose consumer goes away is cancelled at the next step, and its KV cache and slot
are freed.

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

from actors.embedding import Embedder, EmbedJob
from actors.errors import RequestError
from actors.events import (
    Accepted,
    ChatGenerate,
    EmbedGenerate,
    Event,
    Failed,
    GenerateRequest,
    Rejected,
    coalesce,
)
from actors.metrics import Metrics
from actors.outbox import End, Outbox, deliver
from actors.rerank import Rerank, build_job, is_reranker, rerank_only
from actors.scheduler import Scheduler
from actors.session import Session, build_session, chosen_template, counted
from actors.speculation import Speculation
from actors.tokenize import Detokenize, Tokenize, TokenizerInfo
from actors.tokenize import answer as tokenize_answer
from chat import FormatSpec, GrammarEngine, detect_format
from npu import Model

log = logging.getLogger(__name__)
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
        speculation: speculative decoding from the prompt. default: `Speculation()`.
    """

    def __init__(self, model_factory: Callable[[], Model], *, max_batch: int = 8,
                 stream_interval_s: float = 0.0, max_messages_per_s: float = 0.0,
                 speculation: Speculation | None = None) -> None:
        self.model = model_factory()
        self.spec = detect_format(self.model.chat_template_source, self.model.tokenizer.is_token)
        tool = self.model.tool_template
        # the format of a conversation with tools (the tool_use template's, where it has one)
        self.tool_spec = detect_format(tool.source, self.model.tokenizer.is_token) \
            if tool is not None else self.spec
        self._specs: dict[str, FormatSpec] = {}  # requests' own templates' formats
        self.max_batch = max_batch
        self.stream_interval_s = stream_interval_s
        self.max_messages_per_s = max_messages_per_s
        self._grammar: GrammarEngine | None = None
        self._grammar_lock = threading.Lock()
        self._incoming: queue.Queue[tuple[Session | EmbedJob, Outbox]] = queue.Queue()
        self._masks = ThreadPoolExecutor(1, thread_name_prefix="flm-masks")
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self.active = 0
        self.running_seqs = 0  # sequences being decoded
        self.waiting = 0  # admitted sessions that wait: prompt not prefilled yet, or paused
        self.requests = 0  # requests received, answered or not
        self.metrics = Metrics()
        self.scheduler = Scheduler(self.model, self.metrics, max_batch, self._masks,
                                   speculation if speculation is not None else Speculation())
        self.embedder = Embedder(self.model)
        self.started = time.time()
        if self.model.generates:
            self.model.token_table  # noqa: B018  (built now, not on a request)
            # the grammar engine too, beside the first requests: xgrammar's import (torch,
            # transformers) is ~2.2 s, which the first request with tools or a schema paid
            threading.Thread(target=self._warm_grammar, name="flm-grammar-warm",
                             daemon=True).start()
        log.info("Chat format: %s%s", self.spec.kind.value,
                 " with reasoning" if self.spec.reasoning else "")

    def spec_for(self, request: GenerateRequest) -> FormatSpec:
        """The chat format of the template `request` renders with (its own, a library
        variant's, the model's tool_use template, or the model's: `chosen_template`)."""
        source = chosen_template(request, self.model)
        if source is None:
            return self.spec
        spec = self._specs.get(source)
        if spec is None:
            if len(self._specs) >= 16:
                self._specs.clear()
            spec = self._specs[source] = detect_format(source, self.model.tokenizer.is_token)
        return spec

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

    def _warm_grammar(self) -> None:
        try:
            self.grammar_engine()
        except Exception as exc:  # the first request that needs it raises it again, as its own
            log.warning("Grammar engine not built ahead: %s", exc)

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
    async def generate(self, request: GenerateRequest | Rerank | Tokenize | Detokenize
                       | TokenizerInfo) -> AsyncIterator[list[Event]]:
        """Events for one request, in batches: Rejected alone, or Accepted first (together
        with the first output), then Deltas/Finished per choice, then Usage (or Failed if the
        worker breaks). A batch holds every event that was ready, so a slow consumer gets
        fewer, larger messages. A Tokenize, Detokenize or TokenizerInfo is answered in one
        batch (Accepted and its Tokens, Text or Info: actors.tokenize), in a helper thread:
        nothing is scheduled."""
        self.requests += 1
        if isinstance(request, (Tokenize, Detokenize, TokenizerInfo)):
            yield await asyncio.to_thread(tokenize_answer, request, self.model)
            return
        if isinstance(request, (EmbedGenerate, Rerank)):  # a Rerank's pairs embed alike
            async for batch in self._embed(request):
                yield batch
            return
        if is_reranker(self.model):
            yield [Rejected(status=400, param="model", message=rerank_only(self.model))]
            return
        if not self.model.generates:
            yield [Rejected(status=400, param="model", message=(
                f"The model '{self.model.name}' is an embedding model ({self.model.kind}): "
                "it serves embeddings (/v1/embeddings, /api/embed), not generation."))]
            return
        try:
            session = await asyncio.to_thread(build_session, request, self.model,
                                              self.spec_for(request), self.grammar_engine)
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
        async for batch in self._submit(session, outbox):
            yield batch

    async def _embed(self, request: EmbedGenerate | Rerank) -> AsyncIterator[list[Event]]:
        """An embedding request's events: Rejected, or Accepted, Embeddings (a Rerank's:
        Scores) and Usage."""
        try:
            job = await asyncio.to_thread(build_job, request, self.model)
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
        job.outbox = outbox = Outbox(asyncio.get_running_loop())
        outbox.pending.append(job.accepted(self.model.name))
        async for batch in self._submit(job, outbox):
            yield batch

    async def _submit(self, item: Session | EmbedJob,
                      outbox: Outbox) -> AsyncIterator[list[Event]]:
        """Hand `item` to the decode thread and yield its events as they are delivered;
        a consumer that goes away cancels it."""
        self._ensure_thread()
        self._incoming.put((item, outbox))
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
            item.cancelled = True  # the decode thread frees it at its next step

    async def count_tokens(self, request: ChatGenerate) -> Accepted | Rejected:
        """What `generate`'s first event would say of `request`'s prompt (its token count,
        or why the template refuses it), without running it: nothing is scheduled."""
        try:
            n = await asyncio.to_thread(counted, request, self.model, self.spec_for(request),
                                        self.grammar_engine)
        except RequestError as exc:
            return Rejected(status=exc.status, message=exc.message, param=exc.param,
                            code=exc.code, type=exc.type)
        return Accepted(request_id=request.request_id, model=self.model.name, prompt_tokens=n)

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
        embeds: list[EmbedJob] = []
        sched = self.scheduler

        def hand(ended: list[Outbox]) -> None:
            # the gauges first: a client that sees its request end sees it counted out
            self._count(waiting, running, paused, embeds)
            self._deliver(outboxes, ended)

        # A decode step holds the GIL in short bursts; a smaller switch interval lets the
        # event loop thread forward events promptly.
        sys.setswitchinterval(0.001)
        try:
            while not self._stop.is_set():
                # admit what has arrived; when idle, wait a little for the next request
                block = not waiting and not running and not paused and not embeds
                try:
                    while True:
                        if block:
                            item, outbox = self._incoming.get(timeout=0.05)
                            block = False
                        else:
                            item, outbox = self._incoming.get_nowait()
                        if isinstance(item, EmbedJob):
                            embeds.append(item)
                            continue
                        outboxes[item.id] = outbox
                        waiting.append(item)
                except queue.Empty:
                    pass
                sched.drop_cancelled((waiting, running, paused), outboxes)
                embeds[:] = [j for j in embeds if not j.cancelled]
                self.embedder.drop_cancelled()
                self._count(waiting, running, paused, embeds)
                if not waiting and not running and not paused and not embeds:
                    continue
                busy = bool(waiting or running or paused)
                t0 = time.perf_counter()
                if paused:  # they go on before new prompts start
                    hand(sched.resume_step(paused, running, outboxes, waiting))
                elif waiting:  # a first token goes out before the decode step
                    hand(sched.prefill_step(waiting, running, outboxes))
                if running:
                    hand(sched.decode_step(running, paused, outboxes, waiting))
                # between the chats' steps, in a bounded share of their time
                if embeds:
                    if busy:
                        self.embedder.earn(time.perf_counter() - t0)
                    if self.embedder.ready(busy):
                        hand(self.embedder.run(embeds, busy))
            self.embedder.close()
        except BaseException as exc:  # the worker is broken: tell every stream
            log.exception("decode loop failed")
            self.error = exc
            broken = [outboxes.pop(s.id, None) for s in waiting + running + paused]
            for outbox in broken + [j.outbox for j in embeds]:
                if outbox is not None:
                    outbox.put(Failed(message=f"The model worker failed: {exc}"))
                    outbox.put(End)
                    self._deliver({}, [outbox])

    def _deliver(self, outboxes: dict[int, Outbox], ended: list[Outbox]) -> None:
        """Hand over what is due, at this many open streams' interval (actors.outbox)."""
        deliver(outboxes, ended, self.interval(len(outboxes)))

    def _count(self, waiting: list[Session], running: list[Session],
               paused: list[Session], embeds: list[EmbedJob]) -> None:
        self.active = len(running) + len(waiting) + len(paused) + len(embeds)
        self.waiting = len(waiting) + len(paused) + len(embeds)
        self.running_seqs = Scheduler.running_seqs(running)
