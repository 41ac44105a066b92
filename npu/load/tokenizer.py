"""Tokenizer (over the `tokenizers` library), the decoded bytes of every token, and the
incremental Detokenizer that only ever emits complete UTF-8 and never re-emits text."""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from npu.errors import ModelError
from npu.load.fim import FimTokens, fim_tokens

if TYPE_CHECKING:
    from npu.load.spm import SpmTokenizer

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@cache
def byte_decoder() -> dict[str, int]:
    """GPT-2's printable-character alphabet for bytes, inverted."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _uses(node, kind: str) -> bool:
    if isinstance(node, dict):
        if node.get("type") == kind:
            return True
        return any(_uses(v, kind) for v in node.values())
    if isinstance(node, list):
        return any(_uses(v, kind) for v in node)
    return False


def _from_document(doc: dict):
    """A `tokenizers` tokenizer from a tokenizer.json document. msgspec writes the document
    3-4x faster than json (a 49k-token vocabulary: 7 ms against 30). A BPE model whose
    merges are pairs (a SentencePiece vocabulary's, Gemma 3's 262k tokens and 515k merges)
    is made from the Python objects themselves, the rest from the document without them:
    `tokenizers`' JSON reader took 1.2 s for Gemma 3's where this takes 0.55 s."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers.models import BPE

    model = doc.get("model") or {}
    merges, vocab = model.get("merges"), model.get("vocab")
    added = doc.get("added_tokens") or ()
    # an added token outside the vocabulary: its id is one the shell would not give
    if (model.get("type") != "BPE" or not isinstance(vocab, dict) or not merges
            or not all(isinstance(m, tuple) for m in merges)
            or not all(a.get("content") in vocab for a in added)):
        return HFTokenizer.from_str(msgspec.json.encode(doc).decode())
    # the added tokens' own entries kept: where a text is both an added token and in the
    # vocabulary under another id (Gemma 3's "\t"), `tokenizers` takes the model's id
    own = {a["content"]: vocab[a["content"]] for a in added}
    shell = {**doc, "model": {**model, "vocab": own, "merges": []}}
    tok = HFTokenizer.from_str(msgspec.json.encode(shell).decode())
    options = {k: model[k] for k in ("dropout", "unk_token", "continuing_subword_prefix",
                                      "end_of_word_suffix", "fuse_unk", "byte_fallback",
                                      "ignore_merges") if model.get(k) is not None}
    tok.model = BPE(vocab, merges, **options)
    return tok


