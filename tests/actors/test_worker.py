"""Worker (no Ray): event order, rejections, stops, n choices, cancellation."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from actors.events import (
    Accepted,
    ChatGenerate,
    CompletionGenerate,
    Deltas,
    Finished,
    GenerateRequest,
    Prompt,
    Rejected,
    Usage,
)
from actors.worker import Worker
from chat import constraint_request_from_openai
from npu import LoadOptions, load_model, logprobs
from npu.load.tiny import ensure_tiny

pytestmark = pytest.mark.timeout(120)
MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def worker(tmp_path_factory) -> Worker:
    folder: Path = ensure_tiny(tmp_path_factory.mktemp("cache"))
    w = Worker(lambda: load_model(folder, name="flm-tiny"), max_batch=4)
    yield w
    w.close()


def _chat(body: dict | None = None, **kw) -> ChatGenerate:
    """A chat request as the ingress types it from OpenAI's options in `body`."""
    body = body or {}
    return ChatGenerate(request_id="t", **{"messages": MSG, **kw},
                        constraint=constraint_request_from_openai(body),
                        tools=body.get("tools"))


async def _events(worker: Worker, **kw) -> list:
    req = _chat(**kw)
    return [ev async for batch in worker.generate(req) for ev in batch]


async def _complete(worker: Worker, **kw) -> list:
    req = CompletionGenerate(request_id="t", **kw)
    return [ev async for batch in worker.generate(req) for ev in batch]


def test_the_grammar_engine_is_built_ahead_of_the_first_request(tmp_path) -> None:
    """A chat model's worker builds its grammar engine (xgrammar's ~2 s import) on a thread
    of its own as it starts: the first request with tools or a schema does not wait on it."""
    import threading

    folder = ensure_tiny(tmp_path)
    w = Worker(lambda: load_model(folder, name="flm-tiny"), max_batch=2)
    try:
        warm = [t for t in threading.enumerate() if t.name == "flm-grammar-warm"]
        for t in warm:
            t.join(60)
        assert w._grammar is not None  # nothing asked for it
        assert w.grammar_engine() is w._grammar
    finally:
        w.close()


def test_events_come_in_order(worker) -> None:
    events = asyncio.run(_events(worker, max_tokens=5, seed=1))
    assert isinstance(events[0], Accepted) and isinstance(events[-1], Usage)
    assert isinstance(events[-2], Finished) and events[-2].finish_reason == "length"
    assert all(isinstance(e, Deltas) for e in events[1:-2])
    assert events[-1].completion_tokens == 5


@pytest.mark.parametrize("kw,param", [
    ({"messages": [{"role": "user", "content": "x " * 5000}]}, "messages"),
    ({"context_limit": 4}, "context_limit"),
])
def test_bad_requests_are_rejected_first(worker, kw: dict, param: str) -> None:
    req = _chat(**kw)

    async def run():
        return [ev async for batch in worker.generate(req) for ev in batch]

    events = asyncio.run(run())
    assert len(events) == 1 and isinstance(events[0], Rejected)
    assert events[0].status == 400 and events[0].param == param


def test_same_seed_same_output_and_n_choices(worker) -> None:
    a = asyncio.run(_events(worker, max_tokens=8, seed=5, n=2))
    b = asyncio.run(_events(worker, max_tokens=8, seed=5, n=2))
    texts = lambda evs, i: "".join(d.text for e in evs if isinstance(e, Deltas)  # noqa: E731
                                   and e.index == i for d in e.deltas)
    assert texts(a, 0) == texts(b, 0) and texts(a, 1) == texts(b, 1)
    assert {e.index for e in a if isinstance(e, Finished)} == {0, 1}


def test_stop_string_ends_the_choice(worker) -> None:
    events = asyncio.run(_complete(worker, prompt="Numbers:", max_tokens=50,
                                   seed=1, stop=[" "]))
    text = "".join(e.text for e in events if isinstance(e, Deltas))
    fin = [e for e in events if isinstance(e, Finished)][0]
    assert " " not in text
    assert fin.finish_reason in ("stop", "length")


