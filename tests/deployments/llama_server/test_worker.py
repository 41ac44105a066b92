"""/completion's prompt forms over a real Worker (flm-tiny, no Ray; the tokenize tests'
in-process handle): a mixed prompt is the prompt of its parts' ids joined, several prompts
come back as an array whose objects are each prompt's own completion, an id outside the
vocabulary in a mixed prompt is a 400 naming it."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.testclient import TestClient

from actors.worker import Worker
from deployments.ingress import Ingress, current
from deployments.server import make_app
from npu import load_model
from npu.load.tiny import ensure_tiny
from tests.deployments.tokenize.test_worker import LocalHandle

pytestmark = pytest.mark.timeout(120)
GREEDY = {"temperature": 0, "n_predict": 4, "ignore_eos": True}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    folder: Path = ensure_tiny(tmp_path_factory.mktemp("cache"))
    worker = Worker(lambda: load_model(folder, name="flm-tiny"), max_batch=2)
    ingress = Ingress({"flm-tiny": LocalHandle(worker)}, {})
    app = make_app()
    app.dependency_overrides[current] = lambda: ingress
    with TestClient(app) as c:
        yield c
    worker.close()


def _ids(client, text: str) -> list[int]:
    return client.post("/tokenize", json={"content": text}).json()["tokens"]


def test_a_mixed_prompt_is_its_parts_ids_joined(client) -> None:
    hello, world = _ids(client, "Hello"), _ids(client, " world")
    mixed = client.post("/completion", json={"prompt": [*hello, " world"], **GREEDY}).json()
    by_ids = client.post("/completion", json={"prompt": [*hello, *world], **GREEDY}).json()
    assert mixed["tokens_evaluated"] == len(hello) + len(world)
    assert mixed["content"] == by_ids["content"] and mixed["prompt"] == "Hello world"
    bad = client.post("/completion", json={"prompt": ["x", 10**9], **GREEDY})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt"


def test_several_prompts_are_each_their_own_completion(client) -> None:
    ids = _ids(client, "Once upon")
    singles = [client.post("/completion", json={"prompt": p, **GREEDY}).json()
               for p in ("The sky is", ids)]
    batch = client.post("/completion", json={"prompt": ["The sky is", ids], **GREEDY})
    assert batch.status_code == 200, batch.text
    assert [b["index"] for b in batch.json()] == [0, 1]
    assert [b["content"] for b in batch.json()] == [s["content"] for s in singles]
    assert [b["tokens_evaluated"] for b in batch.json()] == \
        [s["tokens_evaluated"] for s in singles]
