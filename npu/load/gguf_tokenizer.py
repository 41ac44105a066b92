"""The tokenizer a GGUF file describes, as a `tokenizers` tokenizer.json document.

`tokenizer.ggml.model`:
- "gpt2": byte-level BPE from `tokens` and `merges`, split first by the regex that
  `tokenizer.ggml.pre` names (the one the vocabulary's merges were learned with);
- "llama": SentencePiece-style BPE with byte fallback; merges from the file, or derived from
  the vocabulary ordered by the tokens' `scores`.
- "bert": WordPiece (BERT-family encoders). llama.cpp's converter stores the vocabulary in
  "phantom space" form: a word-initial piece as "\u2581piece", a continuation ("##piece") as
  "piece", bracketed specials ("[CLS]") as they are; undone here. The normalizer lowercases,
  as llama.cpp's WPM tokenizer does (the file does not say whether the model was cased), and
  the post-processor writes [CLS] ... [SEP] (`bos_token_id`, `seperator_token_id`).
- "t5": SentencePiece Unigram (llama.cpp's UGM; XLM-RoBERTa's, as its converter writes bge-m3,
  multilingual-e5 and bge-reranker-v2-m3), see `_unigram`.
Tokens whose `token_type` is control (3) are special added tokens, user-defined (4) plain
added tokens, both matched whole in text.
"""

from __future__ import annotations

import json
import operator
from itertools import repeat
from typing import Any

import numpy as np

from npu.errors import ModelError
from npu.load.tokenizer import byte_decoder

NORMAL, UNKNOWN, CONTROL, USER_DEFINED = 1, 2, 3, 4

# The split regexes of the pre-tokenizers llama.cpp names (facts of the original tokenizers)
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPLITS = {
    "llama3": _LLAMA3, "llama-v3": _LLAMA3, "llama-bpe": _LLAMA3, "smaug-bpe": _LLAMA3,
    "lfm2": _LLAMA3, "dbrx": _LLAMA3, "falcon3": _LLAMA3, "pixtral": _LLAMA3,
    "qwen2": _QWEN2, "deepseek-r1-qwen": _QWEN2,
}

# the `tokenizer.ggml.model`s read here
TOKENIZER_MODELS = ("gpt2", "llama", "bert", "t5")


def _byte_level_pre(pre: str | None) -> dict[str, Any]:
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}
    if pre in SPLITS:
        split = {"type": "Split", "pattern": {"Regex": SPLITS[pre]}, "behavior": "Isolated",
                 "invert": False}
        return {"type": "Sequence", "pretokenizers": [split, {**byte_level,
                                                              "use_regex": False}]}
    if pre == "smollm":  # digits one by one, then GPT-2's split
        return {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True}, byte_level]}
    return byte_level  # "gpt-2", "default" and anything else: GPT-2's own split


def _added(tokens: list[str], types: list[int], keep=lambda t: True, *,
           unknown: bool = False) -> list[dict]:
    """The added tokens: control ones special, user-defined ones plain (`unknown`: the
    unknown token too, special, as `tokenizers`' XLM-RoBERTa has it)."""
    n = min(len(tokens), len(types))
    kinds = np.asarray(types[:n])
    out = []
    wanted = (kinds == CONTROL) | (kinds == USER_DEFINED) | (unknown & (kinds == UNKNOWN))
    for i in np.flatnonzero(wanted).tolist():
        if keep(tokens[i]):
            out.append({"id": i, "content": tokens[i], "single_word": False, "lstrip": False,
                        "rstrip": False, "normalized": False,
                        "special": types[i] != USER_DEFINED})
    return out