def test_stop_strings_wait_for_min_tokens(worker) -> None:
    """vLLM's min_tokens holds stop strings back as well as end tokens: the output runs to
    that many tokens, the stop strings it wrote on the way kept, then ends at the next."""
    def run(**kw) -> tuple[str, Finished]:
        events = asyncio.run(_complete(worker, prompt="Numbers:", max_tokens=40, seed=1,
                                       stop=[" "], **kw))
        text = "".join(e.text for e in events if isinstance(e, Deltas))
        return text, [e for e in events if isinstance(e, Finished)][0]
    free, _ = run(ignore_eos=True)
    early = len(free)  # the first space, at most a few tokens in
    held, fin = run(ignore_eos=True, min_tokens=12)
    assert fin.completion_tokens >= 12 and len(held) > early and " " in held
    assert fin.finish_reason == "length" or fin.stop == " "


def test_cancelled_request_frees_its_sequence(worker) -> None:
    async def run():
        req = ChatGenerate(request_id="c", messages=MSG, max_tokens=3000, seed=2,
                              ignore_eos=True)
        gen = worker.generate(req)
        async for batch in gen:
            if any(isinstance(ev, Deltas) for ev in batch):
                break
        await gen.aclose()
        for _ in range(200):
            if worker.active == 0:
                return True
            await asyncio.sleep(0.02)
        return False

    assert asyncio.run(run())
    assert not worker.model.engine._seqs  # every KV cache released
    assert worker.model.engine.kv.held() == 0  # its blocks: cached or free, never held


def test_a_repeated_prompt_is_served_from_the_prefix_cache(worker) -> None:
    """The second request with the same conversation computes only the prompt's last block:
    usage says how many prompt tokens came from the cache, out of the whole prompt."""
    msgs = [{"role": "system", "content": "You answer in one word. " * 6},
            {"role": "user", "content": "Name a colour, please."}]
    first = asyncio.run(_events(worker, messages=msgs, max_tokens=6, seed=3, n=2))
    again = asyncio.run(_events(worker, messages=msgs, max_tokens=6, seed=3, n=2))
    u1, u2 = first[-1], again[-1]
    assert u1.prompt_tokens == u2.prompt_tokens > 32
    assert u1.cached_tokens < u2.cached_tokens  # (other tests' prompts may share a block)
    assert u2.cached_tokens == (u2.prompt_tokens - 1) // 16 * 16
    text = lambda evs: ["".join(d.text for e in evs if isinstance(e, Deltas)  # noqa: E731
                                and e.index == i for d in e.deltas) for i in (0, 1)]
    assert text(first) == text(again)
    assert worker.model.engine.kv.held() == 0


def test_a_request_cancelled_mid_prefill_leaves_its_blocks_cached(tmp_path, monkeypatch) -> None:
    """Prefilled 16 tokens a step, a long prompt is cancelled while it is still being
    prefilled: nothing stays held, and the blocks it had filled serve the next request."""
    from actors import scheduler as scheduler_mod

    monkeypatch.setattr(scheduler_mod, "PREFILL_CHUNK", 16)
    folder = ensure_tiny(tmp_path / "cache")
    w = Worker(lambda: load_model(folder))
    engine = w.model.engine
    prompt = " ".join(f"w{i}" for i in range(800))  # about 2,200 tokens: 137 steps

    async def cancel_mid_prefill() -> int:
        req = CompletionGenerate(request_id="m", prompt=prompt, max_tokens=2)
        task = asyncio.create_task(_drain(w.generate(req)))
        while engine.kv_usage()["kv_blocks"] < 4:  # some chunks in
            assert not task.done()
            await asyncio.sleep(0.001)
        task.cancel()
        while w.active:
            await asyncio.sleep(0.001)
        return engine.kv_usage()["cached_blocks"]

    async def _drain(gen) -> None:
        async for _ in gen:
            pass

    cached = asyncio.run(cancel_mid_prefill())
    total = len(w.model.prompt_ids(prompt))
    assert engine.kv.held() == 0 and 4 <= cached < total // 16
    again = asyncio.run(_complete(w, prompt=prompt, max_tokens=2))
    assert again[-1].cached_tokens == cached * 16
    w.close()


