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
