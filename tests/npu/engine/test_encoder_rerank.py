"""A reranker on the EncoderEngine against transformers' AutoModelForSequenceClassification:
BERT (pooler + classifier, query-document pairs with token types) and XLM-RoBERTa (its
classification head, positions from pad_token_id + 1, one token type), float32 and Q8_0,
from Hugging Face directories and from `bert` GGUF files with llama.cpp's cls / cls.output
head (pooling_type 4); the pairs tokenized as transformers tokenizes them; a pair's score
is the same whatever else is in the batch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from npu import ModelError, load_model
from tests.bert_model import build_reranker, write_bert_gguf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

IDENTITY = "torch.nn.modules.linear.Identity"
QUERY = "where did the cat sit?"
DOCUMENTS = ["The cat sat on the mat.", "Stocks fell sharply today.", "a",
             "Café naïve résumé — 東京 ½ ✓ ok", "the cat and the dog sat on the mat; the cat slept"]


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def _reference(folder: Path) -> dict:
    """transformers' pair encodings of QUERY and DOCUMENTS, their logits, and the last
    hidden state of each pair's first token."""
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    model = transformers.AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()
    encs = [tok(QUERY, d) for d in DOCUMENTS]
    logits, first = [], []
    with torch.no_grad():
        for e in encs:
            out = model(**{k: torch.tensor([v]) for k, v in e.items()},
                        output_hidden_states=True)
            logits.append(out.logits[0, 0].item())
            first.append(out.hidden_states[-1][0, 0].numpy())
    return {"ids": [e["input_ids"] for e in encs],
            "types": [e.get("token_type_ids") for e in encs],
            "logits": np.array(logits), "first": np.stack(first)}


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> dict:
    raw = build_reranker(tmp_path_factory.mktemp("rr") / "raw", activation=IDENTITY)
    default = build_reranker(tmp_path_factory.mktemp("rr") / "sigmoid")  # same weights
    return {"raw": raw, "default": default, **_reference(raw)}


@pytest.fixture(scope="module")
def roberta(tmp_path_factory) -> dict:
    folder = build_reranker(tmp_path_factory.mktemp("rr") / "xlmr", roberta=True,
                            activation=IDENTITY)
    return {"folder": folder, **_reference(folder)}


def _scores(model, ref: dict) -> np.ndarray:
    pairs = model.tokenizer.encode_pairs(QUERY, DOCUMENTS)
    types = [t for _, t in pairs] if model.config.type_vocab_size > 1 else None
    out = model.engine.embed([ids for ids, _ in pairs], types=types)
    assert out.shape == (len(DOCUMENTS), 1) and out.dtype == np.float32
    return out[:, 0]


# Q8_0 (the encoder's matrices; the head stays float32): a random model's logits move by
# up to about 0.07 of their 2.6 spread
@pytest.mark.parametrize("quantize,atol", [(None, 1e-4), ("q8_0", 0.1)])
def test_bert_reranker_scores_are_transformers_logits(bert, quantize, atol) -> None:
    model = load_model(bert["raw"], quantize=quantize)
    assert model.pooling == "rank" and model.embedding_dims == 1 and not model.generates
    pairs = model.tokenizer.encode_pairs(QUERY, DOCUMENTS)
    assert [ids for ids, _ in pairs] == bert["ids"]  # [CLS] q [SEP] d [SEP]
    assert [t for _, t in pairs] == bert["types"]  # the document's tokens are type 1
    np.testing.assert_allclose(_scores(model, bert), bert["logits"], rtol=0, atol=atol)


def test_a_reranker_without_an_activation_in_its_config_scores_through_sigmoid(bert) -> None:
    """sentence-transformers' CrossEncoder (and vLLM) for one label; the order is the
    logits' order."""
    got = _scores(load_model(bert["default"]), bert)
    np.testing.assert_allclose(got, sigmoid(bert["logits"]), rtol=0, atol=1e-5)
    assert list(np.argsort(-got)) == list(np.argsort(-bert["logits"]))


