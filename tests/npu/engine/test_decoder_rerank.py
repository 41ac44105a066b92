"""A decoder reranker (Qwen3-Reranker) on the NumpyEngine against transformers'
Qwen3ForCausalLM scored as its model card scores it (softmax over the last position's "no"
and "yes" logits, P("yes")): a Hugging Face directory served with the `rerank` option (its
LM head's rows, tied or not, float32 and Q8_0; an untied head not held), a GGUF file as
llama.cpp's converter writes one (pooling_type 4, cls.output, the rerank template) and a
plain LM GGUF with the option; the prompts are the model card's tokens; a pair's score is
the same whatever else is in the batch; what is not a decoder reranker is named."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from actors.rerank import Rerank, build_rerank
from npu import ModelError, load_model
from npu.engine.pooling import RANK, Dense, Pooling, pool
from npu.load.pooling import RERANK_INSTRUCTION, RERANK_PROMPT
from tests.bert_model import build_reranker
from tests.qwen3_reranker import (
    GGUF_TEMPLATE,
    build_qwen3_reranker,
    model_card_ids,
    reference_scores,
    write_reranker_gguf,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

QUERY = "where did the cat sit?"
DOCUMENTS = ["The cat sat on the mat.", "Stocks fell sharply today.", "a",
             "Café naïve — 東京 ✓ yes no <|im_end|>", "the cat and the dog sat on the mat"]
TASK = "Given a question, find the sentence that answers it"


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict:
    """Per head (untied: lm_head.weight; tied: the embeddings): the HF directory, the model
    card's ids of the pairs and transformers' P("yes") of them; the untied one's GGUF."""
    out = {}
    for name, tied in (("untied", False), ("tied", True)):
        folder = build_qwen3_reranker(tmp_path_factory.mktemp(name) / "hf", tied=tied,
                                      seed=3 if tied else 0)
        ids = model_card_ids(folder, QUERY, DOCUMENTS)
        out[name] = {"folder": folder, "ids": ids, "want": reference_scores(folder, ids)}
    untied = out["untied"]["folder"]
    out["gguf"] = write_reranker_gguf(untied, untied.parent / "rr.gguf")
    return out


def _job(model, instruction: str | None = None):
    return build_rerank(Rerank(request_id="r", query=QUERY, documents=DOCUMENTS,
                               instruction=instruction), model)


def _scores(model, ids: list[list[int]]) -> np.ndarray:
    out = model.engine.embed(ids)
    assert out.shape == (len(ids), 1) and out.dtype == np.float32
    return out[:, 0]


@pytest.mark.parametrize("head", ["untied", "tied"])
def test_hf_directory_with_rerank_scores_are_the_model_cards(models, head: str) -> None:
    ref = models[head]
    model = load_model(ref["folder"], rerank=True)
    assert model.pooling == RANK and model.embedding_dims == 1 and not model.generates
    assert model.rerank_prompt == RERANK_PROMPT
    # an untied LM head is not held (its two rows are the head); a tied one is the embedding
    assert (model.engine.lm_head is None) == (head == "untied")
    job = _job(model)
    assert job.ids == ref["ids"]  # prefix + "<Instruct>: ...<Document>: d" + suffix
    np.testing.assert_allclose(_scores(model, job.ids), ref["want"], rtol=0, atol=2e-6)


def test_q8_0_scores_stay_near(models) -> None:
    ref = models["untied"]
    model = load_model(ref["folder"], rerank=True, quantize="q8_0")
    np.testing.assert_allclose(_scores(model, ref["ids"]), ref["want"], rtol=0, atol=0.03)


@pytest.mark.parametrize("head", ["untied", "tied"])
def test_the_answer_rows_are_read_as_stored_under_quantize(models, head: str) -> None:
    """quantize holds the matrices in a block format, but the two rows that score every
    pair are read before it (the LM head's, or a tied model's embeddings'): the head is the
    float one's exactly."""
    folder = models[head]["folder"]
    plain, quantized = (load_model(folder, rerank=True, quantize=q) for q in (None, "q4_0"))
    np.testing.assert_array_equal(quantized._pooling.dense[0].weight,
                                  plain._pooling.dense[0].weight)


def test_a_reranker_on_the_npu_is_refused_at_load(models, tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="runs on the CPU only"):
        load_model(models["untied"]["folder"], "npu", rerank=True, kernel_dir=str(tmp_path))


def test_a_reranker_without_its_lm_head_computes_no_logits(models) -> None:
    model = load_model(models["untied"]["folder"], rerank=True)
    with pytest.raises(ModelError, match="reranker without an LM head"):
        model.engine.prefill("s", [1, 2, 3])


