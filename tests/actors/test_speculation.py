"""The n-gram drafter and the speculative option (actors.speculation)."""

from __future__ import annotations

import msgspec
import pytest

from actors.speculation import NgramDrafter, Speculation


def test_drafter_copies_what_followed_the_latest_match() -> None:
    prompt = [1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 6]
    d = NgramDrafter(prompt, lookup_max=3, lookup_min=2)
    # output "2 3": its latest earlier occurrence is followed by 7 8 6 2 3
    assert d.propose([2, 3], 4) == [7, 8, 6, 2]
    assert d.propose([2, 3, 7, 8], 2) == [6, 2]  # the longest n-gram (3 8 ...) first
    assert d.propose([2, 3, 7, 8, 42], 3) == []  # nothing ends in 8 42 before
    assert d.propose([2, 3, 7, 8, 42], 0) == []


def test_drafter_prefers_the_longest_ngram() -> None:
    # "5 6" is followed by 1 at its latest, "4 5 6" by 2
    d = NgramDrafter([4, 5, 6, 2, 0, 5, 6, 1, 0, 4, 5], lookup_max=3, lookup_min=2)
    assert d.propose([6], 1) == [2]
    d = NgramDrafter([4, 5, 6, 2, 0, 5, 6, 1, 0, 4, 5], lookup_max=2, lookup_min=2)
    assert d.propose([6], 1) == [1]


def test_drafter_matches_in_its_own_output() -> None:
    d = NgramDrafter([0], lookup_max=2, lookup_min=1)
    assert d.propose([5, 6, 7, 5], 3) == [6, 7, 5]


def test_drafts_are_as_long_as_they_pay_for_their_rows() -> None:
    from actors.speculation import StepCost, draft_length

    cheap = lambda m: 1.0 + 0.04 * m  # noqa: E731  (8 rows at 1.3x one)
    assert draft_length(0.9, 7, cheap) == 7
    assert draft_length(0.05, 7, cheap) == 1  # hardly ever kept: one is still worth it
    assert draft_length(0.3, 7, lambda m: 1.0 + 0.5 * m) == 0  # rows as dear as a step
    cost = StepCost()
    assert cost.ratio(1, 3) == pytest.approx(1.15)  # not measured yet: assumed cheap
    cost.record(1, 0.010)
    cost.record(4, 0.020)
    cost.record(4, 0.030)
    assert cost.ratio(1, 3) == pytest.approx(2.2)  # moving average of the measured
    cost.record(8, 0.015)
    assert cost.ratio(1, 3) == pytest.approx(1.5)  # 4 rows cost no more than 8


@pytest.mark.parametrize("raw", [{"tokens": 0}, {"lookup_min": 3, "lookup_max": 2},
                                 {"method": "eagle"}])
def test_bad_options_are_refused(raw: dict) -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert(raw, Speculation)


# -- through the worker: the same output as without speculation ---------------------------------
import asyncio  # noqa: E402
import json  # noqa: E402

from actors.events import ChatGenerate, Deltas, Finished, Usage  # noqa: E402
from actors.worker import Worker  # noqa: E402
from chat import constraint_request_from_openai  # noqa: E402
from npu import ModelError, load_model  # noqa: E402

RECORD = {"id": 4127, "name": "Ada Lovelace", "city": "London", "roles": ["admin", "editor"],
          "address": {"street": "12 St James's Square", "postcode": "SW1Y 4JH"}}
ECHO = ("Here is a JSON record:\n\n" + json.dumps(RECORD, indent=2) + "\n\nRewrite the record "
        "exactly as it is, changing only \"city\" to \"Paris\". Answer with the JSON only.")
SCHEMA = {"type": "json_schema", "json_schema": {"name": "record", "schema": {
    "type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"},
                                     "city": {"type": "string"}},
    "required": ["id", "name", "city"]}}}


@pytest.fixture(scope="module")
def workers():
    """SmolLM2 (the default model) with and without speculation, one model shared."""
    try:
        model = load_model("smollm2-135m")
    except ModelError as exc:
        pytest.skip(str(exc))
    # one thread: two OpenMP threads on a busy 2-core host wait for each other (15x slower)
    model.engine.set_threads(1)
    # drafts sized by a fixed row cost, not by timings (which a busy host makes vary)
    pair = (Worker(lambda: model, speculation=Speculation(method="off")),
            Worker(lambda: model, speculation=Speculation(row_cost=0.05)))
    yield pair
    for w in pair:
        w.close()


