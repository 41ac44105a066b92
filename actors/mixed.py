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
    tok = model.tokenizer
    encode = tok.encode if parse_special else tok.encode_plain
    ids: list[int] = []
    for k, part in enumerate(parts):
        if not isinstance(part, str):
            ids.append(part)
        elif k == 0 and add_special and parse_special:
            ids += model.prompt_ids(part)
        elif k == 0 and add_special and tok.add_bos and tok.bos_id is not None:
            ids += [tok.bos_id, *encode(part)]
        else:
            ids += encode(part)
    return ids


def check_ids(model: Model, ids: Sequence[int], param: str) -> None:
    """Raises RequestError (400 naming `param`) for an id outside the model's vocabulary."""
    vocab = model.config.vocab_size
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise RequestError(f"The prompt holds token id {bad}, outside this model's "
                           f"vocabulary of {vocab}.", param=param)
