"""A completions request of several prompts (OpenAI's batch; lm-evaluation-harness sends
one per `--batch_size`), through the real app and Ingress over an in-process Worker
(flm-tiny, no Ray): every prompt's choices in one answer, each what the prompt alone gets."""

from __future__ import annotations

import time

import pytest
from starlette.testclient import TestClient

from actors.worker import Worker
from deployments.ingress import PARTS_OPEN, Ingress, current
from deployments.openai.request import MAX_PROMPTS
from deployments.server import make_app
from npu import load_model
from npu.load.tiny import ensure_tiny
from tests.deployments.test_ingress import _Method
from tests.deployments.tokenize.test_worker import LocalHandle, _Gen

pytestmark = pytest.mark.timeout(120)
PROMPTS = ["Once upon a time", "The sea is", "Tell me"]


@pytest.fixture(scope="module")
def worker(tmp_path_factory) -> Worker:
    w = Worker(lambda: load_model(ensure_tiny(tmp_path_factory.mktemp("cache")),
                                  name="flm-tiny"), max_batch=4)
    yield w
    w.close()


@pytest.fixture()
def client(worker):
    app = make_app()
    app.dependency_overrides[current] = lambda: Ingress({"flm-tiny": LocalHandle(worker)}, {})
    with TestClient(app) as c:
        yield c


def _complete(client, prompt, **extra) -> dict:
    r = client.post("/v1/completions", json={"model": "flm-tiny", "prompt": prompt,
                                             "temperature": 0, "max_tokens": 4, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def test_each_prompts_choices_are_what_it_gets_alone_in_openais_order(client) -> None:
    batch = _complete(client, PROMPTS, n=2, seed=7, temperature=0.8)
    alone = [_complete(client, p, n=2, seed=7, temperature=0.8) for p in PROMPTS]
    assert [c["index"] for c in batch["choices"]] == list(range(6))
    assert [c["text"] for c in batch["choices"]] == [
        c["text"] for a in alone for c in a["choices"]]
    assert batch["usage"]["prompt_tokens"] == sum(a["usage"]["prompt_tokens"] for a in alone)
    assert batch["usage"]["completion_tokens"] == 24
    assert batch["id"].startswith("cmpl-") and batch["object"] == "text_completion"


def test_a_batch_of_token_ids_is_scored_as_lm_eval_scores_it(client, worker) -> None:
    ids = [worker.model.prompt_ids(p) for p in PROMPTS]
    batch = _complete(client, ids, echo=True, logprobs=1, max_tokens=0)
    for choice, prompt in zip(batch["choices"], ids, strict=True):
        alone = _complete(client, prompt, echo=True, logprobs=1, max_tokens=0)["choices"][0]
        assert choice["logprobs"] == alone["logprobs"] and choice["text"] == alone["text"]
        assert len(choice["logprobs"]["token_logprobs"]) == len(prompt)


def test_a_refused_prompt_refuses_the_batch_naming_it(client, worker) -> None:
    """The batch is refused as the prompt is, and the other prompts stop writing (one of
    them would write 4,000 tokens, seconds on this model)."""
    long = [1] * (worker.model.context_length + 1)
    r = client.post("/v1/completions", json={"model": "flm-tiny", "max_tokens": 4000,
                                             "ignore_eos": True,
                                             "prompt": [[5, 6], long, [7]]})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "prompt[1]"
    assert "prompt[1]" in r.json()["error"]["message"]
    deadline = time.monotonic() + 1.5
    while worker.model.engine._seqs and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not worker.model.engine._seqs  # the other prompts' sequences are gone


@pytest.mark.parametrize("body,param", [
    ({"prompt": PROMPTS, "stream": True}, "stream"),
    ({"prompt": ["x"] * (MAX_PROMPTS + 1)}, "prompt"),
    ({"prompt": ["x", [1, 2]]}, "prompt"),
    ({"prompt": [[1, 2], [-1]]}, "prompt[1]"),
])
def test_a_batch_that_cannot_be_answered_is_a_400(client, body: dict, param: str) -> None:
    r = client.post("/v1/completions", json={"model": "flm-tiny", **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


class CountingHandle(LocalHandle):
    """A worker handle that counts the requests open on it at once."""

    def __init__(self, worker: Worker) -> None:
        self.open = self.most = 0
        self.generate = _Method(lambda greq, *args: _Gen(self._counted(worker.generate(greq))))

    async def _counted(self, events):
        self.open += 1
        self.most = max(self.most, self.open)
        try:
            async for batch in events:
                yield batch
        finally:
            self.open -= 1


def test_a_large_batch_opens_a_few_requests_at_a_time(worker) -> None:
    """A worker runs a few sequences at once; a batch's other prompts wait at the ingress,
    not in Serve's handle queue, whose limit would refuse them (a 503 for the batch)."""
    handle = CountingHandle(worker)
    app = make_app()
    app.dependency_overrides[current] = lambda: Ingress({"flm-tiny": handle}, {})
    with TestClient(app) as client:
        body = _complete(client, [[5 + i] for i in range(MAX_PROMPTS)], max_tokens=2)
    assert len(body["choices"]) == MAX_PROMPTS
    assert 1 < handle.most <= PARTS_OPEN