def _spm_merge_ids(tokens: list[str], scores: list[float], data: bytes | None = None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Merges implied by a vocabulary as id arrays (left, right, the token they make) in
    their order: every split of a token into two tokens, ordered by the token's score (best
    first), then by the pieces' ids. The cuts are found in C where the kernels build (Gemma
    3's 262,144 tokens: 1.7 s in Python); None where they do not. `data`: the tokens
    joined (npu.load.spm.joined), where the caller has them."""
    from npu.load.spm import spm_pairs

    pairs = spm_pairs(tokens, data)
    if pairs is None:
        return None
    token, left, right = pairs
    if len(scores) < len(tokens):  # as the loop: only tokens with a score are merged
        keep = token < len(scores)
        token, left, right = token[keep], left[keep], right[keep]
    order = _merge_order(np.asarray(scores, dtype=np.float64), token, left, right,
                         len(tokens))
    return left[order], right[order], token[order]


def _spm_merges(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """The merges of `_spm_merge_ids` as the pieces' texts (a Python loop where the kernels
    do not build)."""
    ids = _spm_merge_ids(tokens, scores)
    if ids is not None:
        left, right, _ = ids
        return list(zip(map(tokens.__getitem__, left.tolist()),
                        map(tokens.__getitem__, right.tolist())))
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    for tok, score in zip(tokens, scores):
        for cut in range(1, len(tok)):
            left, right = tok[:cut], tok[cut:]
            if left in vocab and right in vocab:
                merges.append((-score, vocab[left], vocab[right], left, right))
    merges.sort()
    return [(m[3], m[4]) for m in merges]


def spm_tokenizer(meta: dict[str, Any]):
    """The tokenizer of a `llama` vocabulary without merges in C (npu.load.spm's
    SpmTokenizer, which encodes as `tokenizers` does from `tokenizer_json(meta)` without
    building its BPE model: Gemma 3's in 0.1 s against 1 s); None for another vocabulary,
    or where the kernels do not build."""
    from npu.load.spm import SpmTokenizer, joined

    tokens = meta.get("tokenizer.ggml.tokens")
    if meta.get("tokenizer.ggml.model") != "llama" or meta.get("tokenizer.ggml.merges") \
            or not tokens:
        return None
    scores = list(meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens))
    types = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    data = joined(tokens)  # once, for the merges and the encoder (20 ms for Gemma 3's)
    merges = _spm_merge_ids(tokens, scores, data)
    if merges is None:
        return None
    added = [(a["id"], a["special"]) for a in _added(tokens, types)]
    return SpmTokenizer.build(tokens, merges, added,
                              unk=meta.get("tokenizer.ggml.unknown_token_id"),
                              prefix=bool(meta.get("tokenizer.ggml.add_space_prefix", True)),
                              data=data)


def _merge_order(scores: np.ndarray, token: np.ndarray, left: np.ndarray,
                 right: np.ndarray, n_tokens: int) -> np.ndarray:
    """The order of the cuts (token, left, right) by the token's score, best first, then
    the pieces' ids: one int64 key (the score's rank among the distinct scores, then the
    ids) where they fit in 63 bits, else three sort keys (Gemma 3: 40 ms against 180)."""
    values, rank = np.unique(-scores, return_inverse=True)
    bits = max(int(n_tokens - 1).bit_length(), 1)
    if len(values).bit_length() + 2 * bits <= 63 and not np.isnan(values).any():
        key = ((rank[token].astype(np.int64) << (2 * bits)) | (left.astype(np.int64) << bits)
               | right.astype(np.int64))
        return np.argsort(key, kind="stable")
    return np.lexsort((right, left, -scores[token]))


def _merges(merges: list[str]) -> list[tuple[str, str]]:
    """GGUF's merges ("left right") as pairs, split at the first space: the tokenizer's BPE
    model is then made from them as Python objects (npu.load.tokenizer), not through
    `tokenizers`' JSON reader (SmolLM2's 49k merges: 30 ms against 70). Where each has one
    space, all are split at once."""
    joined = " ".join(merges)
    if (joined.count(" ") == 2 * len(merges) - 1
            and all(map(operator.contains, merges, repeat(" ")))):
        parts = joined.split(" ")
        return list(zip(parts[::2], parts[1::2]))
    return [tuple(m.split(" ", 1)) for m in merges]


def tokenizer_json(meta: dict[str, Any], path: str = "the GGUF file", *,
                   merges: bool = True) -> dict[str, Any]:
    """A tokenizer.json document for the `tokenizer.ggml.*` metadata `meta`. `merges`:
    False leaves a `llama` vocabulary's derived merges out (`spm_tokenizer` encodes it)."""
    model = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        raise ModelError(f"{path}: no tokenizer.ggml.tokens")
    types = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    if model == "gpt2":
        alphabet = set(byte_decoder())
        spell = {b: c for c, b in byte_decoder().items()}
        vocab = dict(zip(tokens, range(len(tokens))))
        # the usual file: every token distinct and in the alphabet; else token by token
        if len(vocab) != len(tokens) or not set("".join(tokens)) <= alphabet:
            vocab = {}
            for i, t in enumerate(tokens):
                if not set(t) <= alphabet:  # stored as text: spell its bytes in the alphabet
                    t = "".join(spell[b] for b in t.encode("utf-8"))
                vocab.setdefault(t, i)
        pairs = _merges(meta.get("tokenizer.ggml.merges") or [])
        # a control token outside the byte alphabet is a converter's mislabel: not added
        added = _added(tokens, types, lambda t: set(t) <= alphabet)
        return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
                "normalizer": None, "pre_tokenizer": _byte_level_pre(meta.get("tokenizer.ggml.pre")),
                "post_processor": None,
                "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                            "use_regex": True},
                "model": {"type": "BPE", "dropout": None, "unk_token": None,
                          "continuing_subword_prefix": None, "end_of_word_suffix": None,
                          "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                          "vocab": vocab, "merges": pairs}}
    if model == "llama":
        scores = list(meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens))
        pairs = (_merges(meta["tokenizer.ggml.merges"]) if meta.get("tokenizer.ggml.merges")
                 else _spm_merges(tokens, scores) if merges else [])
        unk = meta.get("tokenizer.ggml.unknown_token_id")
        prefix = meta.get("tokenizer.ggml.add_space_prefix", True)
        normalizer = [{"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]
        if prefix:
            normalizer.insert(0, {"type": "Prepend", "prepend": "\u2581"})
        decoder = [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                   {"type": "ByteFallback"}, {"type": "Fuse"}]
        if prefix:
            decoder.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
        return {"version": "1.0", "truncation": None, "padding": None,
                "added_tokens": _added(tokens, types),
                "normalizer": {"type": "Sequence", "normalizers": normalizer},
                "pre_tokenizer": None, "post_processor": None,
                "decoder": {"type": "Sequence", "decoders": decoder},
                "model": {"type": "BPE", "dropout": None,
                          "unk_token": tokens[unk] if unk is not None else None,
                          "continuing_subword_prefix": None, "end_of_word_suffix": None,
                          "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                          "vocab": dict(zip(tokens, range(len(tokens)))), "merges": pairs}}
    if model == "bert":
        return _wordpiece(meta, tokens, types, path)
    if model == "t5":
        return _unigram(meta, tokens, types)
    raise ModelError(f"{path}: tokenizer model {model!r} is not supported (supported: "
                     f"{', '.join(TOKENIZER_MODELS)})")


def _wordpiece_piece(token: str) -> str:
    """A GGUF "phantom space" token as WordPiece spells it."""
    if token.startswith("\u2581"):
        return token[1:]
    if token.startswith("[") and token.endswith("]"):
        return token
    return "##" + token


def _wordpiece(meta: dict[str, Any], tokens: list[str], types: list[int],
               path: str) -> dict[str, Any]:
    """A BERT tokenizer.json document built with `tokenizers`' own WordPiece model,
    BertNormalizer, BertPreTokenizer and TemplateProcessing."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from tokenizers.processors import TemplateProcessing

    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(_wordpiece_piece(t), i)
    # the pieces as tokens[] spells them after undoing the phantom space (specials unchanged)
    pieces = {i: p for p, i in vocab.items()}

    def token(key: str, default: str) -> str | None:
        i = meta.get(f"tokenizer.ggml.{key}")
        if isinstance(i, int) and i in pieces:
            return pieces[i]
        return default if default in vocab else None

    unk = token("unknown_token_id", "[UNK]")
    cls, sep = token("bos_token_id", "[CLS]"), token("seperator_token_id", "[SEP]")
    sep = sep or token("eos_token_id", "[SEP]")
    if unk is None or cls is None or sep is None:
        raise ModelError(f"{path}: a bert tokenizer needs its [UNK], [CLS] and [SEP] tokens")
    tok = Tokenizer(models.WordPiece(vocab, unk_token=unk, continuing_subword_prefix="##",
                                     max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                strip_accents=None, lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    specials = [pieces[i] for i, kind in enumerate(types) if kind == CONTROL and i in pieces]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in dict.fromkeys([unk, cls, sep, *specials])])
    first = [cls] if meta.get("tokenizer.ggml.add_bos_token", True) else []
    last = [sep] if meta.get("tokenizer.ggml.add_sep_token",
                             meta.get("tokenizer.ggml.add_eos_token", True)) else []
    tok.post_processor = TemplateProcessing(
        single=" ".join([*first, "$A:0", *last]),
        pair=" ".join([*first, "$A:0", *last, "$B:1", *[f"{t}:1" for t in last]]),
        special_tokens=[(t, vocab[t]) for t in dict.fromkeys([*first, *last])])
    return json.loads(tok.to_str())


def _unigram(meta: dict[str, Any], tokens: list[str], types: list[int]) -> dict[str, Any]:
    """A SentencePiece Unigram tokenizer.json document that tokenizes as llama.cpp's UGM
    tokenizer (src/llama-vocab.cpp) does:

    - normalizer: the file's `precompiled_charsmap` (SentencePiece's, `tokenizers`'
      Precompiled; none without one, as llama.cpp), then its whitespace rule: with
      `remove_extra_whitespaces` every run of non-spaces gets one "\u2581" before it and the
      spaces go (leading, trailing, repeated); without, each space becomes "\u2581" and, with
      `add_space_prefix`, one more goes in front. Only " " counts as a space, after the
      charsmap (which maps tabs and newlines to it in XLM-RoBERTa's nmt_nfkc).
    - model: Unigram over every token with its score, unknown runs fused into one unknown
      token (llama.cpp's Viterbi over the whole text; a piece never holds an inner "\u2581",
      so this is `tokenizers`' per-text Viterbi). No byte fallback (llama.cpp has none).
    - added tokens: control and unknown tokens special, user-defined ones plain.
    - post-processor: BOS text EOS and, for a pair, BOS a EOS SEP b EOS as llama-server
      builds a rerank input (XLM-RoBERTa: <s> a </s></s> b </s>), from `add_bos_token`,
      `add_eos_token`, `add_sep_token` (llama.cpp's UGM defaults: no BOS, EOS, no SEP).
    A vocabulary of 250,000 tokens (bge-m3's size) takes about 0.1 s here, and about 0.8 s
    more in `tokenizers` (its Unigram model builds a trie of every piece).
    """
    import base64

    n = len(tokens)
    scores = np.zeros(n, dtype=np.float64)
    given = meta.get("tokenizer.ggml.scores") or []
    scores[:min(n, len(given))] = np.asarray(given[:n], dtype=np.float64)
    kinds = np.ones(n, dtype=np.int64)
    kinds[:min(n, len(types))] = np.asarray(types[:n], dtype=np.int64)
    normal = kinds == NORMAL
    # llama.cpp scores an unknown piece at the lowest normal token's score less 10, where
    # `tokenizers` takes the lowest of all: no other token is scored below that lowest one
    # (the converter's [PAD] fillers hold -10000)
    if normal.any():
        scores = np.where(normal, scores, np.maximum(scores, scores[normal].min()))
    unk = meta.get("tokenizer.ggml.unknown_token_id")
    if not (isinstance(unk, int) and 0 <= unk < n):
        found = np.flatnonzero(kinds == UNKNOWN)
        unk = int(found[0]) if len(found) else (2 if n > 2 else None)  # llama.cpp's default
    space = "\u2581"
    rules: list[dict[str, Any]] = []
    charsmap = meta.get("tokenizer.ggml.precompiled_charsmap")
    if charsmap is not None and len(charsmap):
        data = bytes(np.asarray(charsmap, dtype=np.int64).astype(np.uint8))
        rules.append({"type": "Precompiled",
                      "precompiled_charsmap": base64.b64encode(data).decode("ascii")})
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", False))
    if meta.get("tokenizer.ggml.remove_extra_whitespaces", False):
        rules += [{"type": "Replace", "pattern": {"Regex": " +"}, "content": " "},
                  {"type": "Replace", "pattern": {"Regex": "\\A | \\z"}, "content": ""},
                  {"type": "Prepend", "prepend": space}]
    elif prefix:
        rules.append({"type": "Prepend", "prepend": space})
    rules.append({"type": "Replace", "pattern": {"String": " "}, "content": space})

    def special(key: str, default: int | None) -> int | None:
        i = meta.get(f"tokenizer.ggml.{key}", default)
        return i if isinstance(i, int) and 0 <= i < n else None

    bos, eos = special("bos_token_id", None), special("eos_token_id", 1)
    sep = special("seperator_token_id", None)
    first = [bos] if bos is not None and meta.get("tokenizer.ggml.add_bos_token", False) else []
    last = [eos] if eos is not None and meta.get("tokenizer.ggml.add_eos_token", True) else []
    middle = [sep] if sep is not None and meta.get("tokenizer.ggml.add_sep_token", False) else []

    def piece(i: int) -> dict[str, Any]:
        return {"SpecialToken": {"id": tokens[i], "type_id": 0}}

    text_a = {"Sequence": {"id": "A", "type_id": 0}}
    text_b = {"Sequence": {"id": "B", "type_id": 0}}
    used = dict.fromkeys([*first, *last, *middle])
    post = {"type": "TemplateProcessing",
            "single": [*map(piece, first), text_a, *map(piece, last)],
            "pair": [*map(piece, first), text_a, *map(piece, last), *map(piece, middle), text_b,
                     *map(piece, last)],
            "special_tokens": {tokens[i]: {"id": tokens[i], "ids": [i], "tokens": [tokens[i]]}
                               for i in used}}
    decoder_scheme = "always" if prefix or meta.get("tokenizer.ggml.remove_extra_whitespaces") \
        else "never"
    return {"version": "1.0", "truncation": None, "padding": None,
            "added_tokens": _added(tokens, types, unknown=True),
            "normalizer": {"type": "Sequence", "normalizers": rules},
            "pre_tokenizer": None, "post_processor": post,
            "decoder": {"type": "Metaspace", "replacement": space,
                        "prepend_scheme": decoder_scheme, "split": True},
            "model": {"type": "Unigram", "unk_id": unk, "byte_fallback": False,
                      "vocab": list(zip(tokens, scores.tolist()))}}
