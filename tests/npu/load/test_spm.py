"""A GGUF SentencePiece vocabulary encoded in C (npu/load/spm.py, npu/engine/cpu_spm.c)
gives the ids and the text that `tokenizers` gives for the same document, on random
vocabularies and random texts: added tokens that overlap, a text under two ids, tied
scores, characters outside the vocabulary with and without their byte pieces (UNK, fused),
with and without the space prefix."""

from __future__ import annotations

import random
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npu.load import spm
from npu.load.gguf_tokenizer import spm_tokenizer, tokenizer_json
from npu.load.tokenizer import Tokenizer

pytestmark = pytest.mark.skipif(
    spm._lib() is None, reason="the C kernels cannot be built here (no C compiler): such a "
    "machine encodes with `tokenizers` alone, which the other tokenizer tests cover")

CHARS = ["a", "b", "c", "d", "é", "日", "本", "🙂", "\u2581", "<", ">", "\t", "\n"]
ADDED = ["<s>", "</s>", "<a>", "<ab>", "<ab", "\t", "\t\t", "\n\n", "ab", "<turn>"]
# a control token's text also a plain piece ("ab": Gemma 3's "\t" is both)
NOT_IN = ["x", "ÿ", "😀"]  # never pieces; "x" keeps its byte piece, the others lose some


def _vocab(seed: int, *, all_bytes: bool, unk: bool, prefix: bool) -> dict:
    rng = random.Random(seed)
    tokens, types, scores = [], [], []

    def add(text: str, kind: int = 1, score: float | None = None) -> None:
        tokens.append(text)
        types.append(kind)
        scores.append(score if score is not None else -float(rng.randint(1, 12)))

    add("<unk>", 2, 0.0)
    for t in ADDED:
        add(t, 3 if t.startswith("<") else 4, 0.0)
    for b in range(256):
        if all_bytes or b not in (0x78, 0xC3, 0xF0, 0x9F):
            add(f"<0x{b:02X}>", 6, 0.0)
    for c in CHARS:
        add(c)
    for _ in range(120):  # pieces of 2-5 characters, some twice (the last id wins)
        add("".join(rng.choice(CHARS) for _ in range(rng.randint(2, 5))))
    add(tokens[-7])
    add("ab")
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": scores, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.add_space_prefix": prefix,
            **({"tokenizer.ggml.unknown_token_id": 0} if unk else {})}


def _pair(meta: dict) -> tuple[Tokenizer, object]:
    from tokenizers import Tokenizer as HFTokenizer

    ours = Tokenizer(tokenizer_json(meta, merges=False), spm=spm_tokenizer(meta))
    assert ours._spm is not None and ours._tok is None
    ref = HFTokenizer.from_str(msgspec.json.encode(tokenizer_json(meta)).decode())
    return ours, ref


CASES = [dict(all_bytes=True, unk=True, prefix=True), dict(all_bytes=False, unk=True, prefix=False),
         dict(all_bytes=False, unk=False, prefix=True), dict(all_bytes=True, unk=False, prefix=False)]
PAIRS = {i: _pair(_vocab(i, **case)) for i, case in enumerate(CASES)} if spm._lib() else {}

TEXT = st.lists(st.sampled_from(CHARS + ADDED + NOT_IN + [" ", "  ", "abc", "é日本"]),
                max_size=30).map("".join)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(range(len(CASES))), text=TEXT)
def test_encode_is_tokenizers(case: int, text: str) -> None:
    ours, ref = PAIRS[case]
    assert ours.encode(text) == ref.encode(text, add_special_tokens=False).ids


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(range(len(CASES))), data=st.data())
def test_decode_is_tokenizers(case: int, data) -> None:
    ours, ref = PAIRS[case]
    n = ours.size
    ids = data.draw(st.lists(st.integers(0, n + 2), max_size=20))
    for skip in (True, False):
        assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(
            ids, skip_special_tokens=skip), (ids, skip)


