"""An embedding request's `keep_last` (vLLM's `truncate_prompt_tokens`) in the worker (no
Ray): each input keeps its last tokens, a text's special tokens kept around them (BERT's
[CLS] ... [SEP], a decoder's BOS), token ids their last ones; -1 is the context; 0, below
-1, past the context or too few for the special tokens are refused naming `keep_last`."""

from __future__ import annotations

import pytest

from actors.embedding import build_embedding
from actors.errors import RequestError
from actors.events import EmbedGenerate
from npu import load_model
from npu.load.tiny import ensure_tiny
from tests.bert_model import build_bert

pytestmark = pytest.mark.timeout(120)

TEXT = "the cat sat on the mat and looked at the dog"


@pytest.fixture(scope="module", params=["decoder", "encoder"])
def model(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    return load_model(ensure_tiny(folder) if request.param == "decoder"
                      else build_bert(folder / "bert"), name="m")


def _ids(model, inputs: list, **kw) -> list[list[int]]:
    return build_embedding(EmbedGenerate(request_id="e", inputs=inputs, **kw), model).ids


def _split(model, text: str) -> tuple[list[int], list[int], list[int]]:
    """The embedding ids of `text` as (before, its own tokens, after)."""
    full, body = model.embedding_ids(text), model.tokenizer.encode(text)
    start = next(h for h in range(len(full)) if full[h:h + len(body)] == body)
    return full[:start], body, full[start + len(body):]


def test_a_text_keeps_its_last_tokens_and_the_special_tokens(model) -> None:
    head, body, tail = _split(model, TEXT)
    keep = len(head) + len(tail) + 3
    (ids,) = _ids(model, [TEXT], keep_last=keep)
    assert ids == head + body[-3:] + tail and len(ids) == keep


def test_token_ids_keep_their_last_ones_and_short_inputs_stay_whole(model) -> None:
    short = "a cat"
    ids, whole = _ids(model, [[5, 6, 7, 8, 9], short], keep_last=3 + len(model.embedding_ids(
        short)))
    assert ids == [5, 6, 7, 8, 9] and whole == model.embedding_ids(short)
    (cut,) = _ids(model, [[5, 6, 7, 8, 9]], keep_last=2)
    assert cut == [8, 9]


def test_minus_one_keeps_the_context_where_the_input_was_refused(model) -> None:
    limit = model.context_length
    long = "word " * (limit + 50)
    with pytest.raises(RequestError) as exc:
        _ids(model, [long])
    assert exc.value.param == "input"
    head, body, tail = _split(model, long)
    (ids,) = _ids(model, [long], keep_last=-1)
    assert len(ids) == limit and ids == head + body[-(limit - len(head) - len(tail)):] + tail
    (same,) = _ids(model, [long], keep_last=limit)
    assert same == ids


@pytest.mark.parametrize("keep", [0, -2, 10**6])
def test_a_size_it_cannot_keep_is_refused_naming_it(model, keep: int) -> None:
    with pytest.raises(RequestError) as exc:
        _ids(model, ["a cat"], keep_last=keep)
    assert exc.value.param == "keep_last" and str(keep) in exc.value.message


def test_too_few_for_the_special_tokens_is_refused(model) -> None:
    head, _, tail = _split(model, TEXT)
    if not head + tail:  # nothing added around an input: one token is kept
        assert len(_ids(model, [TEXT], keep_last=1)[0]) == 1
        return
    with pytest.raises(RequestError) as exc:
        _ids(model, [TEXT], keep_last=len(head) + len(tail))
    assert exc.value.param == "keep_last" and "special tokens" in exc.value.message
