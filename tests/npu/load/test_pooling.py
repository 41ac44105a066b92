"""Pooling read from a model's files: GGUF's pooling_type enum, sentence-transformers'
modules.json, and clear errors for what embeddings cannot honour."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from npu import ModelError
from npu.engine.pooling import Dense, Pooling
from npu.load.pooling import pooling_from_directory, pooling_from_gguf


@pytest.mark.parametrize("value,mode", [(None, "mean"), (0, "mean"), (1, "mean"), (2, "cls"),
                                        (3, "last")])
def test_gguf_pooling_type_is_llama_cpps_enum(value, mode: str) -> None:
    meta = {"general.architecture": "qwen3"}
    if value is not None:
        meta["qwen3.pooling_type"] = value
    assert pooling_from_gguf(meta, Path("m.gguf")).mode == mode


def test_rank_pooling_without_a_classification_head_is_refused() -> None:
    with pytest.raises(ModelError, match="classification head"):
        pooling_from_gguf({"general.architecture": "bert", "bert.pooling_type": 4},
                          Path("m.gguf"))


def _modules(folder: Path, pooling: dict, extra: list[dict] = ()) -> None:
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        *extra]))


def test_sentence_transformers_pooling_and_its_absence(tmp_path: Path) -> None:
    assert pooling_from_directory(tmp_path) == Pooling()
    _modules(tmp_path, {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False})
    got = pooling_from_directory(tmp_path)
    assert got.mode == "cls" and got.source == "sentence-transformers"


@pytest.mark.parametrize("pooling,extra,message", [
    ({"pooling_mode_weightedmean_tokens": True}, [], "weightedmean"),
    ({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": True}, [], "not supported"),
    ({"pooling_mode_cls_token": True},
     [{"idx": 2, "path": "x", "type": "sentence_transformers.models.LayerNorm"}], "LayerNorm"),
    ({"pooling_mode_cls_token": True},
     [{"idx": 2, "path": "2_Dense", "type": "sentence_transformers.models.Dense"}],
     "2_Dense"),
])
def test_what_embeddings_cannot_honour_is_a_model_error(tmp_path: Path, pooling: dict,
                                                        extra: list, message: str) -> None:
    _modules(tmp_path, pooling, extra)
    with pytest.raises(ModelError, match=message):
        pooling_from_directory(tmp_path)


def test_a_dense_layer_of_the_wrong_width_is_named() -> None:
    dense = Dense(weight=np.zeros((8, 16), np.float32))
    with pytest.raises(ModelError, match="takes 16"):
        Pooling(dense=(dense,)).dims(32)
    with pytest.raises(ModelError, match="sigmoid"):
        Dense(weight=np.zeros((8, 16), np.float32), activation="sigmoid")
