"""The "t5" (SentencePiece Unigram) vocabulary of an XLM-RoBERTa GGUF as llama.cpp's converter
writes it (bge-m3, multilingual-e5, bge-reranker-v2-m3): its ids against transformers'
XLMRobertaTokenizer on varied text and pairs, with and without the precompiled charsmap; the
whole file as an embedding model and as a reranker against transformers' XLM-RoBERTa."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from npu import load_model
from npu.load.gguf_header import read_header
from npu.load.gguf_tokenizer import TOKENIZER_MODELS, tokenizer_json
from npu.load.loader import _gguf_tokenizer
from npu.load.tokenizer import Tokenizer
from tests.xlmr_model import CONTEXT, DIMS, build_xlmr, write_xlmr_gguf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TEXTS = ["Hello world, this is a test.", "  leading and trailing  ", "multiple    spaces here",
         "Café naïve résumé — 東京 ½ ✓ ok", "emoji 🙂🚀 and ∰ unknown ☃☃ chars",
         "北京欢迎你。서울은",
         "Москва — столица России.", "<s> specials </s> in <unk> text <mask>", "", " ", "x",
         "a\u2581b"]
# what only the charsmap makes equal (tokenizers' WhitespaceSplit splits at any whitespace,
# llama.cpp only at " ", which this charsmap maps tabs and newlines to)
CHARSMAP_TEXTS = ["ＦＵＬＬ width １２３ ﬁne Ⅰ", "tab\there", "new\nline\n\nend", "no\u00a0break"]
QUERY = "where did the cat sit? 東京"
DOCUMENTS = ["The cat sat on the mat.", "  Stocks fell   sharply today. ", "a",
             "Café naïve résumé — 東京 ½ ✓ ok"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("xlmr")
    return {"embed": build_xlmr(root / "embed"),
            "rank": build_xlmr(root / "rank", reranker=True, seed=1),
            "plain": build_xlmr(root / "plain", charsmap=None, seed=2)}


def _tokenizers(folder: Path, tmp_path: Path, *, charsmap: bool = True):
    file = write_xlmr_gguf(folder, tmp_path / "vocab.gguf", charsmap=charsmap)
    meta = read_header(file).meta
    return _gguf_tokenizer(meta, file), transformers.AutoTokenizer.from_pretrained(str(folder))


def test_t5_is_a_supported_tokenizer_model() -> None:
    assert "t5" in TOKENIZER_MODELS


@pytest.mark.parametrize("kind", ["embed", "plain"])
def test_a_unigram_vocabulary_encodes_as_transformers_xlm_roberta(folders, tmp_path: Path,
                                                                  kind: str) -> None:
    ours, ref = _tokenizers(folders[kind], tmp_path)
    texts = TEXTS + (CHARSMAP_TEXTS if kind == "embed" else [])
    for text in texts:
        assert ours.encode(text) == ref(text, add_special_tokens=False)["input_ids"], text
        assert ours.encode_for_embedding(text) == ref(text)["input_ids"], text  # <s> ... </s>
    assert ours.decode(ours.encode(TEXTS[3])) == TEXTS[3]
    assert ours.spellings(ours.encode("Hello")) == ref.convert_ids_to_tokens(
        ref("Hello", add_special_tokens=False)["input_ids"])


def test_pairs_are_roberta_pairs(folders, tmp_path: Path) -> None:
    ours, ref = _tokenizers(folders["embed"], tmp_path)
    pairs = ours.encode_pairs(QUERY, DOCUMENTS)
    assert [ids for ids, _ in pairs] == [ref(QUERY, d)["input_ids"] for d in DOCUMENTS]
    assert all(set(types) == {0} for _, types in pairs)  # one token type


def test_without_the_charsmap_nothing_is_normalized(folders, tmp_path: Path) -> None:
    """llama.cpp normalizes with the charsmap only (no NFKC in its place), and only " " is a
    space to it."""
    ours, _ = _tokenizers(folders["embed"], tmp_path, charsmap=False)
    with_map, _ = _tokenizers(folders["embed"], tmp_path)
    assert ours.encode("ＦＵＬＬ") != with_map.encode("ＦＵＬＬ") == with_map.encode("FULL")
    assert ours.encode("FULL") == with_map.encode("FULL")
    assert ours.spellings(ours.encode("a\tb"))[-2:] == ["<unk>", "b"]  # one word


def test_whitespace_rules_follow_the_flags() -> None:
    """remove_extra_whitespaces: one "\u2581" before each word, other spaces gone; without it
    every space is kept, and add_space_prefix puts one more in front."""
    tokens = ["<s>", "<pad>", "</s>", "<unk>", "\u2581", "a", "\u2581a", "b", "\u2581b"]
    meta = {"tokenizer.ggml.model": "t5", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": [0.0] * 4 + [-3.0, -2.0, -1.0, -2.0, -1.0],
            "tokenizer.ggml.token_type": [3, 3, 3, 2, 1, 1, 1, 1, 1],
            "tokenizer.ggml.unknown_token_id": 3}

    def ids(text: str, **flags) -> list[int]:
        keys = {f"tokenizer.ggml.{k}": v for k, v in flags.items()}
        return Tokenizer(tokenizer_json({**meta, **keys})).encode(text)

    assert ids(" a  b ", remove_extra_whitespaces=True) == [6, 8]
    assert ids(" a  b ", remove_extra_whitespaces=True, add_space_prefix=False) == [6, 8]
    assert ids(" a  b ", add_space_prefix=True) == [4, 6, 4, 8, 4]
    assert ids("a  b", add_space_prefix=False) == [5, 4, 8]
    assert ids("a c", add_space_prefix=False) == [5, 4, 3]  # "c": unknown
    # only the text's own ends lose their spaces, not a line's (a newline the charsmap keeps)
    assert ids("a \nb", remove_extra_whitespaces=True) == [6, 4, 3, 7]  # ▁a ▁ \n b
    assert ids("a\n b", remove_extra_whitespaces=True) == [6, 3, 8]  # ▁a \n ▁b


def test_flags_choose_the_special_tokens_around_a_text() -> None:
    """llama.cpp's UGM defaults: EOS appended, no BOS, no SEP (T5's)."""
    tokens = ["<pad>", "</s>", "<unk>", "\u2581a"]
    meta = {"tokenizer.ggml.model": "t5", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": [0.0, 0.0, 0.0, -1.0],
            "tokenizer.ggml.token_type": [3, 3, 2, 1], "tokenizer.ggml.add_space_prefix": True}
    tok = Tokenizer(tokenizer_json(meta))
    assert tok.encode_for_embedding("a") == [3, 1]
    assert tok.encode_pairs("a", ["a"]) == [([3, 1, 3, 1], [0, 0, 0, 0])]


def _hidden(folder: Path, ids: list[list[int]]) -> list[np.ndarray]:
    model = transformers.XLMRobertaModel.from_pretrained(str(folder)).eval()
    with torch.no_grad():
        return [model(torch.tensor([i])).last_hidden_state[0].numpy() for i in ids]


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


@pytest.mark.parametrize("mode", ["mean", "cls"])
def test_an_xlm_roberta_gguf_embeds_as_transformers(folders, tmp_path: Path, mode: str) -> None:
    folder = folders["embed"]
    model = load_model(write_xlmr_gguf(folder, tmp_path / "xlmr.gguf", pooling=mode))
    assert model.kind == "encoder" and model.pooling == mode
    assert model.context_length == CONTEXT  # the converter cut pad_token_id + 1 rows
    assert model.embedding_dims == DIMS["hidden_size"]
    ref = transformers.AutoTokenizer.from_pretrained(str(folder))
    texts = [t for t in TEXTS if t.strip()]
    ids = [model.embedding_ids(t) for t in texts]
    assert ids == [ref(t)["input_ids"] for t in texts]
    hidden = _hidden(folder, ids)
    want = np.stack([h.mean(0) if mode == "mean" else h[0] for h in hidden])
    assert cosine(model.engine.embed(ids), want).min() >= 0.9999


def test_an_xlm_roberta_reranker_gguf_scores_as_llama_cpp(folders, tmp_path: Path) -> None:
    """pooling_type 4 with cls / cls.output: dense + tanh on <s>, then out_proj, through
    sigmoid (the default for one label)."""
    folder = folders["rank"]
    model = load_model(write_xlmr_gguf(folder, tmp_path / "rerank.gguf", pooling="rank"))
    assert model.pooling == "rank" and model.embedding_dims == 1
    ref = transformers.AutoTokenizer.from_pretrained(str(folder))
    pairs = model.tokenizer.encode_pairs(QUERY, DOCUMENTS)
    assert [ids for ids, _ in pairs] == [ref(QUERY, d)["input_ids"] for d in DOCUMENTS]
    net = transformers.XLMRobertaForSequenceClassification.from_pretrained(str(folder)).eval()
    with torch.no_grad():
        logits = np.array([net(torch.tensor([ids])).logits[0, 0].item() for ids, _ in pairs])
    got = model.engine.embed([ids for ids, _ in pairs])[:, 0]
    np.testing.assert_allclose(got, 1 / (1 + np.exp(-logits)), rtol=0, atol=1e-5)
    assert np.ptp(logits) > 0.1  # the documents score apart