def test_xlm_roberta_reranker_scores_are_transformers_logits(roberta) -> None:
    model = load_model(roberta["folder"])
    assert model.context_length == 128  # 130 position rows, the first two never read
    pairs = model.tokenizer.encode_pairs(QUERY, DOCUMENTS)
    assert [ids for ids, _ in pairs] == roberta["ids"]  # <s> q </s></s> d </s>
    np.testing.assert_allclose(_scores(model, roberta), roberta["logits"], rtol=0,
                               atol=1e-4)


def test_a_pairs_score_does_not_depend_on_the_batch(bert) -> None:
    model = load_model(bert["raw"])
    pairs = model.tokenizer.encode_pairs(QUERY, DOCUMENTS)
    whole = model.engine.embed([p[0] for p in pairs], types=[p[1] for p in pairs])
    # float32 rounding only: this model's F32 products go through BLAS, whose sums run in
    # an order set by the row count (npu.engine.linear.float_matmul's orientation, and
    # OpenBLAS's kernel for the CPU): up to 1.7e-6 of a score near 1 on a Zen 1 EPYC
    for i, pair in enumerate(pairs):
        alone = model.engine.embed([pair[0]], types=[pair[1]])
        np.testing.assert_allclose(alone[0], whole[i], rtol=1e-5, atol=1e-6)


def test_types_must_match_the_items_and_the_model(bert, roberta) -> None:
    model = load_model(bert["raw"])
    with pytest.raises(ValueError, match="one type per token"):
        model.engine.embed([[2, 5, 3]], types=[[0, 0]])
    with pytest.raises(ValueError, match="0..1"):
        model.engine.embed([[2, 5, 3]], types=[[0, 2, 0]])
    single = load_model(roberta["folder"])  # one token type: only 0
    with pytest.raises(ValueError, match="0..0"):
        single.engine.embed([[0, 5, 2]], types=[[0, 1, 1]])


@pytest.mark.parametrize("pooler,qtype", [(True, QT.F32), (True, QT.Q8_0), (False, QT.F32)])
def test_a_gguf_reranker_ranks_with_its_cls_head(bert, tmp_path: Path, pooler: bool,
                                                 qtype: QT) -> None:
    """pooling_type 4 with cls (the pooler) and cls.output (the classifier): transformers'
    scores; without cls, as llama.cpp's converter writes a BertForSequenceClassification
    (it drops the pooler), the classifier on the first token's hidden state, as llama.cpp
    computes it. Scores through sigmoid (a GGUF names no activation)."""
    file = write_bert_gguf(bert["raw"], tmp_path / "rr.gguf", qtype, pooling="rank",
                           pooler=pooler)
    model = load_model(file)
    assert model.pooling == "rank" and model.kind == "encoder"
    assert [ids for ids, _ in model.tokenizer.encode_pairs(QUERY, DOCUMENTS)] == bert["ids"]
    if pooler:
        want = sigmoid(bert["logits"])
    else:
        from safetensors.numpy import load_file

        w = load_file(str(bert["raw"] / "model.safetensors"))
        want = sigmoid(bert["first"] @ w["classifier.weight"][0] + w["classifier.bias"][0])
    atol = 1e-5 if qtype == QT.F32 else 0.03  # sigmoid's slope is at most 1/4
    np.testing.assert_allclose(_scores(model, bert), want, rtol=0, atol=atol)


def test_a_gguf_that_names_rank_without_a_head_is_refused(bert, tmp_path: Path) -> None:
    from tests.bert_model import build_bert

    plain = build_bert(tmp_path / "plain", pooling=None)
    file = write_bert_gguf(plain, tmp_path / "plain.gguf", pooling="rank")
    with pytest.raises(ModelError, match="pooling_type 4"):
        load_model(file)
