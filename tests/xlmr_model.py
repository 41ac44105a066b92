"""A small random XLM-RoBERTa (XLMRobertaModel, or XLMRobertaForSequenceClassification with
one label) as a Hugging Face directory, with a SentencePiece Unigram vocabulary trained here
and transformers' own XLMRobertaTokenizer, and the same model written as llama.cpp's
converter writes an XLM-RoBERTa GGUF (arch `bert`, tokenizer model `t5`: the vocabulary in
the tokenizer's id order with its scores and token types, `add_space_prefix`,
`remove_extra_whitespaces`, the precompiled charsmap, <s> ... </s> flags; the position table
without its first pad_token_id + 1 rows; a reranker's head as cls / cls.output)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np

from npu.load.tiny import DATA
from tests.bert_model import _GGUF_LAYER, _GGUF_NAMES, GGUF_POOLING, add_encoder_header

SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]  # XLM-RoBERTa's first ids; <mask> is the last
DIMS = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 128}
CONTEXT = 64
# A SentencePiece precompiled charsmap (a double array and its replacements), made by
# sentencepiece's trainer from a normalization_rule_tsv of a few rules, not nmt_nfkc's 240 kB:
# tab, newline, no-break and ideographic spaces to " ", full-width A-Z a-z 0-9 to ASCII,
# U+2160 (roman numeral one) to "I", U+FB01 (the fi ligature) to "fi".
CHARSMAP = base64.b64decode(
    "AAQAAAAgAAAJCQAACgUAAAAAAICgHQAAhYwCAKAFAAAmAACAgAQCAIApAACBGQAArAACAFYAAIACAACABAAA"
    "gAYAAICReQAAkHEAAJM5AACScQAAlSkAAJQhAACX3QAAliEAAJmRAACYjQAAvewDALxoAgAIAACACgAAgAwA"
    "AIAOAACAoXUAABAAAICjdQAAonUAAKWVAQCklQEAp5UBAKaVAQCpvQAAqLUBAKuxAQCquQEArZEBAKypAQCv"
    "kQEArpkBALHxAQCw6QEAs/EBALL5AQC1kQEAtOkBALeRAQC2mQEAubEBALipAQASAACAurkBABQAAIAWAACA"
    "GAAAgBoAAIAcAACAHgAAgCAAAIAiAACAJAAAgCgAAIAqAACALAAAgC4AAIAwAACAMgAAgDQAAIA2AACAOAAA"
    "gDoAAIA8AACAPgAAgEAAAIBCAACARAAAgEYAAIBIAACASgAAgEwAAIBOAACAUAAAgFIAAIBUAACAWQAAgFsA"
    "AIBdAACAXwAAgIHZAABhAACAg+kAAILRAACF+QAAhPEAAIfpAACG8QAAidkAAIjRAACLLQAAitEAAI1BAACM"
    "XQAAj0EAAI5JAACRyQMAkDkAAJPZAwCSwQMAlckDAJTBAwCX8QMAlsEDAJnVAwCY1QMAYwAAgJrVAwBlAACA"
    "ZwAAgGkAAIBrAACAgQAAAIAAAABtAACAbwAAgHEAAIBzAACAdQAAgHcAAICJAAAAiAAAAHkAAICKAAAAewAA"
    "gH0AAIB/AACAjgAAAJEAAACQAAAAkwAAAJIAAACVAAAAlAAAAJcAAACWAAAAmQAAAJgAAACbAAAAmgAAAJ0A"
    "AACcAAAAnwAAAJ4AAAChAAAAoAAAAKMAAACiAAAApQAAAKQAAACnAAAApgAAAKkAAACoAAAAqwAAAKoAAACt"
    "AAAArAAAAK8AAACuAAAAsQAAALAAAACzAAAAsgAAALUAAAC0AAAAtwAAALYAAAC5AAAAuAAAALsAAAC6AAAA"
    "vQAAALwAAAC/AAAAvgAAAMEAAADAAAAAwwAAAMIAAADFAAAAxAAAAMcAAADGAAAAyQAAAMgAAADCuAEAygAA"
    "AM0AAADMAAAAzwAAAM4AAADRAAAA0AAAANMAAADSAAAA1QAAANQAAADXAAAA1gAAANkAAADYAAAA2wAAANoA"
    "AADdAAAA3AAAAN8AAADeAAAA4QAAAOAAAADjAAAA4gAAAOUAAADkAAAA5wAAAO8AAQDpAAAA6AAAAOKoAQDj"
    "jAEA7QAAAOwAAADvAAAA7gAAAPEAAADwAAAA8wAAAPIAAAD1AAAA9AAAAPcAAAD2AAAA+QAAAPgAAAD7AAAA"
    "+gAAAP0AAAD8AAAA/wAAAP4AAAAgADAAMQAyADMANAA1ADYANwA4ADkAQQBCAEMARABFAEYARwBIAEkASgBL"
    "AEwATQBOAE8AUABRAFIAUwBUAFUAVgBXAFgAWQBaAGEAYgBjAGQAZQBmAGZpAGcAaABpAGoAawBsAG0AbgBv"
    "AHAAcQByAHMAdAB1AHYAdwB4AHkAegA="
)
MULTILINGUAL = """Café naïve résumé à l'école, über Straße. Ça va? Sí, señor; ¿qué tal?
東京は日本の首都です。北京欢迎你。서울은 한국의 수도입니다.
Москва — столица России. Αθήνα. مرحبا بالعالم. नमस्ते दुनिया.
emoji 🙂 🚀 ok ✓ ½ ™ numbers 12345 67890 3.14 and code: x = f(y) + 1;"""


def train_vocab(size: int = 400) -> list[tuple[str, float]]:
    """XLM-RoBERTa's specials, then pieces and their log probabilities learned by
    `tokenizers`' UnigramTrainer from flm-tiny's corpus and a few lines of other scripts,
    then <mask> (as the fairseq-ordered vocabulary of XLM-RoBERTa's tokenizer.json)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    trainer = trainers.UnigramTrainer(vocab_size=size, special_tokens=SPECIALS,
                                      unk_token="<unk>", show_progress=False)
    corpus = (DATA / "tiny_corpus.txt").read_text(encoding="utf-8").splitlines()
    tok.train_from_iterator(corpus[:2000] + MULTILINGUAL.splitlines() * 20, trainer=trainer)
    vocab = json.loads(tok.to_str())["model"]["vocab"]
    return [(p, 0.0 if p in SPECIALS else float(s)) for p, s in vocab] + [("<mask>", 0.0)]


