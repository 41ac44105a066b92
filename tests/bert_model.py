"""A small random BERT encoder (BertModel) as a Hugging Face directory, with a WordPiece
tokenizer.json built here and sentence-transformers' files (mean pooling by default), and
the same model written as llama.cpp's converter writes a `bert` GGUF: for the engine's tests
and the served app's embedding tests. `build_reranker`: a random cross-encoder
(BertForSequenceClassification or XLMRobertaForSequenceClassification, one label) from the
same encoder, for the rerank tests (its GGUF with llama.cpp's cls / cls.output head)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from npu.load.tiny import DATA

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# XLM-RoBERTa's, in its order (<pad> is 1: positions start at 2)
ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
DIMS = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 128, "max_position_embeddings": 128, "type_vocab_size": 2}
POOLING_KEYS = {"mean": "pooling_mode_mean_tokens", "cls": "pooling_mode_cls_token",
                "last": "pooling_mode_lasttoken", "max": "pooling_mode_max_tokens"}


def add_encoder_header(w, cfg: dict, context: int) -> None:
    """An encoder's shape in a GGUF header, as llama.cpp's converter writes a BERT's (`cfg`:
    its config.json; `context`: the positions it takes)."""
    w.add_context_length(context)
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_layer_norm_eps(cfg["layer_norm_eps"])
    w.add_causal_attention(False)


def _vocab(specials: list[str] = SPECIALS) -> dict[str, int]:
    """Specials, characters and their "##" continuations, common suffixes, then flm-tiny's
    corpus's most frequent words (deterministic: ties by the word)."""
    import re
    from collections import Counter

    text = (DATA / "tiny_corpus.txt").read_text(encoding="utf-8").lower()
    chars = sorted({c for c in text if not c.isspace()})
    words = Counter(w for w in re.findall(r"[a-z]+", text) if len(w) > 1)
    top = [w for w, _ in sorted(words.items(), key=lambda kv: (-kv[1], kv[0]))[:400]]
    pieces = [*specials, *chars, *("##" + c for c in chars),
              *("##" + s for s in ("s", "ed", "ing", "er", "ly", "es", "ion", "al")), *top]
    return {p: i for i, p in enumerate(dict.fromkeys(pieces))}