def test_texts_that_take_every_path() -> None:
    """UNK fused over a run of unknown characters and placed after the byte pieces that
    came while it waited (as `tokenizers` places it), the longest added token at the
    leftmost place, an empty text, a long one."""
    for case, (ours, ref) in PAIRS.items():
        for text in ["", " ", "ÿÿxÿ a", "😀x😀", "<ab>\t\t\t<a", "ab<abab", "a" * 3000 + " b",
                     "\n\n\n<turn> é日本🙂 x"]:
            assert ours.encode(text) == ref.encode(text, add_special_tokens=False).ids, (case, text)
    ours, _ = PAIRS[0]
    assert ours.encode("<ab>") == [ours.id_of("<ab>")]
    # an added token whose text is also a later piece: one token, the later id, as
    # `tokenizers` encodes it; id_of keeps the added token's own (what BOS / EOS ids and the
    # end of a turn the model writes are), and the table reads both
    own = ADDED.index("ab") + 1
    assert ours.encode("abab") == [ours.size - 1] * 2 and ours.id_of("ab") == own
    assert ours.token_bytes()[own] == ours.token_bytes()[ours.size - 1] == b"ab"


def test_a_gguf_file_loads_with_the_c_encoder(tmp_path: Path, monkeypatch) -> None:
    """The loader takes the C encoder for a SentencePiece vocabulary, `tokenizers` where the
    kernels do not build; both give the same ids and text."""
    from npu.load.loader import _gguf_tokenizer

    meta = _vocab(7, all_bytes=True, unk=True, prefix=True)
    meta.update({"tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2})
    fast = _gguf_tokenizer(meta, tmp_path / "m.gguf")
    monkeypatch.setattr(spm, "_lib", lambda: None)
    slow = _gguf_tokenizer(meta, tmp_path / "m.gguf")
    assert fast._spm is not None and slow._spm is None
    text = "<s>abc é日本 <turn>\t\tx😀"
    assert fast.encode(text) == slow.encode(text)
    ids = fast.encode(text)
    assert fast.decode(ids) == slow.decode(ids) and fast.decode(ids, skip_special_tokens=False) \
        == slow.decode(ids, skip_special_tokens=False)
    assert fast.encode_for_embedding(text, room=3) == slow.encode_for_embedding(text, room=3)
    assert fast.token_bytes() == slow.token_bytes() and fast.size == slow.size
    assert (fast.bos_id, fast.eos_id) == (slow.bos_id, slow.eos_id) == (1, 2)


def test_what_the_encoder_does_not_take_keeps_tokenizers() -> None:
    meta = _vocab(3, all_bytes=True, unk=True, prefix=True)
    tokens = meta["tokenizer.ggml.tokens"]
    assert spm_tokenizer({**meta, "tokenizer.ggml.tokens": [*tokens[:-1], "a\0b"]}) is None
    repeated = [*tokens, "<turn>"]  # an added token's text twice
    assert spm_tokenizer({**meta, "tokenizer.ggml.tokens": repeated,
                          "tokenizer.ggml.scores": meta["tokenizer.ggml.scores"] + [0.0],
                          "tokenizer.ggml.token_type": meta["tokenizer.ggml.token_type"] + [3]}) is None
    assert spm_tokenizer({**meta, "tokenizer.ggml.merges": ["a b"]}) is None
    assert spm_tokenizer({**meta, "tokenizer.ggml.model": "gpt2"}) is None


def test_a_text_the_vocabulary_repeats_keeps_the_files_special_ids(tmp_path: Path) -> None:
    """UNK, BOS and EOS whose texts come again later as plain pieces: the encoder writes UNK
    as `tokenizers` does (its text's last id), BOS / EOS stay the ids the file declares
    (the ids the model writes), and every id has its bytes."""
    from tokenizers import Tokenizer as HFTokenizer

    from npu.load.loader import _gguf_tokenizer

    tokens = ["<unk>", "<s>", "</s>", "a", "\u2581", "<unk>", "<s>", "</s>"]
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": [2, 3, 3, 1, 1, 1, 1, 1],
            "tokenizer.ggml.scores": [0.0] * len(tokens),
            "tokenizer.ggml.unknown_token_id": 0, "tokenizer.ggml.bos_token_id": 1,
            "tokenizer.ggml.eos_token_id": 2}
    tok = _gguf_tokenizer(meta, tmp_path / "m.gguf")
    ref = HFTokenizer.from_str(msgspec.json.encode(tokenizer_json(meta)).decode())
    for text in ["axa", "a<s>a</s>", "xx"]:
        assert tok.encode(text) == ref.encode(text, add_special_tokens=False).ids, text
    assert tok.encode("axa")[2] == 5  # UNK's text's last id
    assert (tok.bos_id, tok.eos_id, tok.size) == (1, 2, len(tokens))
    table = tok.token_bytes()
    assert table[1] == b"" and table[2] == b"</s>" and table[6] == b"<s>"