def test_prompts_arriving_together_share_their_common_start(worker) -> None:
    """Two prompts with the same long start sent at once: the second waits for the first's
    blocks instead of computing the same start again."""
    start = " ".join(f"s{i}" for i in range(300))

    async def both():
        reqs = [CompletionGenerate(request_id=f"p{i}", prompt=f"{start} {i}",
                                   max_tokens=2) for i in range(2)]

        async def one(req):
            return [ev async for batch in worker.generate(req) for ev in batch]

        return await asyncio.gather(*(one(r) for r in reqs))

    shared = len(worker.model.prompt_ids(start)) // 16 * 16
    worker.model.engine.kv.clear()
    a, b = asyncio.run(both())
    assert sorted([a[-1].cached_tokens, b[-1].cached_tokens])[1] >= shared - 16


def test_a_prompt_larger_than_the_kv_budget_is_a_503(tmp_path) -> None:
    folder = ensure_tiny(tmp_path / "cache")
    w = Worker(lambda: load_model(folder, kv_cache_bytes=1))  # one block: 16 tokens
    events = asyncio.run(_events(w, messages=[{"role": "user", "content": "x " * 40}]))
    assert len(events) == 1 and isinstance(events[0], Rejected)
    assert events[0].status == 503 and "KV cache is full" in events[0].message
    ok = asyncio.run(_complete(w, prompt="Hi", max_tokens=3))
    assert isinstance(ok[-1], Usage)  # the worker goes on
    w.close()


def _texts(w: Worker, reqs: list[GenerateRequest]) -> list[list]:
    async def one(req):
        return [ev async for batch in w.generate(req) for ev in batch]

    async def run():
        return await asyncio.gather(*(one(r) for r in reqs))

    return asyncio.run(run())


def _text(events: list) -> str:
    return "".join(e.text or "" for e in events if isinstance(e, Deltas))


@pytest.mark.parametrize("prefix_cache", [False, True])
def test_when_decoding_runs_out_of_blocks_the_newest_request_waits(tmp_path,
                                                                   prefix_cache) -> None:
    """Six blocks for two requests that need three and six (n=2): the one admitted last is
    paused (its blocks freed) while the other runs to its end, then goes on where it
    stopped, and each output is the one it gets alone (its KV recomputed, or taken back from
    the cache). One that cannot fit even alone ends with an error."""
    folder = ensure_tiny(tmp_path / "cache")
    model = lambda **kw: load_model(folder, quantize="q8_0", **kw)  # noqa: E731
    probe = model().engine.kv.block_bytes
    reqs = [CompletionGenerate(request_id=f"r{i}", prompt=f"{i} hello",
                               max_tokens=38, seed=i, ignore_eos=True, n=1 + i)
            for i in range(2)]
    alone = Worker(lambda: model())
    expected = [_texts(alone, [r])[0] for r in reqs]
    alone.close()

    w = Worker(lambda: model(kv_cache_bytes=6 * probe, prefix_cache=prefix_cache))
    got = _texts(w, reqs)
    for events, want in zip(got, expected):
        assert isinstance(events[-1], Usage)
        for i in range(2):
            mine = [e for e in events if getattr(e, "index", 0) == i]
            assert _text(mine) == _text([e for e in want if getattr(e, "index", 0) == i])
    assert w.metrics.snapshot().get("flm_preemptions_total")
    assert w.model.engine.kv.held() == 0

    from actors.events import Failed

    too_long = CompletionGenerate(request_id="x", prompt="hello",
                                  max_tokens=100, ignore_eos=True)
    events = _texts(w, [too_long])[0]
    assert isinstance(events[-1], Failed) and "cannot go on" in events[-1].message
    assert isinstance(_texts(w, [reqs[0]])[0][-1], Usage)  # the worker goes on
    w.close()