def _tokenizer(roberta: bool = False):
    """A lowercasing WordPiece tokenizer over `_vocab`, [CLS] ... [SEP] around a text
    (`roberta`: XLM-RoBERTa's specials and templates, <s> a </s></s> b </s> for a pair, every
    token of type 0)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from tokenizers.processors import TemplateProcessing

    specials = ROBERTA_SPECIALS if roberta else SPECIALS
    vocab = _vocab(specials)
    tok = Tokenizer(models.WordPiece(vocab, unk_token=specials[3] if roberta else "[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    if roberta:
        tok.post_processor = TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
            special_tokens=[("<s>", vocab["<s>"]), ("</s>", vocab["</s>"])])
    else:
        tok.post_processor = TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    return tok


def build_bert(folder: Path, *, pooling: str | None = "mean", seed: int = 0,
               nomic: bool = False, dims: dict | None = None) -> Path:
    """Write the model into `folder` (created) and return it. `pooling`: the
    sentence-transformers Pooling module's mode ("mean", "cls", ...; None: no
    sentence-transformers files, the plain BertModel). `nomic`: a NomicBertModel instead
    (nomic-embed-text's layout: fused Wqkv, rotary positions, SwiGLU, no biases in the
    layers' projections; its config in nomic's GPT-2 style keys). `dims`: sizes other than
    DIMS's (BERT-base's for the benchmark)."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer()
    tok.save(str(folder / "tokenizer.json"))
    vocab = tok.get_vocab_size(with_added_tokens=True)
    D = {**DIMS, **(dims or {})}
    H, I, L = D["hidden_size"], D["intermediate_size"], D["num_hidden_layers"]
    if nomic:
        config = {"architectures": ["NomicBertModel"], "model_type": "nomic_bert",
                  "vocab_size": vocab, "n_embd": H, "n_head": D["num_attention_heads"],
                  "n_layer": L, "n_inner": I, "n_positions": D["max_position_embeddings"],
                  "activation_function": "swiglu", "layer_norm_epsilon": 1e-12,
                  "rotary_emb_base": 1000, "rotary_emb_fraction": 1.0,
                  "rotary_emb_interleaved": False, "prenorm": False, "qkv_proj_bias": False,
                  "mlp_fc1_bias": False, "mlp_fc2_bias": False,
                  "type_vocab_size": D["type_vocab_size"]}
    else:
        config = {"architectures": ["BertModel"], "model_type": "bert", "vocab_size": vocab,
                  "hidden_act": "gelu", "layer_norm_eps": 1e-12, "pad_token_id": 0,
                  "position_embedding_type": "absolute", **D}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "BertTokenizer", "do_lower_case": True, "unk_token": "[UNK]",
        "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
        "mask_token": "[MASK]", "model_max_length": D["max_position_embeddings"]}))
    rng = np.random.default_rng(seed)

    def mat(*shape: int, scale: float | None = None) -> np.ndarray:
        s = shape[-1] ** -0.5 if scale is None else scale
        return (rng.standard_normal(shape) * s).astype(np.float32)

    def norm(name: str) -> None:
        w[name + ".weight"] = (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)
        w[name + ".bias"] = mat(H, scale=0.1)

    e = "embeddings."
    w = {e + "word_embeddings.weight": mat(vocab, H, scale=1.0),
         e + "token_type_embeddings.weight": mat(D["type_vocab_size"], H, scale=0.5)}
    if nomic:
        norm("emb_ln")
        for i in range(L):
            p = f"encoder.layers.{i}."
            w[p + "attn.Wqkv.weight"] = mat(3 * H, H, scale=2 * H ** -0.5)
            w[p + "attn.out_proj.weight"] = mat(H, H)
            norm(p + "norm1")
            w[p + "mlp.fc11.weight"], w[p + "mlp.fc12.weight"] = mat(I, H), mat(I, H)
            w[p + "mlp.fc2.weight"] = mat(H, I)
            norm(p + "norm2")
    else:
        w[e + "position_embeddings.weight"] = mat(D["max_position_embeddings"], H,
                                                  scale=0.5)
        norm(e + "LayerNorm")
        for i in range(L):
            p = f"encoder.layer.{i}."
            for n in ("query", "key", "value"):
                w[p + f"attention.self.{n}.weight"] = mat(H, H, scale=2 * H ** -0.5)
                w[p + f"attention.self.{n}.bias"] = mat(H, scale=0.1)
            w[p + "attention.output.dense.weight"] = mat(H, H)
            w[p + "attention.output.dense.bias"] = mat(H, scale=0.1)
            norm(p + "attention.output.LayerNorm")
            w[p + "intermediate.dense.weight"] = mat(I, H)
            w[p + "intermediate.dense.bias"] = mat(I, scale=0.1)
            w[p + "output.dense.weight"], w[p + "output.dense.bias"] = mat(H, I), mat(H,
                                                                                  scale=0.1)
            norm(p + "output.LayerNorm")
        w["pooler.dense.weight"], w["pooler.dense.bias"] = mat(H, H), mat(H, scale=0.1)
    save_file(w, str(folder / "model.safetensors"))
    if pooling is not None:
        _sentence_transformers(folder, pooling, H)
    return folder


def _sentence_transformers(folder: Path, pooling: str, width: int) -> None:
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": width,
        **{key: mode == pooling for mode, key in POOLING_KEYS.items()},
        "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
        "include_prompt": True}))
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize",
         "type": "sentence_transformers.models.Normalize"}]))


# Hugging Face BertModel names -> llama.cpp's (without .weight / .bias)
_GGUF_NAMES = {"embeddings.word_embeddings": "token_embd",
               "embeddings.position_embeddings": "position_embd",
               "embeddings.token_type_embeddings": "token_types",
               "embeddings.LayerNorm": "token_embd_norm", "emb_ln": "token_embd_norm"}