def test_without_the_option_a_hf_reranker_is_a_generation_model(models) -> None:
    model = load_model(models["untied"]["folder"])
    assert model.generates and model.pooling == "mean" and model.rerank_prompt is None


def test_an_instruction_is_written_into_the_prompt(models) -> None:
    ref = models["untied"]
    model = load_model(ref["folder"], rerank=True)
    job = _job(model, TASK)
    ids = model_card_ids(ref["folder"], QUERY, DOCUMENTS, instruction=TASK)
    assert job.ids == ids
    np.testing.assert_allclose(_scores(model, job.ids), reference_scores(ref["folder"], ids),
                               rtol=0, atol=2e-6)


def test_llama_cpp_reranker_gguf_scores_are_the_model_cards(models) -> None:
    ref = models["untied"]
    model = load_model(models["gguf"])
    assert model.pooling == RANK and not model.generates and model.embedding_dims == 1
    # the template's default instruction became the slot a request may fill
    assert model.rerank_prompt == GGUF_TEMPLATE.replace(RERANK_INSTRUCTION, "{instruction}")
    job = _job(model)
    assert job.ids == ref["ids"]
    np.testing.assert_allclose(_scores(model, job.ids), ref["want"], rtol=0, atol=2e-6)


@pytest.mark.parametrize("template,pooling_type,head,option", [
    (None, 4, True, False),  # no rerank template: the model card's prompt
    (None, None, False, True),  # a plain LM's file, served with the option
    (None, 4, False, False),  # pooling_type 4 without cls.output: the LM head's rows
])
def test_gguf_rerankers_without_llama_cpp_parts(models, tmp_path: Path, template,
                                                pooling_type, head: bool, option) -> None:
    ref = models["untied"]
    path = write_reranker_gguf(ref["folder"], tmp_path / "m.gguf", template=template,
                               pooling_type=pooling_type, head=head)
    model = load_model(path, rerank=option)
    assert model.pooling == RANK and model.rerank_prompt == RERANK_PROMPT
    job = _job(model)
    assert job.ids == ref["ids"]
    np.testing.assert_allclose(_scores(model, job.ids), ref["want"], rtol=0, atol=2e-6)


def test_a_plain_lm_gguf_without_the_option_generates(models, tmp_path: Path) -> None:
    path = write_reranker_gguf(models["untied"]["folder"], tmp_path / "m.gguf", template=None,
                               pooling_type=None, head=False)
    model = load_model(path)
    assert model.generates and model.pooling == "mean"


def test_a_pairs_score_is_the_same_alone_or_in_a_batch(models) -> None:
    model = load_model(models["untied"]["folder"], rerank=True)
    ids = models["untied"]["ids"]
    together = _scores(model, ids)
    alone = np.array([_scores(model, [item])[0] for item in ids])
    np.testing.assert_allclose(alone, together, rtol=0, atol=1e-6)


def test_rank_pooling_reads_the_first_or_the_last_token() -> None:
    hidden = np.arange(12, dtype=np.float32).reshape(6, 2)
    head = (Dense(weight=np.array([[1, -1]], np.float32)),)
    first = Pooling(mode=RANK, dense=head)
    last = Pooling(mode=RANK, dense=head, position="last", prompt="{query}{document}")
    assert pool(hidden, [2, 3, 1], first).tolist() == [[-1], [-1], [-1]]
    hidden[[1, 4]] = [[5, 2], [0, 9]]  # the last rows of the first two inputs
    assert pool(hidden, [2, 3, 1], last).tolist() == [[3], [-9], [-1]]
    assert pool(hidden, [2, 3, 1], first).tolist() == [[-1], [-1], [-1]]


@pytest.mark.parametrize("fields,words", [
    ({"mode": RANK, "position": "middle"}, "'middle' token"),
    ({"mode": RANK, "position": "last", "prompt": "{query} only"}, "lacks the slots {document}"),
    ({"mode": "mean", "prompt": "{query}{document}"}, "takes no score activation or prompt"),
])
def test_pooling_refuses_what_a_head_cannot_be(fields: dict, words: str) -> None:
    head = (Dense(weight=np.ones((1, 2), np.float32)),) if fields["mode"] == RANK else ()
    with pytest.raises(ModelError, match=words):
        Pooling(dense=head, **fields)


def test_answer_tokens_outside_the_vocabulary_are_named(models) -> None:
    with pytest.raises(ModelError, match="answer token 'nope'"):
        load_model(models["untied"]["folder"], rerank=True, rerank_tokens=("nope", "yes"))


def test_rerank_on_an_encoder_is_refused(tmp_path: Path) -> None:
    folder = build_reranker(tmp_path / "bert")
    with pytest.raises(ModelError, match="rerank applies to a decoder"):
        load_model(folder, rerank=True)