def test_a_prompt_part_prefilled_gives_its_blocks_to_a_running_request(tmp_path) -> None:
    """Forty blocks: a request that needs thirty runs, and a 560-token prompt (35 blocks)
    behind it is prefilled chunk by chunk until the cache is full. When the running request
    needs a block, the prompt gives back the blocks of its part prefilled (kept cached for
    when it goes on) rather than the running request, which fits alone, ending with 'the
    KV cache is full'; both end as they do alone."""
    folder = ensure_tiny(tmp_path / "cache")
    model = lambda **kw: load_model(folder, quantize="q8_0", **kw)  # noqa: E731
    probe = model().engine.kv.block_bytes
    reqs = [CompletionGenerate(request_id="a", prompt_ids=list(range(5, 105)),
                               max_tokens=380, ignore_eos=True, temperature=0.0),
            CompletionGenerate(request_id="b", prompt_ids=list(range(200, 760)),
                               max_tokens=4, ignore_eos=True, temperature=0.0)]
    alone = Worker(lambda: model(kv_cache_bytes=40 * probe))
    expected = [_texts(alone, [r])[0] for r in reqs]
    alone.close()

    w = Worker(lambda: model(kv_cache_bytes=40 * probe))
    got = _texts(w, reqs)
    for events, want in zip(got, expected):
        assert isinstance(events[-1], Usage)
        assert _text(events) == _text(want)
    assert got[1][-1].cached_tokens == 0  # what the cache held when the prompt started
    assert w.model.engine.kv.held() == 0
    w.close()


@pytest.mark.parametrize("fault,state", [("errors", "ERT_CMD_STATE_ERROR"),
                                         ("hangs", "ERT_CMD_STATE_TIMEOUT"),
                                         ("aborts", "ERT_CMD_STATE_ABORT")])
def test_npu_fault_fails_the_stream_and_the_worker(tmp_path, fault: str, state: str) -> None:
    """A run that errors, never completes (its wait times out) or is aborted ends the
    request with an error event and marks the worker unhealthy (Serve replaces it)."""
    from actors.events import Failed
    from npu.load.tiny import tiny_config
    from npu.xrt import XRT
    from npu.xrt.sim_kernels import make_kernel_dir, simulator_for

    folder = ensure_tiny(tmp_path / "cache")
    kdir = make_kernel_dir(tmp_path / "kernel", [tiny_config()])
    sim = simulator_for(kdir, ["RyzenAI-npu4"])
    # a hung runlist is given up by the adapter's watchdog after run_timeout_ms (real time)
    w = Worker(lambda: load_model(folder, "npu", kernel_dir=kdir,
                                  xrt=XRT(sim, run_timeout_ms=200)))
    ok = asyncio.run(_events(w, max_tokens=3, seed=1))
    assert isinstance(ok[-1], Usage)
    setattr(sim.faults, fault, 1)
    events = asyncio.run(_events(w, max_tokens=3, seed=1))
    assert isinstance(events[0], Accepted) and isinstance(events[-1], Failed)
    assert state in events[-1].message
    assert not w.healthy
    after = asyncio.run(_events(w, max_tokens=3))
    assert isinstance(after[0], Rejected) and after[0].status == 503
    w.close()
    sim.release()  # the hung wait's thread returns


def test_stream_interval_sends_events_together(tmp_path) -> None:
    folder = ensure_tiny(tmp_path / "cache")
    w = Worker(lambda: load_model(folder), stream_interval_s=0.05)

    async def run():
        req = CompletionGenerate(request_id="i", prompt="The river",
                                 max_tokens=60, seed=1, ignore_eos=True)
        t0 = time.perf_counter()
        return [batch async for batch in w.generate(req)], time.perf_counter() - t0

    batches, seconds = asyncio.run(run())
    events = [e for b in batches for e in b]
    assert isinstance(batches[0][0], Accepted) and isinstance(events[-1], Usage)
    assert events[-1].completion_tokens == 60
    # the first output, then at most one message per interval, then the end: however fast
    # this machine decodes (a message a token would be 60; flm-tiny takes a few ms a token)
    assert len(batches) <= 2 + seconds / 0.05 + 1
    w.close()