_GGUF_LAYER = {"attention.self.query": "attn_q", "attention.self.key": "attn_k",
               "attention.self.value": "attn_v", "attention.output.dense": "attn_output",
               "attention.output.LayerNorm": "attn_output_norm",
               "intermediate.dense": "ffn_up", "output.dense": "ffn_down",
               "output.LayerNorm": "layer_output_norm",
               # nomic-bert
               "attn.Wqkv": "attn_qkv", "attn.out_proj": "attn_output",
               "norm1": "attn_output_norm", "mlp.fc11": "ffn_up", "mlp.fc12": "ffn_gate",
               "mlp.fc2": "ffn_down", "norm2": "layer_output_norm"}
GGUF_POOLING = {"mean": 1, "cls": 2, "last": 3, "rank": 4}
# a BertForSequenceClassification's head -> llama.cpp's names (its converter drops the
# pooler and writes the classifier as cls.output; `write_bert_gguf(pooler=True)` keeps the
# pooler as cls, as it writes RoBERTa's classifier.dense)
_GGUF_HEAD = {"pooler.dense": "cls", "classifier": "cls.output"}


def _phantom(token: str) -> str:
    """llama.cpp's converter's spelling of a WordPiece token ("phantom space")."""
    if token.startswith("[") and token.endswith("]"):
        return token
    return token[2:] if token.startswith("##") else "\u2581" + token


