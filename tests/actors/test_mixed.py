"""llama-server's mixed prompt (actors.mixed) on a stand-in model whose tokenizer adds BOS:
BOS only before a string that opens the list, ids as they are, the later strings plain
text; parse_special off reads special-token text as text; ids outside the vocabulary are a
400 naming the field."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from actors.errors import RequestError
from actors.mixed import check_ids, mixed_ids

BOS = 1


class _Tok:
    add_bos, bos_id = True, BOS

    @staticmethod
    def encode(text: str) -> list[int]:  # "<s>" is the special token 1, the rest letters
        pieces = [_Tok.encode_plain(p) for p in text.split("<s>")]
        return [*pieces[0], *(i for p in pieces[1:] for i in (BOS, *p))]

    @staticmethod
    def encode_plain(text: str) -> list[int]:
        return [100 + ord(c) % 50 for c in text]


def _model() -> SimpleNamespace:
    tok = _Tok()

    def prompt_ids(text: str) -> list[int]:
        ids = tok.encode(text)
        return ids if ids[:1] == [BOS] else [BOS, *ids]

    return SimpleNamespace(tokenizer=tok, prompt_ids=prompt_ids, generates=True,
                           config=SimpleNamespace(vocab_size=200))


CLS, SEP = 2, 3


def _encoder() -> SimpleNamespace:
    """An encoder's stand-in: [CLS] ... [SEP] around an input (Model.embedding_ids)."""
    return SimpleNamespace(tokenizer=_Tok(), generates=False,
                           embedding_ids=lambda text: [CLS, *_Tok.encode(text), SEP],
                           config=SimpleNamespace(vocab_size=200))


def test_an_encoders_opening_string_gets_its_cls_and_sep() -> None:
    """As llama.cpp's tokenizer adds a BERT vocabulary's specials: [CLS] a [SEP], then the
    other pieces; with parse_special off the text's own tokens plain between them."""
    a = _Tok.encode("a")
    assert mixed_ids(_encoder(), ["a", 7]) == [CLS, *a, SEP, 7]
    plain = _Tok.encode_plain("<s>a")
    assert mixed_ids(_encoder(), ["<s>a"], parse_special=False) == [CLS, *plain, SEP]
    assert mixed_ids(_encoder(), ["a"], add_special=False) == a


def test_bos_only_before_an_opening_string() -> None:
    model = _model()
    a, b = _Tok.encode("a"), _Tok.encode("b")
    assert mixed_ids(model, ["a", 7, "b"]) == [BOS, *a, 7, *b]
    assert mixed_ids(model, [7, "a", "b"]) == [7, *a, *b]  # an opening id: no BOS
    assert mixed_ids(model, ["a", 7], add_special=False) == [*a, 7]
    assert mixed_ids(model, ["<s>a"]) == [BOS, *a]  # a prompt's own BOS is not doubled


def test_parse_special_off_reads_special_text_as_text() -> None:
    model = _model()
    assert mixed_ids(model, ["<s>"], add_special=False) == [BOS]
    plain = mixed_ids(model, ["<s>"], add_special=False, parse_special=False)
    assert plain == _Tok.encode_plain("<s>") and BOS not in plain
    assert mixed_ids(model, ["<s>"], parse_special=False) == [BOS, *plain]


def test_ids_outside_the_vocabulary_are_refused_naming_the_field() -> None:
    check_ids(_model(), [0, 199], "prompt")
    for bad in (200, -1):
        with pytest.raises(RequestError) as err:
            check_ids(_model(), [5, bad], "content")
        assert err.value.status == 400 and err.value.param == "content"
        assert str(bad) in err.value.message
