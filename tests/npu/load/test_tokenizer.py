"""Tokenizer: token bytes for byte-level BPE and SentencePiece, and the incremental
detokenizer (complete UTF-8 only, nothing emitted twice)."""

from __future__ import annotations

from pathlib import Path

import pytest

from npu import load_model
from tests.shared import SHARED

STORIES = SHARED / "models" / "stories260K" / "hf-f32"


def test_byte_level_token_bytes_rebuild_any_text(tiny_dir: Path) -> None:
    model = load_model(tiny_dir)
    tok = model.tokenizer
    table = tok.token_bytes(model.config.vocab_size)
    assert len(table) == model.config.vocab_size and table[-1] == b""
    text = "Paris café 東京 🙂 <tool_call>{\"a\": 1}</tool_call>"
    ids = tok.encode(text)
    assert b"".join(table[i] for i in ids).decode() == text
    assert table[tok.id_of("<think>")] == b"<think>"


@pytest.mark.skipif(not STORIES.exists(), reason=f"{STORIES} is absent")
def test_sentencepiece_token_bytes() -> None:
    tok = load_model(STORIES).tokenizer
    table = tok.token_bytes()
    assert table[1] == b"" and table[3] == b"\x00" and table[3 + 0xE6] == b"\xe6"
    ids = tok.encode("Once upon a time, café")
    assert b"".join(table[i] for i in ids).decode() == " Once upon a time, café"


def test_detokenizer_emits_only_complete_characters(tiny_dir: Path) -> None:
    tok = load_model(tiny_dir).tokenizer
    text = "a🙂b東京c"
    ids = tok.encode(text)
    det = tok.detokenizer()
    pieces = [det.push(i) for i in ids]
    assert "".join(pieces) + det.flush() == text
    assert all("\ufffd" not in p for p in pieces)
    # a lone start byte of a 4-byte character is held, then completed
    table = tok.token_bytes()
    emoji = "🙂".encode()
    byte_ids = [table.index(bytes([b])) for b in emoji]
    det = tok.detokenizer()
    assert [det.push(i) for i in byte_ids] == ["", "", "", "🙂"]


def test_detokenizer_flushes_a_broken_character(tiny_dir: Path) -> None:
    tok = load_model(tiny_dir).tokenizer
    table = tok.token_bytes()
    det = tok.detokenizer()
    assert det.push(table.index(b"\xf0")) == ""
    assert det.flush() == "\ufffd"


@pytest.mark.skipif(not STORIES.exists(), reason=f"{STORIES} is absent")
def test_sentencepiece_leading_space_only_at_the_start() -> None:
    tok = load_model(STORIES).tokenizer
    ids = tok.encode("Once upon a time")
    det = tok.detokenizer()
    assert "".join(det.push(i) for i in ids) == "Once upon a time"
    det = tok.detokenizer(at_start=False)
    assert "".join(det.push(i) for i in ids) == " Once upon a time"


# A SentencePiece vocabulary as a GGUF file holds it (`llama`: tokens, scores and types, no
# merges): multi-byte characters, a text under two ids ("ab": the last wins), tied scores,
# and a user-defined token "\t" that the vocabulary also has as a normal piece (Gemma 3 has
# this), control tokens and byte pieces.
SPM_TOKENS = ["<unk>", "<s>", "</s>", "<0x0A>", "\t", "a", "b", "c", "\u2581", "é", "日",
              "本", "ab", "bc", "abc", "\u2581a", "\u2581ab", "éé", "日本", "ab", "é日本", "\t",
              "<start_of_turn>", "aé", "c\u2581", "\u2581abc"]
SPM_TYPES = [2, 3, 3, 6, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 4, 3, 1, 1, 1]
SPM_SCORES = [0.0, 0.0, 0.0, 0.0, -1.0, -2.0, -2.0, -2.0, -1.5, -3.0, -3.0, -3.0, -4.0, -4.0,
              -5.0, -4.0, -6.0, -7.0, -5.0, -4.5, -8.0, 0.0, 0.0, -5.0, -9.0, -6.0]