def xlmr_tokenizer(vocab: list[tuple[str, float]], charsmap: bytes | None = CHARSMAP):
    """transformers' XLMRobertaTokenizer over `vocab` (Precompiled normalizer where
    `charsmap`, WhitespaceSplit and Metaspace, <s> a </s></s> b </s>)."""
    from transformers import XLMRobertaTokenizer

    return XLMRobertaTokenizer(vocab=vocab, _spm_precompiled_charsmap=charsmap)


def build_xlmr(folder: Path, *, reranker: bool = False, seed: int = 0,
               charsmap: bytes | None = CHARSMAP) -> Path:
    """Write a random XLMRobertaModel (`reranker`: XLMRobertaForSequenceClassification, one
    label) and its tokenizer into `folder` (created); return it."""
    import torch
    from transformers import (
        XLMRobertaConfig,
        XLMRobertaForSequenceClassification,
        XLMRobertaModel,
    )

    folder.mkdir(parents=True, exist_ok=True)
    tok = xlmr_tokenizer(train_vocab(), charsmap)
    config = XLMRobertaConfig(vocab_size=len(tok), max_position_embeddings=CONTEXT + 2,
                              type_vocab_size=1, pad_token_id=1, bos_token_id=0,
                              eos_token_id=2, layer_norm_eps=1e-5, num_labels=1, **DIMS)
    torch.manual_seed(seed)
    model = (XLMRobertaForSequenceClassification if reranker else XLMRobertaModel)(config)
    with torch.no_grad():  # weights of some size, so that the outputs differ per token
        for name, p in model.named_parameters():
            if p.ndim == 2:
                p.normal_(0, (1.0 if "embeddings" in name else 1.5) / p.shape[-1] ** 0.5)
            elif "LayerNorm.weight" in name:
                p.normal_(1.0, 0.1)
            else:
                p.normal_(0, 0.1)
    model.save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    return folder


