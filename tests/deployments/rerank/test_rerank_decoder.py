"""The rerank route in front of a real decoder reranker's worker in this process (no Ray):
the documents come back ranked by their P("yes"), the best first, cut to `top_n`; the
body's `instruction` reaches the prompt; a refused instruction keeps its field."""

from __future__ import annotations

import numpy as np
import pytest

from actors.events import Rejected
from actors.rerank import Rerank, build_rerank
from actors.worker import Worker
from npu import load_model
from tests.deployments.test_ingress import FakeStream, FakeWorker, _client, _Method
from tests.deployments.tokenize.test_worker import _Gen
from tests.qwen3_reranker import build_qwen3_reranker

pytestmark = pytest.mark.timeout(60)

QUERY = "where did the cat sit?"
DOCS = ["The cat sat on the mat.", "Stocks fell sharply today.", "a cat", "dogs bark",
        "the mat"]


class WorkerHandle(FakeWorker):
    """A worker deployment's handle over a real Worker in this process."""

    def __init__(self, worker: Worker) -> None:
        super().__init__()
        self.worker = worker
        self.generate = _Method(self._serve)

    def _serve(self, request) -> _Gen:
        self.requests.append(request)
        return _Gen(self.worker.generate(request))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = build_qwen3_reranker(tmp_path_factory.mktemp("qrr") / "hf")
    worker = Worker(lambda: load_model(folder, name="m", rerank=True), max_batch=2)
    yield WorkerHandle(worker)
    worker.close()


def _want(worker: Worker, instruction: str | None = None) -> np.ndarray:
    job = build_rerank(Rerank(request_id="r", query=QUERY, documents=DOCS,
                              instruction=instruction), worker.model)
    return worker.model.engine.embed(job.ids)[:, 0]


@pytest.mark.parametrize("instruction", [None, "Given a question, find what answers it"])
def test_documents_come_back_ranked_by_the_models_scores(served, instruction) -> None:
    client, _ = _client(served)
    body = {"query": QUERY, "documents": DOCS, "top_n": 3}
    if instruction is not None:
        body["instruction"] = instruction
    r = client.post("/v1/rerank", json=body)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    want = _want(served.worker, instruction)
    best = [int(i) for i in np.argsort(-want, kind="stable")[:3]]
    assert [x["index"] for x in results] == best
    np.testing.assert_allclose([x["relevance_score"] for x in results], want[best],
                               rtol=0, atol=1e-6)
    assert [x["document"]["text"] for x in results] == [DOCS[i] for i in best]
    assert served.requests[-1].instruction == instruction
    job = build_rerank(served.requests[-1], served.worker.model)
    assert r.json()["usage"]["prompt_tokens"] == sum(len(ids) for ids in job.ids)


def test_a_refused_instruction_is_a_400_naming_it() -> None:
    refusal = FakeStream([[Rejected(status=400, param="instruction", message="The model 'm' "
                                    "is a cross-encoder: it takes no instruction.")]])
    worker = FakeWorker(refusal)
    client, _ = _client(worker)
    r = client.post("/v2/rerank", json={"query": "q", "documents": ["d"], "instruction": "x"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "instruction"
    assert worker.requests[0] == Rerank(request_id=worker.requests[0].request_id, query="q",
                                        documents=["d"], instruction="x",
                                        document_tokens=4096)  # Cohere v2's default
