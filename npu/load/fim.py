"""A model's fill-in-the-middle (FIM) tokens: the ones a code model was trained to read a gap
with (`<|fim_prefix|>` text before `<|fim_suffix|>` text after `<|fim_middle|>` -> the
middle), found as llama.cpp finds them: a GGUF file's `tokenizer.ggml.fim_*_token_id`
(or the older `prefix_token_id` ...) first, else the vocabulary's spelling of the
families that have them (Qwen2.5-Coder, StarCoder2 / Granite, DeepSeek-Coder, CodeLlama,
GLM-4.5, Falcon-H1-Coder)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec

# each role's spellings, in llama.cpp's order (src/llama-vocab.cpp)
SPELLINGS: dict[str, tuple[str, ...]] = {
    "prefix": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
               "▁<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "suffix": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
               "▁<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "middle": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
               "▁<MID>", "<|code_middle|>", "<|middle|>"),
    "pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"),
    "repo": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "file": ("<|file_sep|>",),
}
# what ends a middle besides the model's EOS (llama.cpp ends any generation on these): an
# instruct model's EOS is its turn's end, its FIM training ended a middle with the text's
# (Qwen2.5-Coder-Instruct: <|endoftext|>); CodeLlama's end of a middle
ENDS = ("<|endoftext|>", "<EOT>", "▁<EOT>", "<｜end▁of▁sentence｜>")
# the GGUF keys of each role (llama.cpp's converter writes the first; older files the second)
GGUF_KEYS: dict[str, tuple[str, ...]] = {
    "prefix": ("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"),
    "suffix": ("tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"),
    "middle": ("tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"),
    "pad": ("tokenizer.ggml.fim_pad_token_id",),
    "repo": ("tokenizer.ggml.fim_rep_token_id",),
    "file": ("tokenizer.ggml.fim_sep_token_id",),
}


class FimTokens(msgspec.Struct, frozen=True, kw_only=True):
    """The ids of a model's FIM tokens (prefix, suffix and middle always; the others where
    the vocabulary has them: `pad`, and Qwen2.5-Coder's repository-level `repo` and `file`
    separators). `ends`: the vocabulary's ENDS; `stops`: every token that ends a middle
    besides EOS (these, and pad, repo and file, which llama.cpp ends any generation on)."""

    prefix: int
    suffix: int
    middle: int
    pad: int | None = None
    repo: int | None = None
    file: int | None = None
    ends: tuple[int, ...] = ()

    @property
    def stops(self) -> tuple[int, ...]:
        return self.ends + tuple(t for t in (self.pad, self.repo, self.file) if t is not None)


def fim_tokens(id_of: Callable[[str], int | None], size: int,
               meta: Mapping[str, Any] | None = None) -> FimTokens | None:
    """The FIM tokens of a vocabulary (`id_of`: a spelling's id, `size`: the ids there are),
    the GGUF metadata's ids first; None when prefix, suffix or middle is missing."""
    found: dict[str, int] = {}
    for role, keys in GGUF_KEYS.items():
        ids = [(meta or {}).get(key) for key in keys] + [id_of(s) for s in SPELLINGS[role]]
        first = next((i for i in ids if isinstance(i, int) and 0 <= i < size), None)
        if first is not None:
            found[role] = first
    if not {"prefix", "suffix", "middle"} <= found.keys():
        return None
    ends = tuple(i for i in map(id_of, ENDS) if i is not None and 0 <= i < size)
    return FimTokens(**found, ends=ends)


_SPELLED = frozenset(s for spellings in SPELLINGS.values() for s in spellings)


def vocabulary_fim(tokens: Sequence[str],
                   meta: Mapping[str, Any] | None = None) -> FimTokens | None:
    """`fim_tokens` of a token list (a GGUF header's `tokenizer.ggml.tokens`), without a
    tokenizer: what a models folder lists before a model loads."""
    index = {t: i for i, t in enumerate(tokens) if t in _SPELLED or t in ENDS}
    return fim_tokens(index.get, len(tokens), meta)
