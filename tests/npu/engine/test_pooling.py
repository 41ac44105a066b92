"""Embeddings from decoders (NumpyEngine.embed + npu.engine.pooling) against transformers'
hidden states: Qwen3 with last-token pooling (sentence-transformers files, add_eos), Llama
with mean pooling and a Dense layer, both also through GGUF files written here; batches
equal single inputs; the KV cache is left as it was."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from npu import ContextLengthError, load_model
from npu.engine import numpy_engine
from npu.engine.attention import row_spans
from npu.engine.numpy_engine import EMBED_TILE
from npu.engine.ops import KernelOps
from npu.engine.pooling import Dense, Pooling, pool
from tests.npu.gguf_files import tiny_tokenizer_meta, write_gguf_from_hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB = 1869  # flm-tiny's tokenizer, whole (so a GGUF's token list matches the embedding)
CONTEXT = 64
TEXTS = ["hello world", "the cat sat on the mat and looked at the dog for a while",
         "a", "embeddings are pooled hidden states"]
CONFIGS = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, rope_theta=1e6, tie_word_embeddings=True)),
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, rope_theta=1e4, tie_word_embeddings=True)),
}


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.atleast_2d(a), np.atleast_2d(b)
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def _write_sentence_transformers(folder: Path, mode_key: str, dense: Dense | None) -> None:
    from safetensors.numpy import save_file

    modules = [{"idx": 0, "name": "0", "path": "",
                "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"}]
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": 64, "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": False,
        "pooling_mode_lasttoken": False, mode_key: True}))
    if dense is not None:
        modules.append({"idx": 2, "name": "2", "path": "2_Dense",
                        "type": "sentence_transformers.models.Dense"})
        (folder / "2_Dense").mkdir()
        (folder / "2_Dense" / "config.json").write_text(json.dumps({
            "in_features": dense.weight.shape[1], "out_features": dense.weight.shape[0],
            "bias": True, "activation_function": "torch.nn.modules.activation.Tanh"}))
        save_file({"linear.weight": dense.weight, "linear.bias": dense.bias},
                  str(folder / "2_Dense" / "model.safetensors"))
    modules.append({"idx": len(modules), "name": str(len(modules)), "path": "3_Normalize",
                    "type": "sentence_transformers.models.Normalize"})
    (folder / "modules.json").write_text(json.dumps(modules))


@pytest.fixture(scope="module")
def models(tmp_path_factory, tiny_dir: Path) -> dict:
    """Per architecture: the HF directory, its token ids for TEXTS, and transformers'
    pooled vectors for them."""
    out = {}
    rng = np.random.default_rng(5)
    for name, (cfg_cls, model_cls, kwargs) in CONFIGS.items():
        torch.manual_seed(11)
        cfg = getattr(transformers, cfg_cls)(vocab_size=VOCAB, max_position_embeddings=CONTEXT,
                                             initializer_range=0.2, **kwargs)
        cfg._attn_implementation = "eager"
        model = getattr(transformers, model_cls)(cfg).eval()
        folder = tmp_path_factory.mktemp(name)
        model.save_pretrained(folder)
        shutil.copy(tiny_dir / "tokenizer.json", folder / "tokenizer.json")
        tok_cfg = {"eos_token": "<|endoftext|>"}
        dense = None
        if name == "qwen3":  # Qwen3-Embedding: EOS appended, its hidden state pooled
            tok_cfg["add_eos_token"] = True
            _write_sentence_transformers(folder, "pooling_mode_lasttoken", None)
        else:
            dense = Dense(weight=(rng.standard_normal((32, 64)) * 0.2).astype(np.float32),
                          bias=(rng.standard_normal(32) * 0.1).astype(np.float32),
                          activation="tanh")
            _write_sentence_transformers(folder, "pooling_mode_mean_tokens", dense)
        (folder / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
        ids = [load_model(folder).embedding_ids(t) for t in TEXTS]
        hidden = []
        with torch.no_grad():
            for item in ids:
                hidden.append(model.model(torch.tensor([item])).last_hidden_state[0].numpy())
        if name == "qwen3":
            ref = np.stack([h[-1] for h in hidden])
        else:
            ref = np.tanh(np.stack([h.mean(0) for h in hidden]) @ dense.weight.T + dense.bias)
        plain = np.stack([h.mean(0) for h in hidden])  # mean pooling, no Dense (GGUF)
        out[name] = (folder, ids, ref, plain)
    return out


def test_pool_modes_and_dense_row_by_row() -> None:
    hidden = np.arange(12, dtype=np.float32).reshape(6, 2)
    lengths = [2, 3, 1]
    assert pool(hidden, lengths, Pooling(mode="cls")).tolist() == [[0, 1], [4, 5], [10, 11]]
    assert pool(hidden, lengths, Pooling(mode="last")).tolist() == [[2, 3], [8, 9], [10, 11]]
    assert pool(hidden, lengths, Pooling(mode="mean")).tolist() == [[1, 2], [6, 7], [10, 11]]
    assert pool(hidden, lengths, Pooling(mode="max")).tolist() == [[2, 3], [8, 9], [10, 11]]
    dense = Dense(weight=np.array([[1, 1]], np.float32), bias=np.array([1], np.float32))
    assert pool(hidden, lengths, Pooling(mode="cls", dense=(dense,))).tolist() == [[2], [10],
                                                                                   [22]]
    assert Pooling(mode="cls", dense=(dense,)).dims(2) == 1


def test_qwen3_last_token_embedding_ids_end_with_eos(models) -> None:
    folder, ids, _, _ = models["qwen3"]
    model = load_model(folder)
    assert model.pooling == "last" and model.kind == "decoder" and model.generates
    assert model.embedding_dims == 64
    assert all(item[-1] == model.tokenizer.eos_id for item in ids)
    cut = model.embedding_ids(TEXTS[1], limit=5)  # the text cut, its EOS kept
    assert cut == ids[1][:4] + ids[1][-1:]
    assert load_model(models["llama"][0]).embedding_dims == 32  # its Dense layer's output


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("quantize,floor", [(None, 0.9999), ("q8_0", 0.999)])
def test_decoder_embeddings_match_transformers(models, name: str, quantize: str | None,
                                               floor: float) -> None:
    folder, ids, ref, _ = models[name]
    got = load_model(folder, quantize=quantize).engine.embed(ids)
    assert got.dtype == np.float32 and got.shape == ref.shape
    assert cosine(got, ref).min() >= floor


@pytest.mark.parametrize("name,qtype,floor", [("qwen3", QT.F32, 0.9999), ("qwen3", QT.Q8_0, 0.999),
                                              ("llama", QT.Q8_0, 0.999)])
def test_decoder_embeddings_from_gguf_match_transformers(models, tmp_path: Path,
                                                         tiny_dir: Path, name: str, qtype: QT,
                                                         floor: float) -> None:
    folder, ids, ref, plain = models[name]
    meta = {**tiny_tokenizer_meta(tiny_dir), "tokenizer.ggml.eos_token_id": 1860}
    extra = {"qwen3.pooling_type": 3, "tokenizer.ggml.add_eos_token": True} \
        if name == "qwen3" else {}  # llama: no pooling type, the default mean
    file = write_gguf_from_hf(folder, tmp_path / f"{name}.gguf", name, qtype, meta, extra)
    model = load_model(file)
    assert model.pooling == ("last" if name == "qwen3" else "mean")
    assert [model.embedding_ids(t) for t in TEXTS] == ids
    got = model.engine.embed(ids)
    assert cosine(got, ref if name == "qwen3" else plain).min() >= floor


@pytest.mark.parametrize("quantize", [None, "q8_0"])
def test_a_batch_gives_each_input_its_single_vector(models, quantize: str | None) -> None:
    folder, ids, _, _ = models["qwen3"]
    engine = load_model(folder, quantize=quantize).engine
    batch = engine.embed(ids)
    single = np.concatenate([engine.embed([item]) for item in ids])
    reordered = engine.embed(ids[::-1])[::-1]
    if quantize:  # integer formats: bit for bit
        assert np.array_equal(batch, single) and np.array_equal(batch, reordered)
    else:
        assert np.allclose(batch, single, rtol=0, atol=1e-5 * np.abs(single).max())


@pytest.mark.parametrize("quantize", [None, "q8_0"])
def test_embed_in_spans_of_a_few_rows_gives_the_same_vectors(models, quantize: str | None,
                                                             monkeypatch) -> None:
    folder, ids, _, _ = models["qwen3"]
    engine = load_model(folder, quantize=quantize).engine
    long = [list(range(5, 5 + CONTEXT))]  # one input as long as the context
    whole = engine.embed(ids + long)
    monkeypatch.setattr(numpy_engine, "EMBED_TILE", 3)
    steps = engine.embed_steps(ids + long)
    count = 0
    while True:
        try:
            next(steps)
            count += 1
        except StopIteration as stop:
            got = stop.value
            break
    spans = len(row_spans([len(i) for i in ids + long], 3))
    assert count == 2 * engine.config.num_layers * spans  # a step: one span, one half-layer
    if quantize and isinstance(engine.ops, KernelOps):  # integer formats: bit for bit
        assert np.array_equal(got, whole)
    else:
        assert np.allclose(got, whole, rtol=0, atol=1e-5 * np.abs(whole).max())


def test_embed_leaves_the_kv_cache_as_it_was(models) -> None:
    folder, ids, _, _ = models["llama"]
    engine = load_model(folder, quantize="q8_0").engine
    prompt = list(range(5, 45))  # two whole blocks and a bit
    engine.prefill("a", prompt)
    engine.release("a")
    before = engine.kv_usage()
    engine.embed(ids + [prompt])
    assert engine.kv_usage() == before
    assert engine.cached_prefix(prompt) == 32
    assert engine.reuse_prefix("b", prompt) == 32


def test_embed_refuses_empty_and_overlong_inputs(models) -> None:
    engine = load_model(models["qwen3"][0]).engine
    with pytest.raises(ValueError):
        engine.embed([[1, 2], []])
    with pytest.raises(ContextLengthError) as info:
        engine.embed([[1, 2], [3] * (CONTEXT + 1)])
    assert info.value.limit == CONTEXT and info.value.requested == CONTEXT + 1
    assert engine.kv_usage()["sequences"] == 0
    assert engine.embed([[3] * CONTEXT]).shape == (1, 64)


# the other decoders' own paths in `embed`: Gemma 3's sliding window and scaled embedding,
# LFM2's convolutions (state per input, thrown away), gpt-oss's attention sinks and experts
OTHER_DECODERS = {
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=24, sliding_window=5, query_pre_attn_scalar=16,
        layer_types=["sliding_attention", "full_attention"])),
    "lfm2": ("Lfm2Config", "Lfm2ForCausalLM", dict(
        hidden_size=48, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, conv_L_cache=3, layer_types=["conv", "full_attention"])),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", dict(
        hidden_size=48, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=12, num_local_experts=4, num_experts_per_tok=2,
        sliding_window=5, layer_types=["sliding_attention", "full_attention"],
        tie_word_embeddings=False)),
}


@pytest.mark.parametrize("tile", [EMBED_TILE, 5])
@pytest.mark.parametrize("name", list(OTHER_DECODERS))
def test_other_decoders_embed_their_hidden_states(tmp_path: Path, name: str, tile: int,
                                                  monkeypatch) -> None:
    from npu import NumpyEngine, config_from_json
    from npu.load.safetensors import load_weights

    cfg_cls, model_cls, kwargs = OTHER_DECODERS[name]
    torch.manual_seed(3)
    cfg = getattr(transformers, cfg_cls)(vocab_size=128, max_position_embeddings=CONTEXT,
                                         initializer_range=0.2, **kwargs)
    cfg._attn_implementation = "eager"
    model = getattr(transformers, model_cls)(cfg).eval()
    model.save_pretrained(tmp_path)
    items = [[3, 17, 99, 5, 64, 8, 8, 120, 33, 2, 77, 41], [9], [5, 6, 7, 100, 101, 1, 2]]
    with torch.no_grad():
        ref = np.stack([model.model(torch.tensor([i])).last_hidden_state[0].numpy().mean(0)
                        for i in items])
    config = config_from_json(json.loads((tmp_path / "config.json").read_text()))
    engine = NumpyEngine(config, load_weights(tmp_path, progress=False))
    monkeypatch.setattr(numpy_engine, "EMBED_TILE", tile)  # 5: inputs cut into spans
    got = engine.embed(items)
    assert cosine(got, ref).min() >= 0.9999
    assert np.allclose(got[1], engine.embed([items[1]])[0], atol=1e-5)
    assert engine.kv_usage()["sequences"] == 0 and engine.embed([]).shape == (0, 48)
