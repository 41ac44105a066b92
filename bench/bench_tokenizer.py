"""A GGUF SentencePiece vocabulary's tokenizer: ours in C (npu/load/spm.py) against the
`tokenizers` BPE model the same document describes, side by side in one run.

    .venv/bin/python bench/bench_tokenizer.py [--quick] [--rounds N] [gemma3-270m | FILE.gguf]

Without a file: a vocabulary of 32,000 pieces cut from this repository's README (every
piece of 1-8 characters of its words, the most frequent first, scored by rank; the 256
byte pieces and a few control tokens), made in memory. `gemma3-270m`: the real Gemma 3 270M
file (262,144 tokens; see bench_load.py). `--quick`: 4,000 pieces, one round.

Printed, each the median of the rounds (the sides taking turns): the time to build each
tokenizer from the metadata (ours: the merges' ids, the C tables, the document without
merges; theirs: the merges as text, `tokenizers`' BPE model), the time to encode the texts
(the README in pieces, random mixes of the vocabulary's own pieces, whitespace runs and
special tokens), and how many texts (and decoded id lists) came out the same on both sides:
every one must.
"""

from __future__ import annotations

import argparse
import collections
import random
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def synthetic_meta(pieces: int) -> dict:
    """A `llama` vocabulary of `pieces` pieces cut from the README's words."""
    words = re.findall(r"\S+", (ROOT / "README.md").read_text(encoding="utf-8"))
    counts: collections.Counter = collections.Counter()
    for w in words:
        w = "\u2581" + w
        for i in range(len(w)):
            for j in range(i + 1, min(len(w), i + 8) + 1):
                counts[w[i:j]] += 1
    chars = sorted({c for w in counts for c in w})
    control = ["<unk>", "<s>", "</s>", "<start_of_turn>", "<end_of_turn>"]
    tokens = control + [f"<0x{b:02X}>" for b in range(256)] + chars
    seen = set(tokens)
    for piece, _ in counts.most_common():
        if len(tokens) >= pieces:
            break
        if piece not in seen:
            seen.add(piece)
            tokens.append(piece)
    types = [3] * len(control) + [6] * 256 + [1] * (len(tokens) - len(control) - 256)
    types[0] = 2
    scores = [0.0] * (len(control) + 256) + [-float(i) for i in range(len(tokens) - len(control) - 256)]
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.scores": scores,
            "tokenizer.ggml.unknown_token_id": 0, "tokenizer.ggml.bos_token_id": 1,
            "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.add_space_prefix": False}


def file_meta(spec: str) -> dict:
    from bench.bench_load import model_path
    from npu.load.gguf_header import read_header

    return read_header(model_path(spec)).meta


def texts(meta: dict, n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    tokens = meta["tokenizer.ggml.tokens"]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    out = [readme[i:i + 2000] for i in range(0, len(readme), 2000)]
    extra = [" ", "  ", "\n", "\n\n", "\t", "<start_of_turn>", "é", "日本", "🙂", "\x00"]
    for _ in range(n):
        out.append("".join(rng.choice(tokens) if rng.random() < 0.5 else rng.choice(extra)
                           for _ in range(rng.randint(0, 60))))
    return out


def build(meta: dict, ours: bool):
    from npu.load.gguf_tokenizer import spm_tokenizer, tokenizer_json
    from npu.load.tokenizer import Tokenizer

    start = time.perf_counter()
    if ours:
        spm = spm_tokenizer(meta)
        if spm is None:
            raise SystemExit("no C compiler here: the C encoder cannot be built")
        tok = Tokenizer(tokenizer_json(meta, merges=False), spm=spm)
    else:
        tok = Tokenizer(tokenizer_json(meta))
    return tok, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file", nargs="?", help="gemma3-270m or a .gguf path (default: made here)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rounds = 1 if args.quick else args.rounds
    if args.file:
        meta, what = file_meta(args.file), args.file
    else:
        n = 4000 if args.quick else 32000
        meta, what = synthetic_meta(n), f"{n:,} pieces cut from the README"
    sample = texts(meta, 200 if args.quick else 3000)
    print(f"{what}: {len(meta['tokenizer.ggml.tokens']):,} tokens; {len(sample):,} texts, "
          f"{sum(map(len, sample)):,} characters; {rounds} round(s), the sides taking turns")
    times: dict[str, list[float]] = {"ours build": [], "theirs build": [], "ours encode": [],
                                     "theirs encode": []}
    same = same_text = total = 0
    rng = random.Random(1)
    for r in range(rounds):
        built = {}
        for side in (("ours", "theirs") if r % 2 == 0 else ("theirs", "ours")):
            tok, seconds = build(meta, side == "ours")
            built[side] = tok
            times[f"{side} build"].append(seconds)
            start = time.perf_counter()
            ids = [tok.encode(t) for t in sample]
            times[f"{side} encode"].append(time.perf_counter() - start)
            built[side + " ids"] = ids
        same += sum(a == b for a, b in zip(built["ours ids"], built["theirs ids"]))
        size = built["ours"].size
        for _ in range(len(sample)):
            ids = [rng.randrange(size + 2) for _ in range(rng.randint(0, 24))]
            skip = rng.random() < 0.5
            same_text += built["ours"].decode(ids, skip_special_tokens=skip) == \
                built["theirs"].decode(ids, skip_special_tokens=skip)
        total += len(sample)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"  build   ours {med['ours build']:.3f} s   tokenizers {med['theirs build']:.3f} s"
          f"   ratio ours/tokenizers {med['ours build'] / med['theirs build']:.2f}")
    print(f"  encode  ours {med['ours encode']:.3f} s   tokenizers {med['theirs encode']:.3f} s"
          f"   ratio ours/tokenizers {med['ours encode'] / med['theirs encode']:.2f}")
    print(f"  the same ids: {same:,} of {total:,} texts; the same text: {same_text:,} of "
          f"{total:,} id lists decoded (target: all)")
    if same != total or same_text != total:
        raise SystemExit("ours and tokenizers differ")


if __name__ == "__main__":
    main()
