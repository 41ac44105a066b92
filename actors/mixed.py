"""llama-server's mixed prompt: one prompt given as strings and token ids in one list
(`[12, 34, "text", 56]`, its `tokenize_mixed`), for /completion and /tokenize: the parts'
ids joined in order, an id as it is, a string tokenized; the model's BOS only before a
string that opens the list (none before an opening id), as llama-server adds it."""

from __future__ import annotations

from collections.abc import Sequence

from actors.errors import RequestError
from npu import Model


def mixed_ids(model: Model, parts: Sequence[str | int], *, add_special: bool = True,
              parse_special: bool = True) -> list[int]:
    """The token ids of `parts`.

    Args:
        add_special: BOS before an opening string where the model's tokenizer adds one
            (the string then reads as a prompt does: `Model.prompt_ids`). default: True.
        parse_special: special-token text ("<|im_end|>") in a string reads as that token;
            False: as text (llama.cpp's `parse_special`). default: True.
    """
    encode = model.tokenizer.encode if parse_special else model.tokenizer.encode_plain
    ids: list[int] = []
    for k, part in enumerate(parts):
        if not isinstance(part, str):
            ids.append(part)
        elif k == 0 and add_special:
            ids += _with_specials(model, part, parse_special)
        else:
            ids += encode(part)
    return ids


def _with_specials(model: Model, text: str, parse_special: bool) -> list[int]:
    """`text`'s ids with the special tokens the model puts around an input, as llama.cpp's
    tokenizer adds them: a decoder's BOS (`Model.prompt_ids`: not doubled where the text
    opens with it), an encoder's [CLS] ... [SEP] (`Model.embedding_ids`); without
    `parse_special`, the text's own tokens read as text, after BOS or between the two."""
    tok = model.tokenizer
    if model.generates:
        if parse_special:
            return model.prompt_ids(text)
        bos = [tok.bos_id] if tok.add_bos and tok.bos_id is not None else []
        return bos + tok.encode_plain(text)
    full = model.embedding_ids(text)
    if parse_special:
        return full
    body = tok.encode(text)
    start = position(full, body)
    plain = tok.encode_plain(text)
    if start is None:  # the text's tokens are not whole in the input: no specials known
        return plain
    return full[:start] + plain + full[start + len(body):]


def position(full: Sequence[int], body: Sequence[int]) -> int | None:
    """Where a text's own ids `body` start among the ids `full` the model made of it with
    its special tokens around them (None: they are not there whole)."""
    return next((h for h in range(len(full) - len(body) + 1)
                 if full[h:h + len(body)] == body), None)


def check_ids(model: Model, ids: Sequence[int], param: str) -> None:
    """Raises RequestError (400 naming `param`) for an id outside the model's vocabulary."""
    vocab = model.config.vocab_size
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise RequestError(f"'{param}' holds token id {bad}, outside this model's "
                           f"vocabulary of {vocab}.", param=param)
