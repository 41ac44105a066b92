"""A reranker's pooling read from its files: a GGUF file's pooling_type 4 (or none) with
llama.cpp's classification head, a Hugging Face sequence classifier's head and score
activation, and the errors for what does not rerank (several labels, no head)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from npu import ModelError
from npu.engine.pooling import Dense, Pooling, pool
from npu.load.pooling import (
    classifier_of,
    classifier_pooling,
    encoder_config,
    pooling_from_gguf,
)

H = 4


def _head(rng: np.random.Generator, dense: bool = True) -> dict[str, np.ndarray]:
    out = {"classifier.out_proj.weight": rng.standard_normal((1, H)).astype(np.float32),
           "classifier.out_proj.bias": np.array([0.5], np.float32)}
    if dense:
        out["classifier.dense.weight"] = rng.standard_normal((H, H)).astype(np.float32)
        out["classifier.dense.bias"] = rng.standard_normal(H).astype(np.float32)
    return out


@pytest.mark.parametrize("value", [4, None, 0])
def test_a_gguf_head_makes_a_reranker(value) -> None:
    """pooling_type 4, or none at all beside a head (llama-server ranks with it given
    `--reranking`): the head's tensors leave the engine's, scores through sigmoid."""
    meta = {"general.architecture": "bert"}
    if value is not None:
        meta["bert.pooling_type"] = value
    tensors = {**_head(np.random.default_rng(0)), "other": np.zeros(1)}
    got = pooling_from_gguf(meta, Path("m.gguf"), tensors)
    assert got.mode == "rank" and got.activation == "sigmoid" and got.source == "gguf"
    assert [d.activation for d in got.dense] == ["tanh", "identity"]
    assert list(tensors) == ["other"]


def test_a_gguf_head_without_cls_is_the_output_projection_alone() -> None:
    tensors = _head(np.random.default_rng(0), dense=False)
    got = pooling_from_gguf({"general.architecture": "bert", "bert.pooling_type": 4},
                            Path("m.gguf"), tensors)
    assert len(got.dense) == 1 and got.dense[0].weight.shape == (1, H)


def test_an_embedding_pooling_leaves_a_head_alone() -> None:
    tensors = _head(np.random.default_rng(0))
    got = pooling_from_gguf({"general.architecture": "bert", "bert.pooling_type": 2},
                            Path("m.gguf"), tensors)
    assert got == Pooling(mode="cls", source="gguf") and len(tensors) == 4


def test_rank_pooling_is_the_first_token_through_the_head() -> None:
    rng = np.random.default_rng(1)
    w, b = rng.standard_normal((H, H)), rng.standard_normal(H)
    o = rng.standard_normal((1, H))
    hidden = rng.standard_normal((5, H)).astype(np.float32)  # two inputs: 2 and 3 rows
    head = (Dense(weight=w, bias=b, activation="tanh"), Dense(weight=o, bias=np.zeros(1)))
    for act, f in (("identity", lambda x: x), ("sigmoid", lambda x: 1 / (1 + np.exp(-x)))):
        got = pool(hidden, [2, 3], Pooling(mode="rank", dense=head, activation=act))
        want = [f(o[0] @ np.tanh(w @ hidden[i] + b)) for i in (0, 2)]
        np.testing.assert_allclose(got[:, 0], want, rtol=1e-5)
    far = pool(np.full((1, H), 1e4, np.float32), [1],
               Pooling(mode="rank", dense=(Dense(weight=np.ones((1, H))),),
                       activation="sigmoid"))
    assert far[0, 0] == 1.0  # no overflow


def test_a_head_of_several_labels_or_an_activation_elsewhere_is_refused() -> None:
    with pytest.raises(ModelError, match="one score"):
        Pooling(mode="rank", dense=(Dense(weight=np.ones((2, H))),))
    with pytest.raises(ModelError, match="no score activation"):
        Pooling(mode="cls", activation="sigmoid")
    with pytest.raises(ModelError, match="softmax"):
        Pooling(mode="rank", dense=(Dense(weight=np.ones((1, H))),), activation="softmax")


BERT = {"architectures": ["BertForSequenceClassification"], "id2label": {"0": "LABEL_0"},
        "max_position_embeddings": 512}
XLMR = {"architectures": ["XLMRobertaForSequenceClassification"], "pad_token_id": 1,
        "id2label": {"0": "LABEL_0"}, "max_position_embeddings": 514}


def test_a_classifier_reads_as_its_encoder() -> None:
    assert classifier_of({"architectures": ["BertModel"]}) is None
    assert encoder_config({"architectures": ["BertModel"], "x": 1}) == \
        {"architectures": ["BertModel"], "x": 1}
    assert encoder_config(BERT) == {**BERT, "architectures": ["BertModel"]}
    # RoBERTa's positions start at pad_token_id + 1: two rows fewer of context
    assert encoder_config(XLMR)["max_position_embeddings"] == 512


@pytest.mark.parametrize("config,activation", [
    ({}, "sigmoid"),
    ({"sentence_transformers": {"activation_fn": "torch.nn.modules.linear.Identity"}},
     "identity"),
    ({"sbert_ce_default_activation_function": "torch.nn.modules.activation.Sigmoid"},
     "sigmoid"),
    ({"sbert_ce_default_activation_function": "torch.nn.modules.activation.Tanh"}, "tanh"),
])
def test_a_classifiers_head_and_score_activation(config: dict, activation: str) -> None:
    rng = np.random.default_rng(2)
    weights = {"roberta.embeddings.position_embeddings.weight": np.arange(12.0).reshape(6, 2),
               **_head(rng)}
    got = classifier_pooling({**XLMR, **config}, weights, Path("m"))
    assert got.mode == "rank" and got.activation == activation and len(got.dense) == 2
    assert got.source == "classifier"
    # the head left the weights; the positions lost their first pad_token_id + 1 rows
    assert list(weights) == ["roberta.embeddings.position_embeddings.weight"]
    assert weights["roberta.embeddings.position_embeddings.weight"][0].tolist() == [4, 5]


@pytest.mark.parametrize("config,weights,message", [
    ({**BERT, "id2label": {"0": "no", "1": "yes"}}, {}, "2 labels"),
    ({**BERT, "id2label": {}}, {}, "2 labels"),  # transformers' default
    (BERT, {"classifier.weight": np.ones((1, H))}, "bert.pooler.dense.weight"),
    ({**BERT, "sentence_transformers": {"activation_fn": "torch.nn.modules.activation.ReLU"}},
     {"bert.pooler.dense.weight": np.ones((H, H)), "classifier.weight": np.ones((1, H))},
     "ReLU"),
])
def test_what_does_not_rerank_is_a_model_error(config: dict, weights: dict,
                                               message: str) -> None:
    with pytest.raises(ModelError, match=message):
        classifier_pooling(config, dict(weights), Path("m"))


def test_a_cross_encoder_whose_tokenizer_cannot_pair_texts_is_refused_at_load(
        tmp_path: Path) -> None:
    """Not a reranker that loads and answers every request with an error."""
    import json

    from npu import load_model
    from tests.bert_model import build_reranker

    folder = build_reranker(tmp_path / "rr")
    doc = json.loads((folder / "tokenizer.json").read_text())
    doc["post_processor"] = None
    (folder / "tokenizer.json").write_text(json.dumps(doc))
    with pytest.raises(ModelError, match="a reranker, but .*no template for a pair of texts"):
        load_model(folder)


def test_padding_and_truncation_saved_in_a_tokenizer_json_are_not_applied(
        tmp_path: Path) -> None:
    """sentence-transformers saves fixed padding (128) and truncation with some models: a
    pad would be attended (no mask here) and a cut would pass the context check."""
    import json

    from npu.load.tokenizer import Tokenizer
    from tests.bert_model import build_reranker

    folder = build_reranker(tmp_path / "rr")
    plain = Tokenizer(folder / "tokenizer.json")
    doc = json.loads((folder / "tokenizer.json").read_text())
    doc["padding"] = {"strategy": {"Fixed": 64}, "direction": "Right", "pad_to_multiple_of": None,
                      "pad_id": 0, "pad_type_id": 0, "pad_token": "[PAD]"}
    doc["truncation"] = {"direction": "Right", "max_length": 6, "strategy": "LongestFirst",
                         "stride": 0}
    (folder / "tokenizer.json").write_text(json.dumps(doc))
    saved = Tokenizer(folder / "tokenizer.json")
    text = "the cat sat on the mat and the dog sat on the rug"
    assert saved.encode_pairs("where?", [text]) == plain.encode_pairs("where?", [text])
    assert saved.encode(text) == plain.encode(text) and len(plain.encode(text)) > 6
