"""Real vocabularies for constraint tests: the Qwen byte-level BPE in ../shared, or a small
BPE trained here with `tokenizers` (with every format's markers as added tokens)."""

from __future__ import annotations

import json
from functools import cache

from npu.load.tokenizer import byte_decoder
from tests.shared import FORMATS

MARKERS = [
    "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
    "<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", '<|"|>', "<|tool_response>",
    "<|tool_call_start|>", "<|tool_call_end|>", "<|start|>", "<|end|>", "<|message|>",
    "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>", "[TOOL_CALLS]", "[ARGS]",
    "[CALL_ID]", "<|python_tag|>",
]
STOPS = ["<|im_end|>", "<|endoftext|>", "<|return|>", "<|call|>", "<|tool_response>"]


def qwen_available() -> bool:
    return (FORMATS / "tokenizers" / "qwen3" / "vocab.json").exists()


@cache
def qwen_vocab() -> tuple[list[bytes], list[int]]:
    """The Qwen3 vocabulary as decoded bytes (151,669 entries) and its stop ids."""
    folder = FORMATS / "tokenizers" / "qwen3"
    dec = byte_decoder()
    table = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    vocab = [b""] * len(table)
    for token, i in table.items():
        vocab[i] = bytes(dec[c] for c in token)
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    added = config["added_tokens_decoder"]
    size = max(int(k) for k in added) + 1
    vocab += [b""] * (size - len(vocab))
    for k, v in added.items():
        vocab[int(k)] = v["content"].encode()
    # The formats this vocabulary does not have as single tokens still need their markers.
    for m in MARKERS:
        if m.encode() not in vocab:
            vocab.append(m.encode())
    stops = [vocab.index(s.encode()) for s in STOPS]
    return vocab, stops


CORPUS = (
    "The quick brown fox jumps over the lazy dog. Paris London Oslo weather city days "
    'metric true false null None True False {"name": "get_weather", "arguments": {}} '
    "call:get_weather{city:x} <function=f> <parameter=city> </parameter> </function> "
    "get_weather(city='Paris', days=3) 0123456789 -+.,:;'\"[](){}<>=/_\n\t "
) * 20


@cache
def small_vocab() -> tuple[list[bytes], list[int]]:
    """A byte-level BPE trained here (about 600 tokens) with every marker as one token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=MARKERS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([CORPUS], trainer)
    dec = byte_decoder()
    vocab: list[bytes] = []
    specials = set(MARKERS)
    for i in range(tok.get_vocab_size()):
        t = tok.id_to_token(i)
        vocab.append(t.encode() if t in specials else bytes(dec[c] for c in t))
    return vocab, [vocab.index(s.encode()) for s in STOPS]


def test_vocab() -> tuple[list[bytes], list[int]]:
    return qwen_vocab() if qwen_available() else small_vocab()
