"""SentencePiece vocabularies in C (npu/engine/cpu_spm.c, built into the kernels' library).

A GGUF `llama` tokenizer (tokens and scores, no merges) is described to `tokenizers` as a
BPE model whose merges the scores imply (npu/load/gguf_tokenizer.py). For Gemma 3's 262,144
tokens that model took 0.6 s to build and its 515k merges 0.35 s more as Python objects:
most of the model's load. `SpmTokenizer` encodes as that `tokenizers` tokenizer does (the
same ids for every text: tests/npu/load/test_spm.py) and decodes through the same decoder
steps, from the tokens and the merges as id arrays; `spm_pairs` finds those merges.

Both return None where the kernels cannot be built; the caller keeps `tokenizers` then.
"""

from __future__ import annotations

import ctypes
import re
import weakref
from functools import cache

import numpy as np

# `tokenizers`' ByteFallback decoder: a token of 6 bytes "<0x" + 2 + ">" whose middle Rust's
# u8::from_str_radix(.., 16) reads (which takes a leading "+")
_BYTE = re.compile(r"<0x(\+[0-9A-Fa-f]|[0-9A-Fa-f]{2})>")
_SPACE = "\u2581"


@cache
def _lib() -> ctypes.CDLL | None:
    from npu.engine.cpu_kernels import kernels_or_none

    lib = kernels_or_none()
    if lib is None:
        return None
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.fc_spm_pairs.restype = i64
    lib.fc_spm_pairs.argtypes = [ctypes.c_char_p, i64, i64, p, p, p, i64]
    lib.fc_spm_new.restype = p
    lib.fc_spm_new.argtypes = [ctypes.c_char_p, i64, i64, p, p, p, i64, p, i64,
                               ctypes.c_int32, ctypes.c_int]
    lib.fc_spm_encode.restype = i64
    lib.fc_spm_encode.argtypes = [p, ctypes.c_char_p, i64, p, i64]
    lib.fc_spm_free.restype = None
    lib.fc_spm_free.argtypes = [p]
    return lib


def joined(tokens: list[str]) -> bytes | None:
    """The tokens' UTF-8 joined by NULs, as `spm_pairs` and `SpmTokenizer.build` read them
    (made once, given to both); None where a token holds a NUL."""
    text = "\0".join(tokens)
    return text.encode("utf-8") if text.count("\0") == len(tokens) - 1 else None


def spm_pairs(tokens: list[str], data: bytes | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Every cut of a token into two tokens (`fc_spm_pairs`): int32 arrays of the token's
    id, the left part's and the right part's, in token then cut order (a text several ids
    spell: the last); None without the kernels or where a token holds a NUL. `data`: the
    tokens `joined` (made here if not given)."""
    lib = _lib()
    if lib is None or not tokens:
        return None
    data = joined(tokens) if data is None else data
    if data is None:
        return None
    cap = len(data)  # a cut per byte at most
    out = np.empty((3, max(cap, 1)), dtype=np.int32)
    n = lib.fc_spm_pairs(data, len(data), len(tokens), out[0].ctypes.data,
                         out[1].ctypes.data, out[2].ctypes.data, cap)
    if n < 0:
        return None
    return out[0, :n], out[1, :n], out[2, :n]


class SpmTokenizer:
    """Encodes and decodes as `tokenizers` does with the document gguf_tokenizer writes for
    a `llama` vocabulary: its added tokens, its normalizer (U+2581 prepended where
    `prefix`, spaces to U+2581), BPE with byte fallback and fused UNK, and its decoder
    (U+2581 to a space, byte pieces joined, the first space dropped where `prefix`).

    Made by `build`; the C encoder is freed with the object.
    """

    def __init__(self, lib: ctypes.CDLL, handle: int, tokens: list[str],
                 added: list[tuple[int, bool]], prefix: bool) -> None:
        self._lib, self._handle = lib, handle
        self._tokens, self._prefix = tokens, prefix
        self._special = {tokens[i] for i, special in added if special}
        self._pieces: list[str | None] | None = None
        # freed with the object, not at exit (a daemon thread may still be encoding)
        weakref.finalize(self, lib.fc_spm_free, handle).atexit = False

    @classmethod
    def build(cls, tokens: list[str], merges: tuple[np.ndarray, np.ndarray, np.ndarray],
              added: list[tuple[int, bool]], *, unk: int | None, prefix: bool,
              data: bytes | None = None) -> SpmTokenizer | None:
        """`merges`: (left, right, token) id arrays in rank order; `added`: the added
        tokens as (id, special), their text the token's (each encodes as its text's last
        id, as `tokenizers` gives it). None without the kernels, or for
        what the encoder does not take (a NUL in a token, an empty or repeated added
        token): `tokenizers` keeps those. `data`: the tokens `joined` (made here if not
        given)."""
        lib = _lib()
        if lib is None or not tokens:
            return None
        data = joined(tokens) if data is None else data
        texts = [tokens[i] for i, _ in added]
        if data is None or "" in texts or len(set(texts)) != len(texts):
            return None
        left, right, token = (np.ascontiguousarray(a, dtype=np.int32) for a in merges)
        ids = np.array([i for i, _ in added] or [0], dtype=np.int32)
        handle = lib.fc_spm_new(data, len(data), len(tokens), left.ctypes.data,
                                right.ctypes.data, token.ctypes.data, len(left), ids.ctypes.data,
                                len(added), -1 if unk is None else unk, int(prefix))
        return cls(lib, handle, tokens, added, prefix) if handle else None

    def encode(self, text: str) -> list[int]:
        """The ids of `text` (added tokens' text becomes those tokens)."""
        data = text.encode("utf-8")
        out = np.empty(3 + 4 * len(data), dtype=np.int32)
        n = self._lib.fc_spm_encode(self._handle, data, len(data), out.ctypes.data, len(out))
        if n < 0:
            raise MemoryError("no memory to encode the text")
        return out[:n].tolist()

    def decode(self, ids: list[int], *, skip_special_tokens: bool = True) -> str:
        pieces = self._pieces_by_id()
        out: list[str] = []
        held = bytearray()  # a run of byte pieces
        for i in ids:
            piece = pieces[i] if 0 <= i < len(pieces) else None
            if piece is None or (skip_special_tokens and piece in self._special):
                continue
            piece = piece.replace(_SPACE, " ")
            byte = _BYTE.fullmatch(piece)
            if byte:
                held.append(int(byte.group(1), 16))
                continue
            self._flush(held, out)
            out.append(piece)
        self._flush(held, out)
        text = "".join(out)
        return text[1:] if self._prefix and text.startswith(" ") else text

    @staticmethod
    def _flush(held: bytearray, out: list[str]) -> None:
        if held:
            try:
                out.append(held.decode("utf-8"))
            except UnicodeDecodeError:
                out.append("\ufffd" * len(held))
            held.clear()

    def _pieces_by_id(self) -> list[str | None]:
        """Each id's text as `tokenizers` reads it back: where the id is its text's last
        (an added token's too: `tokenizers` gives it its text's id in the vocabulary); an
        earlier id of a repeated text reads back as nothing."""
        if self._pieces is None:
            pieces: list[str | None] = [None] * len(self._tokens)
            for text, i in dict(zip(self._tokens, range(len(self._tokens)))).items():
                pieces[i] = text
            self._pieces = pieces
        return self._pieces
