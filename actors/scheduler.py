"""Scheduler: how a worker's sessions share the model, step by step (continuous batching).

New prompts are prefilled in chunks between decode steps so running streams keep flowing
(several short prompts share one prefill forward), every running sequence advances in one
batched forward, and the grammar masks for the batch are computed in a second thread while
that forward runs (xgrammar and BLAS both release the GIL). When the KV cache cannot hold
the next step of every running sequence, the newest session is paused (vLLM's recompute
preemption): its blocks go back to the cache, and when there is room again it takes back
what the cache still holds of its tokens, recomputes the rest and goes on where it stopped.

Each step returns the outboxes of the sessions that ended in it; the worker's decode thread
delivers them (actors.outbox).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor

from actors.events import Accepted, Failed, Rejected, Usage
from actors.metrics import Metrics
from actors.outbox import End, Outbox
from actors.score_memo import ScoreMemo
from actors.session import Choice, Session
from actors.speculation import NgramDrafter, Speculation, StepCost, draft_length
from npu import KVCacheFull, Model
from npu.sampler import sample_rows

log = logging.getLogger(__name__)
PREFILL_CHUNK = 256
PROBE_EVERY = 64  # steps a choice whose drafts do not pay goes without drafting


class Scheduler:
    """The steps of one worker's sessions on its model.

    Args:
        model: the worker's model.
        metrics: the worker's metrics (preemptions, constraint give-ups).
        max_batch: sequences decoded together.
        masks: the thread that computes grammar masks while a forward runs.
        speculation: speculative decoding from the prompt (the worker's; off for a model
            that cannot take tokens back).
    """

    def __init__(self, model: Model, metrics: Metrics, max_batch: int,
                 masks: ThreadPoolExecutor, speculation: Speculation) -> None:
        self.model, self.metrics, self.max_batch, self._masks = model, metrics, max_batch, masks
        self.speculation = (speculation if speculation.on and model.engine.can_rewind
                            else None)
        self.cost = StepCost()  # what drafts add to a forward, measured
        # scored prompts' logprobs, so their starts' cached blocks are usable (none to use
        # where the engine keeps no prefix cache)
        self.scores = ScoreMemo() if getattr(model.engine, "prefix_cache", True) \
            else ScoreMemo(max_cost=0)

    @staticmethod
    def running_seqs(running: list[Session]) -> int:
        return sum(1 for s in running for c in s.choices if not c.done)

    def drop_cancelled(self, groups, outboxes) -> None:
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
        accepted = sum(c.accepted for c in session.choices)
        outbox.put(Usage(prompt_tokens=len(session.prompt_ids),
                         completion_tokens=sum(c.generated for c in session.choices),
                         cached_tokens=session.cached or 0,
                         accepted_prediction_tokens=accepted,
                         rejected_prediction_tokens=sum(c.drafted for c in session.choices)
                         - accepted,
                         reasoning_tokens=sum(c.reasoned for c in session.choices)))
        outbox.put(End)
        return outbox

    def prefill_step(self, waiting: list[Session], running: list[Session],
                      outboxes: dict[int, Outbox]) -> list[Outbox]:
        """Prefill the oldest waiting prompt's next chunk and, in the same forward, the
        waiting prompts behind it that fit whole in the rest of the chunk budget and of
        the batch. The oldest prompt takes at least half the budget; the rest goes to
        whole prompts in arrival order, skipping those too long for it (they start when
        they are the oldest), so a long prompt does not hold up the short ones behind it.
        A session whose prompt is done samples its first tokens and starts running.
        A prompt whose own logprobs are asked (`Session.scores_prompt`) needs every row's
        logits: it goes in a forward of its own, and rides no other's.
        Returns the outboxes of sessions that ended on their first token."""
        seqs = self.running_seqs(running)
        head = waiting[0]
        n = len(head.choices)
        if seqs + n > max(self.max_batch, n):
            return []
        seqs += n
        self._start(head, outboxes)
        head_left = len(head.prompt_ids) - head.prefilled
        room = PREFILL_CHUNK - min(head_left, PREFILL_CHUNK // 2)
        riders: list[tuple[Session, int]] = []
        for session in [] if head.scores_prompt else waiting[1:]:
            if room <= 0 or seqs + len(session.choices) > self.max_batch:
                break
            if session.scores_prompt:
                continue
            # a prompt starts (takes its cached prefix) when it rides or heads the queue:
            # one that waits may find more cached by then (the head's, if they share it)
            done = session.prefilled if session.cached is not None else \
                self.model.engine.cached_prefix(session.prompt_ids)
            left = len(session.prompt_ids) - done
            if left <= room:
                self._start(session, outboxes)
                left = len(session.prompt_ids) - session.prefilled
                riders.append((session, left))
                room -= left
                seqs += len(session.choices)
        picked = [(head, min(head_left, PREFILL_CHUNK - sum(t for _, t in riders)))] + riders
        engine = self.model.engine
        # KV room for the pieces and for a step of every running sequence; without it,
        # prompts wait for running sequences to end (a prompt never takes the blocks
        # running sequences need next)
        headroom = self.running_seqs(running)
        while engine.blocks_needed([(s.choices[0].seq_id, take) for s, take in picked]) \
                + headroom > engine.blocks_available():
            if len(picked) > 1:
                picked.pop()
            elif running:
                return []
            elif self._give_back(waiting[1:]):  # (a prompt behind it took its cached start)
                continue
            else:  # nothing will free more: the oldest prompt does not fit at all
                return [self._reject_unfittable(head, waiting, outboxes)]
        try:
            logits = engine.prefill_many(
                [(s.choices[0].seq_id, s.prompt_ids[s.prefilled : s.prefilled + take])
                 for s, take in picked], every_row=head.scores_prompt)
        except KVCacheFull:  # (the check above makes this a bug; answer it cleanly)
            log.exception("prefill ran out of KV blocks")
            return [self._reject_unfittable(head, waiting, outboxes)]
        if head.scores_prompt:  # (alone in the forward: every row is its own)
            head.score(logits, head.prefilled)
            logits = logits[-1:]
        ended: list[Outbox] = []
        for row, (session, take) in enumerate(picked):
            session.prefilled += take
            if session.prefilled < len(session.prompt_ids):
                continue
            waiting.remove(session)
            if session.scores_prompt:
                self.scores.add(session.prompt_ids, session.request.top_logprobs,
                                session.prompt_scores)
            first = session.choices[0]
            for c in session.choices[1:]:
                engine.fork(first.seq_id, c.seq_id)
            outbox = outboxes[session.id]
            outbox.pending += session.prompt_event()
            for c in session.choices:
                c.prepare_mask()
                outbox.pending += c.first(logits[row])
            if session.done:
                ended.append(self._close(session, outboxes))
            else:
                running.append(session)
        return ended

    def decode_step(self, running: list[Session], paused: list[Session],
                     outboxes: dict[int, Outbox], waiting: list[Session]) -> list[Outbox]:
        """One token for every running choice (room made for it: `_make_room`); returns the
        outboxes of ended sessions."""
        ended = self._make_room(running, paused, waiting, outboxes)
        batch: list[Choice] = [c for s in running for c in s.choices if not c.done]
        drafts = self._drafts(batch) if batch and self.speculation is not None else None
        if drafts is not None:
            self._verify_step(batch, drafts, outboxes)
        elif batch:
            constrained = [c for c in batch if c.constraint is not None]
            masks = (self._masks.submit(lambda: [c.prepare_mask() for c in constrained])
                     if constrained else None)
            start = time.perf_counter()
            logits = self.model.engine.decode([c.seq_id for c in batch],
                                              [c.next_token for c in batch])
            self.cost.record(len(batch), time.perf_counter() - start)
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

    # -- speculative decoding ------------------------------------------------------------------
    def _drafts(self, batch: list[Choice]) -> list[list[int]] | None:
        """Each choice's drafted tokens for this step (those its grammar admits, no more than
        its max_tokens and context leave room for), or None when nothing is drafted (or
        the KV cache has no room for the drafts): a plain decode step.

        The step's rows (one per choice, plus the drafts) stay within `tokens` + 1, drafts
        going to choices in batch order: a product over a few rows costs little more than
        over one, but a batch that is already many rows gains nothing from more. A choice's
        drafts are as many as pay for themselves (`draft_length`): at the rate the choice
        keeps its drafts, against what more rows cost a forward here (`StepCost`)."""
        spec = self.speculation
        budget = spec.tokens + 1 - len(batch)
        if budget <= 0:  # the batch alone is as many rows as a step takes
            return None
        out: list[list[int]] = []
        for c in batch:
            s = c.session
            room = min(budget, s.context_limit - len(s.prompt_ids) - c.generated - 1)
            if s.request.max_tokens is not None:
                room = min(room, s.request.max_tokens - c.generated - 1)
            if room <= 0 or c.forced:
                out.append([])
                continue
            if c.drafter is None:
                c.drafter = NgramDrafter(s.prompt_ids, lookup_max=spec.lookup_max,
                                         lookup_min=spec.lookup_min)
            draft = c.drafter.propose(c.tokens, room)
            if draft and c.constraint is not None:
                del draft[c.constraint.admits(draft):]
            if draft:  # as many as pay for their rows, at the choice's rate of keeping them
                rows = spec.tokens + 1 - budget
                m = draft_length(c.keep_rate(c.drafter.matched), len(draft),
                                 (lambda m: 1.0 + spec.row_cost * m)
                                 if spec.row_cost is not None
                                 else lambda m: self.cost.ratio(rows, m))
                c.idle = 0 if m else c.idle + 1
                if c.idle >= PROBE_EVERY:  # a draft now and then: the text may start to repeat
                    m, c.idle = min(2, len(draft)), 0
                del draft[m:]
            budget -= len(draft)
            out.append(draft)
        if not any(out):
            return None
        engine = self.model.engine
        if engine.blocks_needed([(c.seq_id, 1 + len(d)) for c, d in zip(batch, out)]) \
                > engine.blocks_available():
            return None
        return out

    def _verify_step(self, batch: list[Choice], drafts: list[list[int]],
                     outboxes: dict[int, Outbox]) -> None:
        """One forward for the batch's next tokens and their drafts; each choice keeps its
        drafted tokens up to the first the sampler rejects (`Sampler.verify`: the same
        output as without drafts) and one token after them (the sampler's choice where it
        rejected a draft, else a fresh sample), and its KV past what it kept is taken back.
        The tokens go through `Choice.take` one by one, so an end token, a stop string,
        the grammar's end or max_tokens ends the choice where it would have ended."""
        engine = self.model.engine
        constrained = [c for c in batch if c.constraint is not None]
        masks = (self._masks.submit(lambda: [c.prepare_mask() for c in constrained])
                 if constrained else None)
        fed = [engine.length(c.seq_id) for c in batch]
        start = time.perf_counter()
        logits = engine.verify([(c.seq_id, [c.next_token] + d) for c, d in zip(batch, drafts)])
        self.cost.record(len(logits), time.perf_counter() - start)
        if masks is not None:
            masks.result()
        row = 0
        name = self.model.name
        for c, draft, length in zip(batch, drafts, fed):
            rows = logits[row : row + 1 + len(draft)]
            row += 1 + len(draft)
            pending = outboxes[c.session.id].pending
            kept = 0
            for i, x in enumerate(rows):
                if i:
                    c.prepare_mask()
                mask = c.mask if c.masked else None
                if i < len(draft):
                    token = c.sampler.verify(x, draft[i], mask)
                else:
                    token = c.sampler.sample(x, mask)
                pending += c.take(x, token)
                hit = i < len(draft) and c.tokens[-1] == draft[i]
                kept += hit
                if c.done or not hit:
                    break
            engine.rewind(c.seq_id, length + 1 + kept)
            if draft:
                c.drafted += len(draft)
                c.accepted += kept
                c.note_drafts(c.drafter.matched, kept, min(len(draft), kept + 1))
                self.metrics.inc("flm_spec_draft_tokens_total", name, value=len(draft))
                self.metrics.inc("flm_spec_accepted_tokens_total", name, value=kept)

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

    def _start(self, session: Session, outboxes: dict[int, Outbox]) -> None:
        """Before a prompt's first chunk, or its next after it gave its blocks back
        (`_give_back`): take what the KV cache holds of it (the Accepted that waits for the
        first output tells it: Anthropic's message_start shows it; what the cache held the
        first time is what usage reports)."""
        engine, ids = self.model.engine, session.prompt_ids
        seq_id = session.choices[0].seq_id
        if session.cached is not None and engine.length(seq_id):
            return
        if session.scores_prompt:  # as far as a scored prompt of the same start goes
            known, scores = self.scores.longest(ids, session.request.top_logprobs)
            taken = engine.reuse_prefix(seq_id, ids[:known]) if known > 1 else 0
            # entries 0..taken are the memo's; the rows computed give the rest
            session.prompt_scores = list(scores[:taken + 1]) if taken else []
        else:
            taken = engine.reuse_prefix(seq_id, ids)
        session.prefilled = taken
        if session.cached is None:
            session.cached = taken
            outbox = outboxes.get(session.id)
            if outbox is not None and outbox.pending and isinstance(outbox.pending[0],
                                                                    Accepted):
                outbox.pending[0].cached_tokens = taken

    def _give_back(self, waiting: list[Session]) -> bool:
        """The newest waiting prompt that holds KV blocks (part of it prefilled) gives them
        back to the cache (its full blocks stay there, named, for when it heads the queue
        again: `_start`); returns whether one did. A prompt that has written nothing yet
        makes room before a running request is paused, or stopped as too big."""
        engine = self.model.engine
        holding = [s for s in waiting if engine.length(s.choices[0].seq_id)]
        if not holding:
            return False
        session = max(holding, key=lambda s: s.id)
        for c in session.choices:
            engine.release(c.seq_id)
        session.prefilled = 0
        return True

    def _make_room(self, running: list[Session], paused: list[Session],
                   waiting: list[Session], outboxes: dict[int, Outbox]) -> list[Outbox]:
        """KV blocks for the step: while the running choices need more than the cache can
        give, a waiting prompt gives back the blocks of its part prefilled (`_give_back`),
        else the newest session is paused (its blocks go back to the cache), or, when it is
        the only one left, stops with an error; returns the outboxes of those stopped."""
        engine = self.model.engine
        ended: list[Outbox] = []
        while running and engine.blocks_needed(
                [(c.seq_id, 1) for s in running for c in s.choices if not c.done]) \
                > engine.blocks_available():
            if self._give_back(waiting):
                continue
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

    def resume_step(self, paused: list[Session], running: list[Session],
                     outboxes: dict[int, Outbox], waiting: list[Session]) -> list[Outbox]:
        """The oldest paused session goes on once its tokens fit beside a step of every
        running sequence: each live choice takes back what the cache holds of its prompt and
        output so far and recomputes the rest, then it runs again (its next token was
        sampled before it was paused). With nothing running, waiting prompts give back the
        blocks of their parts prefilled (`_give_back`); alone and still too big, it stops
        with an error."""
        session = paused[0]
        engine = self.model.engine
        live = [c for c in session.choices if not c.done]
        fed = {c.index: session.prompt_ids + c.tokens[:-1] for c in live}
        # (the blocks the cache still holds count as available until taken back)
        need = engine.blocks_needed([(c.seq_id, len(fed[c.index]) + 1) for c in live])
        while need + self.running_seqs(running) > engine.blocks_available():
            if running:
                return []
            if self._give_back(waiting):
                continue
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