def test_many_streams_share_a_message_budget(tmp_path) -> None:
    folder = ensure_tiny(tmp_path / "cache")
    w = Worker(lambda: load_model(folder), max_batch=8, max_messages_per_s=20)
    assert w.interval(8) == pytest.approx(0.4) and w.interval(1) == pytest.approx(0.05)

    async def one(i: int) -> list:
        req = CompletionGenerate(request_id=f"m{i}", prompt="The river",
                                 max_tokens=80, seed=i, ignore_eos=True)
        return [batch async for batch in w.generate(req)]

    async def run():
        t0 = time.perf_counter()
        out = await asyncio.gather(*[one(i) for i in range(8)])
        return out, time.perf_counter() - t0

    streams, seconds = asyncio.run(run())
    for batches in streams:
        events = [e for b in batches for e in b]
        assert isinstance(events[-1], Usage) and events[-1].completion_tokens == 80
        # the first output, then at most one message per interval, then the end
        assert len(batches) <= 2 + seconds / w.interval(8) + 1
    w.close()


def test_concurrent_requests_get_what_they_get_alone(worker) -> None:
    """Prompts prefilled together and decoded in one batch (sampled together) give each
    request the same tokens as running it alone with the same seed."""
    prompts = ["The river", "Once upon a time there was a small boat", "A", "Numbers: 1 2 3"]

    async def one(i: int) -> str:
        req = CompletionGenerate(request_id=f"c{i}", prompt=prompts[i % 4],
                                 max_tokens=24, seed=i, ignore_eos=True, temperature=0.8)
        return "".join(e.text for b in [b async for b in worker.generate(req)] for e in b
                       if isinstance(e, Deltas))

    async def together():
        return await asyncio.gather(*[one(i) for i in range(6)])

    async def alone():
        return [await one(i) for i in range(6)]

    assert asyncio.run(together()) == asyncio.run(alone())


def test_a_long_prompt_does_not_hold_up_short_ones(worker) -> None:
    """A short request arriving behind a long prompt is prefilled in the long one's steps
    and finishes before the long one has its first token."""
    from actors.scheduler import PREFILL_CHUNK

    long_prompt = "The river runs down to the sea. " * 40
    n = len(worker.model.tokenizer.encode(long_prompt))
    while n < 5 * PREFILL_CHUNK:
        long_prompt += long_prompt
        n = len(worker.model.tokenizer.encode(long_prompt))
    assert n + 8 < worker.model.context_length
    order: list[str] = []

    async def one(name: str, prompt: str, tokens: int) -> None:
        req = CompletionGenerate(request_id=name, prompt=prompt,
                                 max_tokens=tokens, seed=1, ignore_eos=True)
        async for batch in worker.generate(req):
            for ev in batch:
                if isinstance(ev, (Deltas, Finished)):
                    order.append(f"{name} {type(ev).__name__}")

    async def both():
        long = asyncio.create_task(one("long", long_prompt, 2))
        await asyncio.sleep(0)  # the long request is built and queued first
        await one("short", "Once", 3)
        await long

    asyncio.run(both())
    assert order.index("short Finished") < order.index("long Deltas")