SPM_TEXTS = ["abc abc", "ab\tbc", "éé日本 é日本", "<start_of_turn>abc\n", "aé c abc\t\t",
             " leading and trailing ", "zzz unknown ☃"]


def _spm_meta(tokens=SPM_TOKENS) -> dict:
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": list(tokens),
            "tokenizer.ggml.scores": SPM_SCORES[: len(tokens)] + [-10.0] * (len(tokens) - 26),
            "tokenizer.ggml.token_type": SPM_TYPES[: len(tokens)] + [1] * (len(tokens) - 26),
            "tokenizer.ggml.unknown_token_id": 0, "tokenizer.ggml.add_space_prefix": False}


def test_sentencepiece_merges_found_in_c_are_the_python_loops(monkeypatch) -> None:
    """The cuts found in C (cpu_spm.c's fc_spm_pairs), in the merges' order, are what
    the Python loop finds; a vocabulary with a NUL in a token takes the loop."""
    from npu.load import gguf_tokenizer
    from npu.load import spm as convert

    if convert._lib() is None:
        pytest.skip("no C compiler here: the Python loop is the only way the merges are found")
    pairs = convert.spm_pairs(SPM_TOKENS)
    assert pairs is not None and len(pairs[0]) > 10
    fast = gguf_tokenizer._spm_merges(SPM_TOKENS, SPM_SCORES)
    short = gguf_tokenizer._spm_merges(SPM_TOKENS, SPM_SCORES[:20])  # a file short of scores
    with_nul = [*SPM_TOKENS, "a\0b"]
    assert convert.spm_pairs(with_nul) is None
    monkeypatch.setattr(convert, "spm_pairs", lambda tokens, data=None: None)
    assert fast == gguf_tokenizer._spm_merges(SPM_TOKENS, SPM_SCORES)
    assert short == gguf_tokenizer._spm_merges(SPM_TOKENS, SPM_SCORES[:20]) != fast
    assert ("a", "b") in fast and ("é", "日本") in fast and ("\u2581", "abc") in fast
    # best score first ("bc" -4.0 before "abc" -5.0), ties by the pieces' ids; "ab" twice
    assert fast.index(("b", "c")) < fast.index(("ab", "c")) < fast.index(("\u2581", "ab"))
    assert fast.index(("a", "b")) < fast.index(("\u2581", "a")) and fast.count(("a", "b")) == 2


def test_a_sentencepiece_tokenizer_built_from_objects_is_the_json_one() -> None:
    """The tokenizer made from the vocabulary and merges as Python objects (not through
    `tokenizers`' JSON reader) serializes and encodes as the one read from the document."""
    import msgspec
    from tokenizers import Tokenizer as HFTokenizer

    from npu.load.gguf_tokenizer import tokenizer_json
    from npu.load.tokenizer import Tokenizer

    doc = tokenizer_json(_spm_meta())
    ours = Tokenizer(doc)
    ref = HFTokenizer.from_str(msgspec.json.encode(doc).decode())
    assert ours._tok.to_str() == ref.to_str()
    for text in SPM_TEXTS:
        assert ours.encode(text) == ref.encode(text, add_special_tokens=False).ids, text
    assert ours.encode("\t") == [21]  # the added token, not the piece's id 4
    # an added token outside the vocabulary keeps its own id (the document read whole)
    doc["added_tokens"].append({**doc["added_tokens"][-1], "id": 26, "content": "<new>"})
    ours = Tokenizer(doc)
    ref = HFTokenizer.from_str(msgspec.json.encode(doc).decode())
    assert ours._tok.to_str() == ref.to_str()
    assert ours.encode("a<new>b") == ref.encode("a<new>b", add_special_tokens=False).ids
