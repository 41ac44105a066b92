"""A small random Qwen3-Reranker: a Qwen3ForCausalLM built with transformers as a Hugging Face
directory, with a byte-level BPE tokenizer trained here whose vocabulary has the answer
tokens "yes" and "no" and ChatML's special tokens; the same model written as llama.cpp's
converter writes a Qwen3-Reranker GGUF file (pooling_type 4, `cls.output` the LM head's
"yes" and "no" rows, the rerank template); and transformers' score of a prompt, the model
card's: softmax over the last position's "no" and "yes" logits, P("yes")."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MARKERS = ["<think>", "</think>"]
DIMS = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=160)
# the model card's prompt around the pair (Qwen/Qwen3-Reranker-0.6B), its default instruction
PREFIX = ("<|im_start|>system\nJudge whether the Document meets the requirements based on the "
          "Query and the Instruct provided. Note that the answer can only be \"yes\" or "
          "\"no\".<|im_end|>\n<|im_start|>user\n")
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
# llama.cpp's converter's rerank template: the same prompt, the instruction written in
GGUF_TEMPLATE = (PREFIX + f"<Instruct>: {INSTRUCTION}\n<Query>: {{query}}\n"
                 "<Document>: {document}" + SUFFIX)


def pair_text(query: str, document: str, instruction: str = INSTRUCTION) -> str:
    """The model card's `format_instruction`."""
    return f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"


def _tokenizer():
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=420, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = [PREFIX, SUFFIX, pair_text("where did the cat sit?", "The cat sat on the mat."),
              "Stocks fell sharply today.", *["yes", "no"] * 40]
    tok.train_from_iterator(corpus, trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKERS])
    assert tok.token_to_id("yes") is not None and tok.token_to_id("no") is not None
    return tok


def build_qwen3_reranker(folder: Path, *, tied: bool = False, seed: int = 0) -> Path:
    """The model's Hugging Face directory in `folder` (created): config.json says
    Qwen3ForCausalLM only, as Qwen3-Reranker's does (4B and 8B untied, 0.6B `tied`)."""
    import torch
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer()
    tok.save(str(folder / "tokenizer.json"))
    vocab = tok.get_vocab_size(with_added_tokens=True)  # whole: a GGUF's token list's length
    torch.manual_seed(seed)
    cfg = transformers.Qwen3Config(vocab_size=vocab, initializer_range=0.2, rope_theta=1e6,
                                   tie_word_embeddings=tied, **DIMS)
    model = transformers.Qwen3ForCausalLM(cfg).eval()
    model.save_pretrained(folder)
    added = {str(tok.token_to_id(t)): {"content": t, "special": t in SPECIAL, "lstrip": False,
                                       "rstrip": False, "normalized": False,
                                       "single_word": False}
             for t in SPECIAL + MARKERS}
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None,
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "add_bos_token": False,
        "model_max_length": DIMS["max_position_embeddings"],
        "added_tokens_decoder": added}))
    return folder


def model_card_ids(folder: Path, query: str, documents: list[str],
                   instruction: str = INSTRUCTION) -> list[list[int]]:
    """The model card's token ids of each pair: the prefix's, the pair's, the suffix's."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    prefix = tok.encode(PREFIX, add_special_tokens=False)
    suffix = tok.encode(SUFFIX, add_special_tokens=False)
    pairs = tok([pair_text(query, d, instruction) for d in documents])["input_ids"]
    return [prefix + p + suffix for p in pairs]


def reference_scores(folder: Path, ids: list[list[int]]) -> np.ndarray:
    """transformers' P("yes") of each prompt: the model card's compute_logits."""
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    no, yes = tok.convert_tokens_to_ids("no"), tok.convert_tokens_to_ids("yes")
    model = transformers.Qwen3ForCausalLM.from_pretrained(str(folder)).eval()
    out = []
    with torch.no_grad():
        for item in ids:
            logits = model(torch.tensor([item])).logits[0, -1]
            two = torch.log_softmax(torch.stack([logits[no], logits[yes]]), dim=0)
            out.append(two[1].exp().item())
    return np.array(out)


def write_reranker_gguf(folder: Path, path: Path, *, template: str | None = GGUF_TEMPLATE,
                        pooling_type: int | None = 4, head: bool = True) -> Path:
    """`folder`'s model as llama.cpp's converter writes a Qwen3-Reranker (float32): its
    tensor names, `cls.output` the LM head's "yes" then "no" rows and no output.weight
    (`head` False: output.weight as a plain LM's file has it), qwen3.pooling_type,
    classifier.output_labels and `tokenizer.chat_template.rerank` (None: left out)."""
    from gguf import GGUFWriter
    from safetensors.numpy import load_file

    from tests.npu.gguf_files import _HF_TO_GGUF, _add_meta, tiny_tokenizer_meta

    cfg = json.loads((folder / "config.json").read_text())
    theta = (cfg.get("rope_parameters") or {}).get("rope_theta") or cfg.get("rope_theta")
    w = GGUFWriter(str(path), "qwen3")
    for key, value in {"block_count": cfg["num_hidden_layers"],
                       "context_length": cfg["max_position_embeddings"],
                       "embedding_length": cfg["hidden_size"],
                       "feed_forward_length": cfg["intermediate_size"],
                       "attention.head_count": cfg["num_attention_heads"],
                       "attention.head_count_kv": cfg["num_key_value_heads"],
                       "attention.key_length": cfg["head_dim"],
                       "attention.value_length": cfg["head_dim"],
                       "rope.freq_base": float(theta),
                       "attention.layer_norm_rms_epsilon": float(cfg["rms_norm_eps"])}.items():
        _add_meta(w, f"qwen3.{key}", value)
    if pooling_type is not None:
        _add_meta(w, "qwen3.pooling_type", pooling_type)
        _add_meta(w, "qwen3.classifier.output_labels", ["yes", "no"])
    meta = tiny_tokenizer_meta(folder)
    meta["tokenizer.ggml.eos_token_id"] = meta["tokenizer.ggml.tokens"].index("<|im_end|>")
    for key, value in meta.items():
        _add_meta(w, key, value)
    if template is not None:
        w.add_chat_template([{"name": "rerank", "template": template}])
    tokens = meta["tokenizer.ggml.tokens"]
    weights = load_file(str(folder / "model.safetensors"))
    lm_head = weights.get("lm_head.weight", weights["model.embed_tokens.weight"])
    for name, a in weights.items():
        if name == "lm_head.weight" and head:
            continue
        parts = name.split(".")
        kind = _HF_TO_GGUF[parts[-2]]
        gname = f"blk.{parts[2]}.{kind}.weight" if parts[1] == "layers" else f"{kind}.weight"
        w.add_tensor(gname, np.ascontiguousarray(a, dtype=np.float32))
    if head:
        rows = lm_head[[tokens.index("yes"), tokens.index("no")]]
        w.add_tensor("cls.output.weight", np.ascontiguousarray(rows, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