SAY_TOOL = {"type": "function", "function": {"name": "say", "parameters": {
    "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_call_cut_by_max_tokens_stays_a_call(worker, seed: int) -> None:
    """max_tokens ends the output inside a required call: the reply holds the call with
    its arguments as far as they got and finish_reason "length"; no markup in content, and
    the streamed deltas add up to the same reply."""
    events = asyncio.run(_events(worker, max_tokens=40, seed=seed, body={
        "tools": [SAY_TOOL], "tool_choice": "required"}))
    fin = [e for e in events if isinstance(e, Finished)][0]
    assert fin.finish_reason == "length"
    msg = fin.message
    assert msg.content == "" and len(msg.tool_calls) == 1
    call = msg.tool_calls[0]
    assert call.name == "say" and '{"text": "'.startswith(call.arguments[:10])
    deltas = [d for e in events if isinstance(e, Deltas) for d in e.deltas]
    assert "".join(d.text for d in deltas if d.field == "content") == ""
    streamed = [d for d in deltas if d.field == "tool_call"]
    assert [d.name for d in streamed if d.name] == ["say"]
    assert "".join(d.text for d in streamed) == call.arguments


@pytest.mark.parametrize("stop,named", [("arguments", True), ('"name"', False)])
def test_a_stop_string_inside_a_call_cuts_it_as_a_limit_does(worker, stop: str,
                                                             named: bool) -> None:
    """A stop string the call's own JSON holds ("}" or a key) ends the output there, as
    max_tokens would: a call named so far stays a call, and no markup is content."""
    events = asyncio.run(_events(worker, max_tokens=40, seed=1, stop=[stop], body={
        "tools": [SAY_TOOL], "tool_choice": "required"}))
    fin = [e for e in events if isinstance(e, Finished)][0]
    assert (fin.finish_reason, fin.stop, fin.cut) == ("stop", stop, True)
    assert fin.message.content == ""
    assert [c.name for c in fin.message.tool_calls] == (["say"] if named else [])
    deltas = [d for e in events if isinstance(e, Deltas) for d in e.deltas]
    assert "".join(d.text for d in deltas if d.field == "content") == ""


def test_a_request_context_limit_bounds_prompt_and_output(worker) -> None:
    """Ollama's num_ctx: a prompt that does not fit is a 400 naming it; one that fits
    generates until the limit."""
    events = asyncio.run(_events(worker, context_limit=4, max_tokens=50))
    assert isinstance(events[0], Rejected) and events[0].param == "context_limit"
    events = asyncio.run(_events(worker, context_limit=40, max_tokens=100, ignore_eos=True,
                                 seed=1))
    usage = events[-1]
    assert events[-2].finish_reason == "length"
    assert usage.prompt_tokens + usage.completion_tokens == 40


def test_the_worker_counts_grammar_compiles_and_its_gauges(worker) -> None:
    body = {"response_format": {"type": "json_object"}}
    for _ in range(2):
        asyncio.run(_events(worker, max_tokens=3, seed=2, body=body))
    snap = {name: {tuple(k): v for k, v in series}
            for name, series in worker.metrics_snapshot("r0").items()}
    compiles = snap["flm_grammar_compiles_total"]
    assert compiles[("flm-tiny", "cold")] >= 1 and compiles[("flm-tiny", "cached")] >= 1
    assert snap["flm_grammar_compile_seconds"][("flm-tiny",)][2] == compiles[("flm-tiny",
                                                                              "cold")]
    assert snap["flm_running_sequences"][("flm-tiny", "r0")] == 0
    assert ("flm-tiny", "r0") in snap["flm_kv_cache_bytes"]


def test_count_tokens_is_the_prompt_generate_would_run(worker) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    req = _chat({"tools": tools}, max_tokens=1)

    async def both() -> tuple:
        counted = await worker.count_tokens(req)
        events = [ev async for batch in worker.generate(req) for ev in batch]
        plain = await worker.count_tokens(_chat(max_tokens=1))
        return counted, events[0], plain

    counted, accepted, plain = asyncio.run(both())
    assert isinstance(counted, Accepted) and counted.prompt_tokens == accepted.prompt_tokens
    assert counted.prompt_tokens > plain.prompt_tokens  # the tools are in the prompt


def test_accepted_tells_what_the_prefix_cache_served(worker) -> None:
    """The Accepted goes out with the first output, once the prompt took its cached prefix:
    it says what Usage says at the end (Anthropic's message_start shows it)."""
    long = [{"role": "user", "content": "tell me about the sea " * 12}]

    async def run() -> list:
        return [ev async for b in worker.generate(_chat(messages=long, max_tokens=2, seed=1))
                for ev in b]

    first, again = asyncio.run(run()), asyncio.run(run())
    assert isinstance(again[0], Accepted) and isinstance(again[-1], Usage)
    assert again[0].cached_tokens == again[-1].cached_tokens > 0
    assert first[0].cached_tokens == first[-1].cached_tokens


def test_count_tokens_refuses_a_schema_generate_refuses(worker) -> None:
    """A tool schema the grammar cannot take: counting says so as generating does (a client
    that counts first learns it there)."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "zz"}}}}}]
    req = _chat({"tools": tools, "tool_choice": "required"}, max_tokens=1)

    async def both() -> tuple:
        counted = await worker.count_tokens(req)
        events = [ev async for batch in worker.generate(req) for ev in batch]
        return counted, events[0]

    counted, refused = asyncio.run(both())
    assert isinstance(refused, Rejected) and refused.status == 400
    assert isinstance(counted, Rejected) and counted.status == 400
    assert counted.message == refused.message


def test_a_reasoning_budget_closes_the_reasoning_and_the_answer_follows(tmp_path) -> None:
    """flm-tiny with a template whose generation prompt opens `<think>` (as Qwen3's with
    thinking on): its noise is all reasoning until the budget writes `</think>`."""
    base = load_model("flm-tiny", name="flm-tiny")
    template = tmp_path / "think.jinja"
    template.write_text(base.chat_template_source.replace(
        "{{- '<|im_start|>assistant\\n' -}}", "{{- '<|im_start|>assistant\\n<think>\\n' -}}"))
    w = Worker(lambda: load_model("flm-tiny", "cpu", LoadOptions(chat_template=str(template)),
                                  name="flm-tiny"), max_batch=2)
    try:
        def run(budget: int | None) -> tuple[Finished, list]:
            req = ChatGenerate(request_id="b", messages=MSG, max_tokens=24, seed=5,
                               reasoning_budget=budget)
            events = asyncio.run(_collect(w, req))
            return next(e for e in events if isinstance(e, Finished)), events

        free, events = run(None)
        assert free.message.reasoning_content and not free.message.content  # all reasoning
        # usage counts the tokens that wrote reasoning (Responses' reasoning_tokens were
        # always 0: found probing live): here all but those still held at the end
        usage = events[-1]
        assert isinstance(usage, Usage)
        assert usage.completion_tokens - 3 <= usage.reasoning_tokens <= usage.completion_tokens
        capped, events = run(6)
        # six tokens of reasoning (the same six), then `</think>`: nothing after it is
        # reasoning (this noise model goes on writing `</think>`, which is markup)
        assert capped.message.reasoning_content.split() == \
            free.message.reasoning_content.split()[:6]
        assert len(free.message.reasoning_content.split()) > 6
        assert capped.completion_tokens == 24
    finally:
        w.close()


async def _collect(worker: Worker, req: GenerateRequest) -> list:
    return [ev async for batch in worker.generate(req) for ev in batch]



def _scored(events: list) -> tuple[Prompt, list[Finished], Usage]:
    prompts = [e for e in events if isinstance(e, Prompt)]
    assert len(prompts) == 1 and isinstance(events[1], Prompt)  # right after the Accepted
    return prompts[0], [e for e in events if isinstance(e, Finished)], events[-1]


def test_a_scored_prompt_gives_its_written_tokens_their_logprobs(worker) -> None:
    """lm-evaluation-harness scores a continuation by echoing context + continuation with
    `max_tokens` 0: each prompt token's logprob is the one the model gave it when it wrote
    it (the first token's: none), however much of the prompt the cache held before."""
    seed_ids = worker.model.prompt_ids("Once upon a time")
    written = asyncio.run(_complete(worker, prompt_ids=seed_ids, max_tokens=6, temperature=0,
                                    logprobs=True, top_logprobs=2, ignore_eos=True))
    got = [t for e in written if isinstance(e, Deltas) for t in e.logprobs]
    ids = seed_ids + [worker.model.token_table.index(bytes(t.bytes)) for t in got]
    for _ in range(2):  # the second time its blocks are in the prefix cache: still scored
        events = asyncio.run(_complete(worker, prompt_ids=ids, max_tokens=0, logprobs=True,
                                       top_logprobs=2, echo_prompt=True,
                                       prompt_logprobs=True))
        prompt, finished, usage = _scored(events)
        assert [f.finish_reason for f in finished] == ["length"]
        assert usage.completion_tokens == 0 and usage.cached_tokens == 0
        assert prompt.text == worker.model.tokenizer.decode(ids, skip_special_tokens=False)
        scores = prompt.logprobs
        assert len(scores) == len(ids) and scores[0].logprob is None and not scores[0].top
        for want, have in zip(got, scores[len(seed_ids):], strict=True):
            assert have.token == want.token
            assert have.logprob == pytest.approx(want.logprob, abs=2e-3)
            assert [s for s, _, _ in have.top] == [s for s, _, _ in want.top]
        assert all(t.logprob <= 0 and len(t.top) == 2 and t.top[0][1] >= t.logprob
                   for t in scores[1:])


def test_a_prompt_longer_than_a_prefill_chunk_is_scored_across_chunks(worker,
                                                                       tmp_path) -> None:
    """Every prompt token is scored once, in order, across the 256-token prefill pieces:
    the logprobs are those of feeding the prompt one token at a time (a model of its own
    here, the worker's being the worker thread's)."""
    ids = worker.model.prompt_ids(" ".join(f"word{i}" for i in range(300)))[:300]
    assert len(ids) == 300
    events = asyncio.run(_complete(worker, prompt_ids=ids, max_tokens=1, temperature=0,
                                   echo_prompt=True, prompt_logprobs=True))
    prompt, _, usage = _scored(events)
    assert usage.completion_tokens == 1
    engine = load_model(ensure_tiny(tmp_path), name="flm-tiny").engine
    logits = engine.prefill("ref", ids[:1])
    want = []
    for token in ids[1:]:  # the logits after token i score token i + 1
        want.append(logprobs(logits, token)[0])
        logits = engine.decode(["ref"], [token])[0]
    assert [t.token for t in prompt.logprobs] == [
        worker.model.token_table[i].decode("utf-8", "replace") for i in ids]
    assert [t.logprob for t in prompt.logprobs[1:]] == pytest.approx(want, abs=2e-3)


def test_choices_of_one_context_take_its_cached_blocks_and_its_scores(worker,
                                                                        tmp_path) -> None:
    """lm-evaluation-harness's multiple choice: one context, a prompt per continuation. The
    second prompt takes the KV cache's blocks of the context and the first one's scores of
    them (actors.score_memo), computes only the rest, and gives the logprobs of feeding it
    one token at a time."""
    ctx = worker.model.prompt_ids(" ".join(f"fact{i}" for i in range(40)))[:40]
    first = ctx + worker.model.tokenizer.encode(" the red one")
    second = ctx + worker.model.tokenizer.encode(" a blue bird")
    scored = []
    for ids in (first, second):
        events = asyncio.run(_complete(worker, prompt_ids=ids, max_tokens=0, logprobs=True,
                                       top_logprobs=1, echo_prompt=True,
                                       prompt_logprobs=True))
        prompt, _, usage = _scored(events)
        scored.append((prompt.logprobs, usage.cached_tokens))
    (a, cached_a), (b, cached_b) = scored
    assert cached_a == 0 and cached_b == 32  # the context's two whole blocks of 16
    assert b[:33] == a[:33]  # the memo's entries: tokens 0..32
    engine = load_model(ensure_tiny(tmp_path), name="flm-tiny").engine
    logits = engine.prefill("ref", second[:1])
    want = []
    for token in second[1:]:
        want.append(logprobs(logits, token)[0])
        logits = engine.decode(["ref"], [token])[0]
    assert len(b) == len(second) and b[0].logprob is None
    assert [t.logprob for t in b[1:]] == pytest.approx(want, abs=2e-3)
    # another top-logprobs count is not the memo's: computed whole
    events = asyncio.run(_complete(worker, prompt_ids=second, max_tokens=0, logprobs=True,
                                   top_logprobs=3, echo_prompt=True, prompt_logprobs=True))
    assert _scored(events)[2].cached_tokens == 0