def write_bert_gguf(folder: Path, path: Path, qtype=None, *, pooling: str | None = "mean",
                    add_bos_eos: bool = True, pooler: bool = True) -> Path:
    """`build_bert`'s model (`folder`) as a `bert` (or `nomic-bert`) GGUF file: llama.cpp's
    tensor names and metadata, its vocabulary in phantom-space form with token types,
    matrices in `qtype` (gguf's GGMLQuantizationType; default F32); the embedding tables
    stay F32 (llama.cpp's converter keeps position_embd and token_types F32; token_embd is
    kept so here too). A `build_reranker` BERT (pooling "rank") gets its head as cls (the
    pooler; `pooler=False`: none, as llama.cpp's converter writes it) and cls.output."""
    from gguf import GGMLQuantizationType as QT
    from gguf import GGUFWriter, quants
    from safetensors.numpy import load_file

    qtype = qtype or QT.F32
    cfg = json.loads((folder / "config.json").read_text())
    arch = "nomic-bert" if cfg["architectures"] == ["NomicBertModel"] else "bert"
    classifier = cfg["architectures"] == ["BertForSequenceClassification"]
    if arch == "nomic-bert":
        cfg = {"max_position_embeddings": cfg["n_positions"], "hidden_size": cfg["n_embd"],
               "intermediate_size": cfg["n_inner"], "num_hidden_layers": cfg["n_layer"],
               "num_attention_heads": cfg["n_head"], "layer_norm_eps": cfg["layer_norm_epsilon"],
               "type_vocab_size": cfg["type_vocab_size"], "rope": cfg["rotary_emb_base"]}
    doc = json.loads((folder / "tokenizer.json").read_text())
    vocab = doc["model"]["vocab"]
    tokens = [""] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    special = {a["id"] for a in doc["added_tokens"] if a["special"]}
    w = GGUFWriter(str(path), arch)
    w.add_name(f"random-{arch}")
    if "rope" in cfg:
        w.add_rope_freq_base(float(cfg["rope"]))
    add_encoder_header(w, cfg, cfg["max_position_embeddings"])
    if pooling is not None:
        w.add_uint32(f"{arch}.pooling_type", GGUF_POOLING[pooling])
    w.add_tokenizer_model("bert")
    w.add_token_list([_phantom(t) for t in tokens])
    w.add_token_types([3 if i in special else 1 for i in range(len(tokens))])
    w.add_token_type_count(cfg["type_vocab_size"])
    for key, tok in (("unk", "[UNK]"), ("bos", "[CLS]"), ("eos", "[SEP]"), ("sep", "[SEP]"),
                     ("pad", "[PAD]"), ("mask", "[MASK]")):
        getattr(w, f"add_{key}_token_id")(vocab[tok])
    w.add_add_bos_token(add_bos_eos)
    w.add_add_sep_token(add_bos_eos)
    for name, a in load_file(str(folder / "model.safetensors")).items():
        base, suffix = name.removeprefix("bert.").rsplit(".", 1)
        if classifier and base in _GGUF_HEAD:
            if base == "pooler.dense" and not pooler:
                continue
            w.add_tensor(f"{_GGUF_HEAD[base]}.{suffix}", np.ascontiguousarray(a, np.float32))
            continue
        if base.startswith("pooler."):
            continue
        if base in _GGUF_NAMES:
            gname = f"{_GGUF_NAMES[base]}.{suffix}"
        else:
            _, _, i, rest = base.split(".", 3)  # encoder.layer(s).{i}.rest
            gname = f"blk.{i}.{_GGUF_LAYER[rest]}.{suffix}"
        if a.ndim == 2 and qtype != QT.F32 and base not in _GGUF_NAMES:
            w.add_tensor(gname, quants.quantize(a, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(gname, np.ascontiguousarray(a, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def build_reranker(folder: Path, *, roberta: bool = False, seed: int = 0,
                   activation: str | None = None, dims: dict | None = None) -> Path:
    """A random cross-encoder with one label in `folder` (created), from `build_bert`'s
    encoder: BertForSequenceClassification (the pooler, dense + tanh on [CLS], then the
    classifier), or with `roberta` XLMRobertaForSequenceClassification (RoBERTa's head,
    classifier.dense + tanh then out_proj; positions from pad_token_id + 1, so two more
    rows; one token type; <s> a </s></s> b </s> pairs). `activation`: the config's
    sentence_transformers.activation_fn (None: none, CrossEncoder's default sigmoid)."""
    from safetensors.numpy import load_file, save_file

    D = {**DIMS, **(dims or {})}
    if roberta:
        D = {**D, "max_position_embeddings": D["max_position_embeddings"] + 2,
             "type_vocab_size": 1}
    build_bert(folder, pooling=None, seed=seed, dims=D)
    H = D["hidden_size"]
    rng = np.random.default_rng(seed + 1)
    w = load_file(str(folder / "model.safetensors"))
    if roberta:
        _tokenizer(roberta=True).save(str(folder / "tokenizer.json"))
        w = {f"roberta.{k}": v for k, v in w.items() if not k.startswith("pooler.")}
        w["classifier.dense.weight"] = (rng.standard_normal((H, H)) * H ** -0.5
                                        ).astype(np.float32)
        w["classifier.dense.bias"] = (rng.standard_normal(H) * 0.1).astype(np.float32)
        head = "classifier.out_proj"
    else:
        w = {f"bert.{k}": v for k, v in w.items()}
        head = "classifier"
    w[head + ".weight"] = (rng.standard_normal((1, H)) * 2 * H ** -0.5).astype(np.float32)
    w[head + ".bias"] = np.array([0.1], np.float32)
    save_file(w, str(folder / "model.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    config["id2label"], config["label2id"] = {"0": "LABEL_0"}, {"LABEL_0": 0}
    if roberta:
        config.update(architectures=["XLMRobertaForSequenceClassification"],
                      model_type="xlm-roberta", pad_token_id=1, bos_token_id=0,
                      eos_token_id=2, layer_norm_eps=1e-5)
        (folder / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
            "eos_token": "</s>", "unk_token": "<unk>", "sep_token": "</s>",
            "cls_token": "<s>", "pad_token": "<pad>", "mask_token": "<mask>",
            "model_max_length": D["max_position_embeddings"] - 2}))
    else:
        config["architectures"] = ["BertForSequenceClassification"]
    if activation is not None:
        config["sentence_transformers"] = {"activation_fn": activation}
    (folder / "config.json").write_text(json.dumps(config))
    return folder
