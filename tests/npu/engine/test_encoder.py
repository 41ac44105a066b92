"""EncoderEngine (BERT) against transformers' BertModel: mean and CLS pooling, float32 and
Q8_0, from the Hugging Face directory and from a `bert` GGUF written here (its WordPiece
tokenizer against the directory's); batches equal single inputs; an encoder only embeds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from npu import ContextLengthError, ModelError, load_model
from npu.engine.ops import KernelOps
from npu.engine.protocol import Engine
from tests.bert_model import DIMS, build_bert, write_bert_gguf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TEXTS = ["Hello world, this is a test.", "a", "The cat sat on the mat; it looked AT the dog!",
         "Café naïve résumé — 東京 ½ ✓ ok", "unknownwordzzqx and numbers 12345"]


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> dict:
    """The model directories (sentence-transformers mean and CLS pooling), the HF
    tokenizer's ids for TEXTS, and BertModel's last hidden states for them."""
    root = tmp_path_factory.mktemp("bert")
    folders = {mode: build_bert(root / mode, pooling=mode) for mode in ("mean", "cls")}
    tok = transformers.AutoTokenizer.from_pretrained(str(folders["mean"]))
    ids = [tok(t)["input_ids"] for t in TEXTS]
    model = transformers.BertModel.from_pretrained(str(folders["mean"])).eval()
    with torch.no_grad():
        hidden = [model(torch.tensor([i])).last_hidden_state[0].numpy() for i in ids]
    refs = {"mean": np.stack([h.mean(0) for h in hidden]),
            "cls": np.stack([h[0] for h in hidden])}
    return {"folders": folders, "ids": ids, "refs": refs}


@pytest.mark.parametrize("mode", ["mean", "cls"])
@pytest.mark.parametrize("quantize,floor", [(None, 0.9999), ("q8_0", 0.999)])
def test_bert_embeddings_match_transformers(bert, mode: str, quantize: str | None,
                                            floor: float) -> None:
    model = load_model(bert["folders"][mode], quantize=quantize)
    assert model.pooling == mode and model.embedding_dims == DIMS["hidden_size"]
    assert [model.embedding_ids(t) for t in TEXTS] == bert["ids"]  # [CLS] ... [SEP]
    got = model.engine.embed(bert["ids"])
    assert got.dtype == np.float32 and got.shape == (len(TEXTS), DIMS["hidden_size"])
    assert cosine(got, bert["refs"][mode]).min() >= floor


@pytest.mark.parametrize("mode,qtype,floor", [("mean", QT.F32, 0.9999), ("cls", QT.Q8_0, 0.999)])
def test_bert_gguf_tokenizes_and_embeds_as_transformers(bert, tmp_path: Path, mode: str,
                                                        qtype: QT, floor: float) -> None:
    file = write_bert_gguf(bert["folders"]["mean"], tmp_path / "bert.gguf", qtype,
                           pooling=mode)
    model = load_model(file)
    assert model.kind == "encoder" and model.pooling == mode and model.template is None
    assert [model.embedding_ids(t) for t in TEXTS] == bert["ids"]
    assert model.embedding_ids(TEXTS[2], limit=6) == bert["ids"][2][:5] + bert["ids"][2][-1:]
    assert cosine(model.engine.embed(bert["ids"]), bert["refs"][mode]).min() >= floor


def test_an_encoder_in_spans_of_a_few_rows_gives_the_same_vectors(bert, monkeypatch) -> None:
    from npu.engine import encoder

    engine = load_model(bert["folders"]["mean"], quantize="q8_0").engine
    whole = engine.embed(bert["ids"])
    monkeypatch.setattr(encoder, "EMBED_TILE", 4)  # every input but "a" cut into spans
    assert sum(1 for _ in engine.embed_steps(bert["ids"])) > 2 * DIMS["num_hidden_layers"]
    got = engine.embed(bert["ids"])
    if isinstance(engine.ops, KernelOps):  # Q8_0 on the compiled kernels: bit for bit
        assert np.array_equal(got, whole)
    else:
        assert np.allclose(got, whole, rtol=0, atol=1e-5 * np.abs(whole).max())
    assert cosine(got, bert["refs"]["mean"]).min() >= 0.999


def test_a_batch_gives_each_input_its_single_vector(bert) -> None:
    engine = load_model(bert["folders"]["mean"], quantize="q8_0").engine
    ids = bert["ids"]
    batch = engine.embed(ids)
    assert np.array_equal(batch, np.concatenate([engine.embed([i]) for i in ids]))
    assert np.array_equal(batch, engine.embed(ids[::-1])[::-1])


def test_plain_bert_pools_by_mean_as_sentence_transformers_would(tmp_path: Path, bert) -> None:
    model = load_model(build_bert(tmp_path / "plain", pooling=None))
    assert model.pooling == "mean" and model.engine.pooling.source == "default"
    assert cosine(model.engine.embed(bert["ids"]), bert["refs"]["mean"]).min() >= 0.9999


def test_an_encoder_only_embeds(bert) -> None:
    model = load_model(bert["folders"]["mean"])
    engine = model.engine
    assert isinstance(engine, Engine)
    assert not model.generates and model.kind == "encoder"
    with pytest.raises(ModelError, match="embedding model"):
        engine.prefill("a", [2, 5, 3])
    with pytest.raises(ModelError, match="embedding model"):
        engine.decode(["a"], [5])
    with pytest.raises(ModelError, match="embedding model"):
        model.render([{"role": "user", "content": "hi"}])
    assert engine.kv_usage()["sequences"] == 0 and engine.cached_prefix([2, 5]) == 0
    assert engine.weight_summary()["quantization"] == "F32" and engine.weight_bytes > 0
    context = DIMS["max_position_embeddings"]
    with pytest.raises(ContextLengthError):
        engine.embed([[2, 3], [5] * (context + 1)])
    with pytest.raises(ValueError):
        engine.embed([[]])
    with pytest.raises(ValueError):
        engine.embed([[2, engine.vocab_size]])
    assert engine.embed([[5] * context]).shape == (1, DIMS["hidden_size"])
    with pytest.raises(ModelError, match="CPU only"):
        load_model(bert["folders"]["mean"], "npu", kernel_dir="/nonexistent")


# -- nomic-bert -------------------------------------------------------------------------------
# transformers has no NomicBertModel (it is remote code, nomic-ai's modeling_hf_nomic_bert.py),
# so the oracle is that forward restated in torch: fused Wqkv, rotary positions (halves, not
# interleaved), post-norm, SwiGLU with fc11 * silu(fc12), token type 0, no layer biases.
def _nomic_reference(folder: Path, ids: list[int]) -> np.ndarray:
    import json

    import torch.nn.functional as F
    from safetensors.torch import load_file

    cfg = json.loads((folder / "config.json").read_text())
    w = load_file(str(folder / "model.safetensors"))
    H, heads, eps = cfg["n_embd"], cfg["n_head"], cfg["layer_norm_epsilon"]
    hd, n = H // heads, len(ids)

    def ln(x, name):
        return F.layer_norm(x, (H,), w[name + ".weight"], w[name + ".bias"], eps)

    x = w["embeddings.word_embeddings.weight"][torch.tensor(ids)]
    x = ln(x + w["embeddings.token_type_embeddings.weight"][0], "emb_ln")
    inv = 1.0 / cfg["rotary_emb_base"] ** (torch.arange(0, hd, 2).double() / hd)
    freqs = torch.outer(torch.arange(n).double(), inv)
    cos, sin = (f(torch.cat([freqs, freqs], -1)).float()[:, None] for f in (torch.cos,
                                                                           torch.sin))

    def rotate(t):
        a, b = t.chunk(2, -1)
        return t * cos + torch.cat([-b, a], -1) * sin

    for i in range(cfg["n_layer"]):
        p = f"encoder.layers.{i}."
        q, k, v = (x @ w[p + "attn.Wqkv.weight"].T).view(n, 3, heads, hd).unbind(1)
        q, k = rotate(q), rotate(k)
        att = torch.softmax(torch.einsum("qhd,khd->hqk", q, k) / hd ** 0.5, -1)
        out = torch.einsum("hqk,khd->qhd", att, v).reshape(n, H)
        x = ln(x + out @ w[p + "attn.out_proj.weight"].T, p + "norm1")
        y = (x @ w[p + "mlp.fc11.weight"].T) * F.silu(x @ w[p + "mlp.fc12.weight"].T)
        x = ln(x + y @ w[p + "mlp.fc2.weight"].T, p + "norm2")
    return x.numpy()


@pytest.fixture(scope="module")
def nomic(tmp_path_factory, bert) -> dict:
    folder = build_bert(tmp_path_factory.mktemp("nomic") / "nomic", pooling="mean",
                        nomic=True)
    with torch.no_grad():
        ref = np.stack([_nomic_reference(folder, i).mean(0) for i in bert["ids"]])
    return {"folder": folder, "ids": bert["ids"], "ref": ref}


@pytest.mark.parametrize("source,floor", [("hf", 0.9999), ("hf-q8_0", 0.999),
                                          ("gguf", 0.9999), ("gguf-Q8_0", 0.999)])
def test_nomic_bert_embeddings_match_its_forward(nomic, tmp_path: Path, source: str,
                                                 floor: float) -> None:
    folder = nomic["folder"]
    if source.startswith("gguf"):
        qtype = QT.Q8_0 if source.endswith("Q8_0") else QT.F32
        model = load_model(write_bert_gguf(folder, tmp_path / "nomic.gguf", qtype))
    else:
        model = load_model(folder, quantize="q8_0" if source.endswith("q8_0") else None)
    assert model.config.arch == "nomic_bert" and model.kind == "encoder"
    assert [model.embedding_ids(t) for t in TEXTS] == nomic["ids"]
    got = model.engine.embed(nomic["ids"])
    assert cosine(got, nomic["ref"]).min() >= floor


def test_embedding_ids_cut_the_text_to_a_limit_and_keep_cls_and_sep(bert) -> None:
    model = load_model(bert["folders"]["mean"])
    full = model.embedding_ids(TEXTS[2])
    cut = model.embedding_ids(TEXTS[2], limit=6)
    assert cut == full[:5] + full[-1:] and len(cut) == 6
    assert model.embedding_ids(TEXTS[2], limit=len(full) + 5) == full


def test_erf_is_the_error_function_to_float32_precision() -> None:
    import math

    from npu.engine.ops import erf

    x = np.linspace(-6, 6, 2001, dtype=np.float32)
    want = np.array([math.erf(float(v)) for v in x])
    got = erf(x)
    assert got.dtype == np.float32 and np.abs(got - want).max() < 5e-7  # 6 ulp at 1.0
    assert got[0] == -got[-1] and erf(np.float32([0.0]))[0] == 0.0