def write_xlmr_gguf(folder: Path, path: Path, *, pooling: str = "mean",
                    charsmap: bool = True) -> Path:
    """`build_xlmr`'s model as llama.cpp's converter writes it (_xlmroberta_set_vocab from a
    tokenizer.json, gguf's SpecialVocab for the ids and flags); F32 tensors. `pooling`: the
    file's pooling_type name ("rank" for a reranker). `charsmap`: False leaves the
    precompiled charsmap out."""
    from gguf import GGUFWriter
    from safetensors.numpy import load_file
    from transformers import AutoTokenizer

    cfg = json.loads((folder / "config.json").read_text())
    doc = json.loads((folder / "tokenizer.json").read_text())
    tok = AutoTokenizer.from_pretrained(str(folder))
    vocab = doc["model"]["vocab"]
    specials = set(tok.all_special_ids)
    added = set(tok.get_added_vocab().values())
    tokens = [p for p, _ in vocab]
    types = [2 if i == doc["model"]["unk_id"] else 3 if i in specials else 4 if i in added
             else 1 for i in range(len(tokens))]
    w = GGUFWriter(str(path), "bert")
    w.add_name("random-xlm-roberta")
    add_encoder_header(w, cfg, cfg["max_position_embeddings"] - cfg["pad_token_id"] - 1)
    w.add_uint32("bert.pooling_type", GGUF_POOLING[pooling])
    w.add_tokenizer_model("t5")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores([float(s) for _, s in vocab])
    w.add_token_types(types)
    w.add_add_space_prefix(True)
    w.add_token_type_count(cfg["type_vocab_size"])
    w.add_remove_extra_whitespaces(True)
    precompiled = (doc.get("normalizer") or {}).get("precompiled_charsmap")
    if charsmap and precompiled:
        w.add_precompiled_charsmap(base64.b64decode(precompiled))
    ids = {t: tok.convert_tokens_to_ids(t) for t in ("<s>", "</s>", "<unk>", "<pad>", "<mask>")}
    for key, t in (("bos", "<s>"), ("eos", "</s>"), ("unk", "<unk>"), ("sep", "</s>"),
                   ("pad", "<pad>"), ("mask", "<mask>")):  # gguf writes no cls id
        getattr(w, f"add_{key}_token_id")(ids[t])
    w.add_add_bos_token(True)
    w.add_add_eos_token(True)
    w.add_add_sep_token(True)
    offset = cfg["pad_token_id"] + 1
    for name, a in load_file(str(folder / "model.safetensors")).items():
        base, suffix = name.removeprefix("roberta.").rsplit(".", 1)
        if base.startswith("pooler.") or base == "embeddings.position_ids":
            continue
        if base == "embeddings.position_embeddings":
            a = a[offset:]  # positions start at pad_token_id + 1: the converter cuts the rest
        if base in ("classifier.dense", "classifier.out_proj"):
            gname = {"classifier.dense": "cls", "classifier.out_proj": "cls.output"}[base]
        elif base in _GGUF_NAMES:
            gname = _GGUF_NAMES[base]
        else:
            _, _, i, rest = base.split(".", 3)  # encoder.layer.{i}.rest
            gname = f"blk.{i}.{_GGUF_LAYER[rest]}"
        w.add_tensor(f"{gname}.{suffix}", np.ascontiguousarray(a, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