def _run(worker: Worker, body: dict | None = None, content: str = ECHO,
         **kw) -> tuple[str, Finished, Usage]:
    body = body or {}
    req = ChatGenerate(request_id="t", messages=[{"role": "user", "content": content}],
                       constraint=constraint_request_from_openai(body), **kw)

    async def run():
        return [ev async for batch in worker.generate(req) for ev in batch]

    events = asyncio.run(asyncio.wait_for(run(), 120))
    text = "".join(d.text for e in events if isinstance(e, Deltas) for d in e.deltas)
    finished = next(e for e in events if isinstance(e, Finished))
    return text, finished, events[-1]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("body,kw", [
    ({}, dict(max_tokens=30)),  # greedy echo, cut by max_tokens inside a draft
    ({"response_format": SCHEMA}, dict(max_tokens=40)),  # a grammar checks every draft
    ({}, dict(max_tokens=40, stop=["editor"])),  # a stop string inside kept drafts
])
def test_greedy_output_is_the_same_and_drafts_are_kept(workers, body, kw) -> None:
    plain, spec = workers
    want = _run(plain, body, temperature=0.0, **kw)
    got = _run(spec, body, temperature=0.0, **kw)
    assert got[0] == want[0]
    assert got[1].finish_reason == want[1].finish_reason
    assert got[2].completion_tokens == want[2].completion_tokens
    assert got[2].accepted_prediction_tokens > 0
    assert want[2].accepted_prediction_tokens == want[2].rejected_prediction_tokens == 0
    assert spec.metrics.snapshot().get("flm_spec_accepted_tokens_total")
    assert not plain.metrics.snapshot().get("flm_spec_draft_tokens_total")
    if "response_format" in body:
        assert set(json.loads(got[0])) >= {"id", "name", "city"}
    if not body and "stop" not in kw:
        # again: the prompt's KV from the cache, where rejected drafts left nothing stale
        again = _run(spec, body, temperature=0.0, **kw)
        assert again[0] == want[0] and again[2].cached_tokens > 0


@pytest.mark.timeout(120)
def test_seeded_sampling_with_drafts_is_sampling_without_them(workers) -> None:
    """Each place's token is the sampler's own draw (drafts only decide how many places one
    forward settles): the same seed gives the same output with or without drafts."""
    plain, spec = workers
    kw = dict(temperature=0.7, top_p=0.9, seed=11, max_tokens=20)
    a, b = _run(plain, **kw), _run(spec, **kw)
    assert a[0] == b[0] and a[2].completion_tokens == b[2].completion_tokens == 20
    assert b[2].accepted_prediction_tokens > 0


@pytest.fixture(scope="module")
def tiny_workers(tmp_path_factory):
    """flm-tiny (random weights; its greedy output soon repeats itself, so drafts from its
    own output are kept) with and without speculation."""
    from npu.load.tiny import ensure_tiny

    folder = ensure_tiny(tmp_path_factory.mktemp("cache"))
    model = load_model(folder, name="flm-tiny")
    pair = (Worker(lambda: model, max_batch=4, speculation=Speculation(method="off")),
            Worker(lambda: model, max_batch=4, speculation=Speculation(tokens=5, row_cost=0.05)))
    yield pair
    for w in pair:
        w.close()


@pytest.mark.timeout(120)
def test_a_batch_with_drafts_decodes_as_without_them(tiny_workers) -> None:
    """Requests decoded together (continuous batching), some drafting and some not, with n = 2
    and seeds: every choice's greedy output is the one plain decoding gives."""
    prompts = ["a b c a b c a b c a b", "hello there", "one two one two one"]

    async def run(worker: Worker) -> list[tuple[list[str], int, int]]:
        async def one(text: str):
            req = ChatGenerate(request_id="t", messages=[{"role": "user", "content": text}],
                               temperature=0.0, max_tokens=24, n=2,
                               constraint=constraint_request_from_openai({}))
            events = [ev async for batch in worker.generate(req) for ev in batch]
            texts = ["".join(d.text for e in events if isinstance(e, Deltas)
                             and e.index == i for d in e.deltas) for i in range(2)]
            u = events[-1]
            return texts, u.completion_tokens, u.accepted_prediction_tokens

        return await asyncio.gather(*(one(p) for p in prompts))

    plain, spec = tiny_workers
    want = asyncio.run(asyncio.wait_for(run(plain), 60))
    got = asyncio.run(asyncio.wait_for(run(spec), 60))
    assert [g[:2] for g in got] == [w[:2] for w in want]
    assert sum(g[2] for g in got) > 0


@pytest.mark.timeout(120)
def test_greedy_free_text_with_rejected_drafts_is_the_same(workers) -> None:
    """Drafts mostly rejected, on a reply whose greedy path passes near-ties (on this
    model the France answer's list): verified rows must be the decoded rows' exact bits,
    so the drafts' attention is decode's, not the prompt path's blocked kernel."""
    plain, spec = workers
    kw = dict(temperature=0.0, max_tokens=24)
    content = "What is the capital of France?"
    want = _run(plain, content=content, **kw)
    got = _run(spec, content=content, **kw)
    assert got[0] == want[0]
    assert got[2].accepted_prediction_tokens + got[2].rejected_prediction_tokens > 0