class Tokenizer:
    """A model's tokenizer.

    Args:
        path: tokenizer.json, or its document (a GGUF file's tokenizer, built in memory).
        bos_token / eos_token / unk_token / pad_token: from tokenizer_config.json.
        add_bos: prepend BOS when the template does not write it.
        add_eos: append EOS to an input to embed (tokenizer_config's `add_eos_token`, GGUF's
            `tokenizer.ggml.add_eos_token`: Qwen3-Embedding, whose last token is pooled).
        spm: what encodes and decodes instead of a `tokenizers` tokenizer built from the
            document (a GGUF SentencePiece vocabulary's, npu.load.spm; the document then
            without merges and post-processor).
        meta: a GGUF file's metadata, for the FIM token ids it names (`fim`).
    """

    def __init__(self, path: Path | dict, *, bos_token: str | None = None,
                 eos_token: str | None = None, unk_token: str | None = None,
                 pad_token: str | None = None, add_bos: bool = False, add_eos: bool = False,
                 spm: SpmTokenizer | None = None, meta: Mapping[str, Any] | None = None,
                 ) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        self._spm = spm
        try:
            if isinstance(path, dict):
                doc = path
                self._tok = _from_document(doc) if spm is None else None
            else:
                self._tok = HFTokenizer.from_file(str(path))
                # a file may save padding and truncation (sentence-transformers' fixed 128):
                # an input is never padded (a pad would be attended) nor cut silently here
                self._tok.no_padding()
                self._tok.no_truncation()
                doc = json.loads(path.read_text(encoding="utf-8"))
        except Exception as exc:
            where = "the GGUF tokenizer" if isinstance(path, dict) else path
            raise ModelError(f"{where}: cannot be read as a tokenizer.json ({exc})") from None
        self.bos_token, self.eos_token = bos_token, eos_token
        self.unk_token, self.pad_token = unk_token, pad_token
        self.add_bos, self.add_eos = add_bos, add_eos
        vocab = (doc.get("model") or {}).get("vocab") if isinstance(path, dict) else None
        if isinstance(vocab, list):  # a Unigram's [piece, score] pairs: later ids win, as there
            # (bge-m3's 250k: 0.08 s against get_vocab's 0.3)
            vocab = dict(zip((p for p, _ in vocab), range(len(vocab))))
        if isinstance(vocab, dict):  # built here (a GGUF file's): what get_vocab would copy
            # an added token's text names its own id (the metadata's BOS / EOS, the end of a
            # turn the model writes), though a file that has that text again later encodes
            # it as the later id (as `tokenizers` does); the vocabulary itself where no added
            # token is such (no copy of 262k entries); `_ids`: every id's text, for the table
            added = {a["content"]: a["id"] for a in doc.get("added_tokens") or []
                     if "content" in a and "id" in a}
            same = all(vocab.get(text) == i for text, i in added.items())
            self._vocab, self._ids = (vocab if same else {**vocab, **added}), vocab
            top = max(added.values(), default=0)  # an added id past the vocabulary's
        else:
            self._vocab = self._ids = self._tok.get_vocab(with_added_tokens=True)
            top = 0
        self.size = max(max(self._ids.values()), top) + 1
        # the parts read later (not the vocabulary and merges: tens of MB of Python objects)
        self._json = {"decoder": doc.get("decoder"), "added_tokens": doc.get("added_tokens")}
        self.byte_level = _uses(self._json.get("decoder"), "ByteLevel")
        decoder = self._json.get("decoder")
        self.strips_leading_space = _uses(decoder, "Strip") or (
            _uses(decoder, "Metaspace") and not self.byte_level)
        self.bos_id = self.id_of(bos_token) if bos_token else None
        self.eos_id = self.id_of(eos_token) if eos_token else None
        # the fill-in-the-middle tokens (None: the vocabulary has none)
        self.fim: FimTokens | None = fim_tokens(self.id_of, self.size, meta)

    def id_of(self, text: str) -> int | None:
        """The id of `text` when it is one token of the vocabulary."""
        return self._vocab.get(text)

    def is_token(self, text: str) -> bool:
        return text in self._vocab

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (special-token text becomes those tokens; no BOS added)."""
        if self._spm is not None:
            return self._spm.encode(text)
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_text(self, text: str) -> list[int]:
        """Token ids of `text` read as text only (llama.cpp's parse_special off: a file being
        edited may hold "<|endoftext|>" or "<|fim_middle|>"): an added token's spelling in
        it is encoded as its first character and the rest, never as that token."""
        pattern = self._added_spellings()
        ids: list[int] = []
        while text:
            found = pattern.search(text)
            if found is None:
                break
            ids += self.encode(text[:found.start()]) + self.encode(found.group()[0])
            text = found.group()[1:] + text[found.end():]
        return ids + self.encode(text) if text else ids

    def encode_plain(self, text: str) -> list[int]:
        """Token ids of `text` with the special tokens' text read as text (llama.cpp's
        `parse_special` off: its control tokens, the special added tokens here, are not
        matched; user-defined added tokens, `<think>`, still are). On a copy of the
        tokenizer made on first use (the flag is the tokenizer's, and another thread may be
        encoding). A SentencePiece vocabulary encoded by npu.load.spm reads as
        `encode_text` does (every added token's text as text)."""
        if self._spm is not None:
            return self.encode_text(text)
        plain = getattr(self, "_plain", None)
        if plain is None:
            from tokenizers import Tokenizer as HFTokenizer

            plain = HFTokenizer.from_str(self._tok.to_str())
            plain.encode_special_tokens = True
            self._plain = plain
        return plain.encode(text, add_special_tokens=False).ids

    def _added_spellings(self) -> re.Pattern:
        """A pattern of the added tokens' spellings of more than one character (longest
        first); one that never matches where there are none."""
        pattern = getattr(self, "_added_re", None)
        if pattern is None:
            texts = sorted({a["content"] for a in self._json["added_tokens"] or []
                            if len(a.get("content") or "") > 1}, key=len, reverse=True)
            pattern = self._added_re = re.compile(
                "|".join(map(re.escape, texts)) if texts else r"(?!x)x")
        return pattern

    def encode_for_embedding(self, text: str, *, room: int | None = None) -> list[int]:
        """Token ids of `text` with the special tokens the tokenizer's post-processor adds
        around one input ([CLS] ... [SEP] for BERT; none when it has no post-processor).
        `room`: the most ids to return; the text's own tokens are cut at the end to fit,
        the special tokens kept."""
        if self._spm is not None:  # no post-processor
            return self._spm.encode(text)[:room]
        enc = self._tok.encode(text, add_special_tokens=False)
        if room is not None:
            enc.truncate(max(0, room - self._tok.num_special_tokens_to_add(False)))
        return self._tok.post_process(enc).ids

    def encode_pairs(self, first: str, seconds: Sequence[str], *,
                     limit: int | None = None) -> list[tuple[list[int], list[int]]]:
        """Token ids and token types of `first` paired with each of `seconds` (a reranker's
        query and documents), with the special tokens the post-processor puts around a pair
        ([CLS] a [SEP] b [SEP] for BERT, b's tokens of type 1; <s> a </s></s> b </s> for
        XLM-RoBERTa); `first` is tokenized once. `limit`: a second text is cut at its end
        so that its pair has at most this many tokens (transformers' `only_second`
        truncation; `first` is never cut).

        Raises:
            ModelError: the tokenizer has no post-processor to pair texts with (a GGUF
                SentencePiece vocabulary's).
        """
        if self._spm is not None or self._tok.post_processor is None:
            raise ModelError("this model's tokenizer has no template for a pair of texts "
                             "(a post-processor): it cannot rerank")
        head = self._tok.encode(first, add_special_tokens=False)
        room = None if limit is None else max(
            0, limit - len(head.ids) - self._tok.num_special_tokens_to_add(True))
        out = []
        for text in seconds:
            second = self._tok.encode(text, add_special_tokens=False)
            if room is not None and len(second.ids) > room:
                second.truncate(room)
            pair = self._tok.post_process(head, second)
            out.append((pair.ids, pair.type_ids))
        return out

    def text_prefix(self, text: str, tokens: int) -> str:
        """The start of `text` that its first `tokens` tokens cover (their characters, as the
        tokenizer's offsets give them; a character split across tokens is kept whole only
        if all of its tokens are in): `text` cut at a token's end, never inside a character.
        """
        if tokens <= 0:
            return ""
        if self._spm is not None:  # no offsets: the decoded start (whole characters)
            ids = self._spm.encode(text)
            return text if tokens >= len(ids) else self._spm.decode(
                ids[:tokens], skip_special_tokens=False).rstrip("\ufffd")
        enc = self._tok.encode(text, add_special_tokens=False)
        if tokens >= len(enc.ids):
            return text
        start, end = enc.offsets[tokens - 1]
        if tokens < len(enc.ids) and enc.offsets[tokens] == (start, end):
            end = start  # the token after shares its character: that character goes
        return text[:end]

    def decode(self, ids: list[int], *, skip_special_tokens: bool = True) -> str:
        if self._spm is not None:
            return self._spm.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def spellings(self, ids: Sequence[int]) -> list[str]:
        """Each id's spelling in the vocabulary (`Ġworld` byte-level, `▁world` SentencePiece,
        `##ing` WordPiece; an added token's content), as transformers'
        `convert_ids_to_tokens` gives it; "" for an id the vocabulary does not have."""
        table = self.__dict__.get("_spellings")
        if table is None:
            table = [""] * self.size
            for piece, i in self._ids.items():
                if 0 <= i < self.size:
                    table[i] = piece
            for a in self._json["added_tokens"] or []:
                if 0 <= a.get("id", -1) < self.size:
                    table[a["id"]] = a["content"]
            self.__dict__["_spellings"] = table
        return [table[i] if 0 <= i < len(table) else "" for i in ids]

    def token_bytes(self, size: int | None = None) -> list[bytes]:
        """The bytes each token decodes to, padded with b"" to `size` (the logits width).

        BOS, UNK and PAD decode to b"" (never text); every other added token to its content.
        """
        table = self._table()
        return list(table) + [b""] * max(0, (size or 0) - len(table))

    def _table(self) -> tuple[bytes, ...]:
        """The unpadded table, built once (it loops over the whole vocabulary)."""
        cached = self.__dict__.get("_token_table")
        if cached is not None:
            return cached
        out = [b""] * self.size
        added = {a["id"]: a["content"] for a in self._json["added_tokens"] or []}
        blank = {t for t in (self.bos_token, self.unk_token, self.pad_token) if t}
        dec = byte_decoder()
        for i, content in added.items():  # by id: a text the vocabulary repeats has both
            if 0 <= i < len(out):
                out[i] = b"" if content in blank else content.encode("utf-8")
        for piece, i in self._ids.items():
            if i in added:
                continue
            if self.byte_level:
                try:
                    out[i] = bytes(dec[ch] for ch in piece)
                except KeyError:
                    out[i] = piece.encode("utf-8")
            else:
                m = _BYTE_PIECE.fullmatch(piece)
                out[i] = bytes([int(m.group(1), 16)]) if m else piece.replace(
                    "\u2581", " ").encode("utf-8")
        self._token_table = tuple(out)
        return self._token_table

    def detokenizer(self, *, at_start: bool = True) -> Detokenizer:
        """An incremental decoder for generated ids. `at_start`: the output starts the text
        (the prompt decodes to nothing), so a SentencePiece leading space is dropped as
        `decode` would."""
        return Detokenizer(self._table(), strip_first_space=at_start and
                           self.strips_leading_space)


class Detokenizer:
    """Turns token ids into text as they come: complete UTF-8 characters only."""

    def __init__(self, token_bytes: tuple[bytes, ...], *, strip_first_space: bool = False):
        self._bytes = token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._strip = strip_first_space

    def push(self, token: int) -> str:
        data = self._bytes[token] if 0 <= token < len(self._bytes) else b""
        text = self._decoder.decode(data)
        if self._strip and text:
            self._strip = False
            if text.startswith(" "):
                text = text[1:]
        return text

    def flush(self) -> str:
        """What is left at the end (an incomplete character becomes U+FFFD)."""
        return self._decoder.decode(b"", final=True)
