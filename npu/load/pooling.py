"""A model's pooling (npu.engine.pooling.Pooling) from its files: a GGUF file's
`{arch}.pooling_type` (llama.cpp's enum; 4, rank, with the file's classification head: a
reranker), a Hugging Face directory's sentence-transformers files (`modules.json`, the Pooling
module's config.json and the Dense modules' weights) or its sequence classifier's head (a
reranker: `classifier_of`), else the default: mean over the input's tokens, for decoders and
encoders alike (what sentence-transformers does with a plain transformers checkpoint;
llama.cpp has no default: a file without a pooling type embeds per token there).

A reranker's scores go through sigmoid unless its config names another activation, as
sentence-transformers' CrossEncoder and vLLM score a one-label classifier (Cohere's and Jina's
relevance scores are in 0..1 too); llama-server answers the raw logit. The order is the same.

A decoder reranker (Qwen3-Reranker) answers "yes" or "no" to a prompt that holds the query
and the document; its score is P(yes) = softmax([no, yes])[yes] = sigmoid(yes - no) of the
last token's logits, so its head is one row, the LM head's "yes" row less its "no" row (vLLM's
`classifier_from_token` with `is_original_qwen3_reranker`; llama.cpp's converter writes the
two rows as `cls.output`, "yes" first, and answers the softmax's first value). Its prompt is
the GGUF file's `tokenizer.chat_template.rerank` where it has one, else the model card's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from npu.engine.pooling import GGUF_POOLING, RANK, Dense, Pooling
from npu.engine.quant import QMatrix
from npu.errors import ModelError

# sentence-transformers' Pooling config keys -> our modes
ST_MODES = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls",
            "pooling_mode_lasttoken": "last", "pooling_mode_max_tokens": "max"}
ST_UNSUPPORTED = ("pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens")
ST_ACTIVATIONS = {"torch.nn.modules.linear.Identity": "identity",
                  "torch.nn.modules.activation.Tanh": "tanh"}
# modules that do not change the pooled vector (Normalize: the caller normalizes)
ST_NEUTRAL = ("Transformer", "Normalize")
# a CrossEncoder's activation (config.json's sentence_transformers.activation_fn, or the
# older sbert_ce_default_activation_function) -> the scores' activation
ST_SCORE_ACTIVATIONS = {"torch.nn.modules.activation.Sigmoid": "sigmoid",
                        "torch.nn.modules.linear.Identity": "identity",
                        "torch.nn.modules.activation.Tanh": "tanh"}
# a reranker's score activation where its files name none (one label: sigmoid)
DEFAULT_SCORE_ACTIVATION = "sigmoid"
# a decoder reranker's answer tokens, false then true (vLLM's classifier_from_token)
RERANK_TOKENS = ("no", "yes")
# Qwen3-Reranker's prompt (its model card's: the system turn, the user turn of instruction,
# query and document, the assistant turn opened with an empty think block) and the
# instruction it names by default
RERANK_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
RERANK_PROMPT = ("<|im_start|>system\nJudge whether the Document meets the requirements based "
                 "on the Query and the Instruct provided. Note that the answer can only be "
                 "\"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n<Instruct>: {instruction}\n"
                 "<Query>: {query}\n<Document>: {document}<|im_end|>\n<|im_start|>assistant\n"
                 "<think>\n\n</think>\n\n")


class Classifier(msgspec.Struct, frozen=True, kw_only=True):
    """Where a Hugging Face `*ForSequenceClassification` checkpoint keeps its head, read as
    its encoder (a BertModel) and a rank Pooling.

    Attributes:
        dense: the head's first layer, dense then tanh on the first token (BERT's pooler,
            RoBERTa's classifier.dense), without .weight / .bias.
        out: the output projection to the one score.
        roberta: positions start at pad_token_id + 1 (RoBERTa, XLM-RoBERTa): the rows before
            are dropped (as llama.cpp's converter drops them) and the context is that much
            shorter, so the encoder reads it as a BERT (its one token type included).
    """

    dense: tuple[str, ...]
    out: str
    roberta: bool = False


_ROBERTA = Classifier(dense=("classifier.dense",), out="classifier.out_proj", roberta=True)
CLASSIFIERS = {
    "BertForSequenceClassification": Classifier(dense=("bert.pooler.dense", "pooler.dense"),
                                                out="classifier"),
    "XLMRobertaForSequenceClassification": _ROBERTA,
    "RobertaForSequenceClassification": _ROBERTA,
}
# tensors of a head (kept in float32 under `quantize`: a few vectors' worth, read once)
HEAD_PREFIXES = ("classifier.", "bert.pooler.", "pooler.")


def classifier_of(raw: dict[str, Any]) -> Classifier | None:
    """The head of a config.json's sequence classifier (None: not one we serve)."""
    return next((CLASSIFIERS[a] for a in raw.get("architectures") or [] if a in CLASSIFIERS),
                None)


def _position_offset(raw: dict[str, Any]) -> int:
    pad = raw.get("pad_token_id")
    return 1 + int(pad if pad is not None else 1)


def encoder_config(raw: dict[str, Any]) -> dict[str, Any]:
    """A sequence classifier's config.json as its encoder's (BertModel's keys; a RoBERTa's
    context less the position rows it skips); any other config as it is."""
    head = classifier_of(raw)
    if head is None:
        return raw
    out = {**raw, "architectures": ["BertModel"]}
    if head.roberta and raw.get("max_position_embeddings") is not None:
        out["max_position_embeddings"] = int(raw["max_position_embeddings"]) - \
            _position_offset(raw)
    return out


def _float(value: np.ndarray | QMatrix) -> np.ndarray:
    arr = value.dequantize() if isinstance(value, QMatrix) else value
    return np.ascontiguousarray(arr, dtype=np.float32)


def _layer(weights: dict[str, Any], name: str, activation: str) -> Dense | None:
    """The dense layer `name` taken out of `weights` (None: there is none)."""
    weight = weights.pop(name + ".weight", None)
    bias = weights.pop(name + ".bias", None)
    if weight is None:
        return None
    weight = _float(weight)
    if weight.ndim != 2:
        raise ModelError(f"tensor {name}.weight has shape {list(weight.shape)}, not a matrix")
    return Dense(weight=weight, bias=None if bias is None else _float(bias).reshape(-1),
                 activation=activation)


def _score_activation(raw: dict[str, Any], where: Path) -> str:
    st = raw.get("sentence_transformers")
    name = (st.get("activation_fn") if isinstance(st, dict) else None) or \
        raw.get("sbert_ce_default_activation_function")
    if name is None:
        return DEFAULT_SCORE_ACTIVATION
    act = ST_SCORE_ACTIVATIONS.get(name)
    if act is None:
        raise ModelError(f"{where}/config.json: the scores' activation {name!r} is not "
                         f"supported (supported: {', '.join(ST_SCORE_ACTIVATIONS)})")
    return act


def classifier_pooling(raw: dict[str, Any], weights: dict[str, Any], folder: Path) -> Pooling:
    """A sequence classifier's head as a rank Pooling, its tensors taken out of `weights`
    (a RoBERTa's position rows before pad_token_id + 1 dropped there too); the scores'
    activation is the config's (see the module's docstring).

    Raises:
        ModelError: a head tensor is missing, or the classifier has more than one label.
    """
    head = classifier_of(raw)
    if head is None:
        raise ModelError(f"{folder}/config.json: not a sequence classifier")
    labels = int(raw.get("num_labels") or len(raw.get("id2label") or {}) or 2)
    if labels != 1:
        raise ModelError(f"{folder}: a reranker gives one score; this classifier has {labels} "
                         "labels (id2label)")
    if head.roberta:
        _drop_positions(weights, _position_offset(raw))
    dense = next((d for n in head.dense if (d := _layer(weights, n, "tanh")) is not None), None)
    out = _layer(weights, head.out, "identity")
    if dense is None or out is None:
        missing = head.dense[0] if dense is None else head.out
        raise ModelError(f"{folder}: the classifier lacks tensor {missing + '.weight'!r}")
    return Pooling(mode=RANK, dense=(dense, out), activation=_score_activation(raw, folder),
                   source="classifier")


def _drop_positions(weights: dict[str, Any], offset: int) -> None:
    """The position table without its first `offset` rows (RoBERTa's padding_idx + 1)."""
    name = next((n for n in ("roberta.embeddings.position_embeddings.weight",
                             "embeddings.position_embeddings.weight") if n in weights), None)
    if name is None:
        return  # the encoder names what is missing
    table = weights[name]
    if isinstance(table, QMatrix):
        rows, cols = table.shape
        weights[name] = QMatrix(table.qtype, (rows - offset, cols), table.data[offset:])
    else:
        weights[name] = table[offset:]


def pooling_from_gguf(meta: dict[str, Any], path: Path,
                      tensors: dict[str, Any] | None = None,
                      rerank: tuple[str, str] | None = None) -> Pooling:
    """The pooling a GGUF file's metadata names (the default when it names none): a
    reranker's (rank) with the classification head taken out of `tensors` (llama.cpp's
    cls / cls.output, under the names npu.load.gguf gives them), also for a file that names
    no pooling type but has the head (llama-server ranks with it given `--reranking`). A
    decoder's rank reads its last token through cls.output (two rows: the first less the
    second), else, for pooling_type 4 without it or for `rerank` (the answer tokens, false
    then true, a model entry names), through its LM head's rows (`decoder_rank_pooling`).

    Raises:
        ModelError: an unsupported pooling type, a rank file without a head, `rerank` on an
            encoder, or answer tokens the vocabulary does not have.
    """
    from npu.load.gguf import ENCODERS

    arch = meta.get("general.architecture")
    value = meta.get(f"{arch}.pooling_type")
    mode = None if value in (None, 0) else GGUF_POOLING.get(int(value))
    if value not in (None, 0) and mode is None:
        raise ModelError(f"{path}: {arch}.pooling_type {value} is not supported (1 mean, 2 cls, "
                         "3 last, 4 rank)")
    if arch not in ENCODERS:
        return _decoder_pooling_from_gguf(meta, path, tensors or {}, mode, rerank)
    if rerank is not None:
        raise ModelError(f"{path}: rerank applies to a decoder (Qwen3-Reranker); this {arch} "
                         "encoder reranks only with a classification head (pooling_type 4)")
    if mode not in (None, RANK):
        return Pooling(mode=mode, source="gguf")
    head = [d for d in (_layer(tensors or {}, "classifier.dense", "tanh"),
                        _layer(tensors or {}, "classifier.out_proj", "identity")) if d]
    if not head:
        if mode == RANK:
            raise ModelError(f"{path}: {arch}.pooling_type 4 (rank) needs a classification head "
                             "(tensors cls.weight or cls.output.weight); the file has none")
        return Pooling()
    return Pooling(mode=RANK, dense=tuple(head), activation=DEFAULT_SCORE_ACTIVATION,
                   source="gguf")


def _decoder_pooling_from_gguf(meta: dict[str, Any], path: Path, tensors: dict[str, Any],
                               mode: str | None, rerank: tuple[str, str] | None) -> Pooling:
    if rerank is None and mode not in (None, RANK):
        return Pooling(mode=mode, source="gguf")
    out = _layer(tensors, "classifier.out_proj", "identity")  # cls.output, "yes" row first
    if out is None and rerank is None and mode is None:
        return Pooling()
    prompt = meta.get("tokenizer.chat_template.rerank")
    if isinstance(prompt, str) and "{instruction}" not in prompt:
        # llama.cpp's converter writes the model card's prompt with its default instruction:
        # that instruction becomes the slot a request may fill
        prompt = prompt.replace(RERANK_INSTRUCTION, "{instruction}", 1)
    prompt = prompt if isinstance(prompt, str) else RERANK_PROMPT
    if out is not None:
        rows = out.weight.shape[0]
        if rows not in (1, 2):
            raise ModelError(f"{path}: cls.output has {rows} rows; a decoder reranker's has "
                             "two (the answer tokens, true first) or one")
        weight = out.weight if rows == 1 else out.weight[:1] - out.weight[1:]
        bias = out.bias if out.bias is None or rows == 1 else out.bias[:1] - out.bias[1:]
        head = Dense(weight=np.ascontiguousarray(weight), bias=bias)
        return Pooling(mode=RANK, dense=(head,), activation=DEFAULT_SCORE_ACTIVATION,
                       position="last", prompt=prompt, source="gguf")
    tokens = meta.get("tokenizer.ggml.tokens") or []
    index = {t: i for i, t in enumerate(tokens) if t in (rerank or RERANK_TOKENS)}
    return decoder_rank_pooling(tensors, index.get, rerank or RERANK_TOKENS, path,
                                prompt=prompt)


def decoder_rank_pooling(weights: dict[str, Any], token_id: Callable[[str], int | None],
                         tokens: tuple[str, str], where: Path, *,
                         prompt: str = RERANK_PROMPT,
                         read: dict[str, np.ndarray] | None = None) -> Pooling:
    """A decoder reranker's head from its LM head (`lm_head.weight`, else the tied
    embedding; read, not taken out of `weights`): the row of `tokens[1]` (true, "yes") less
    the row of `tokens[0]` (false, "no"), on the last token, through sigmoid: P(true) of
    the softmax over the two tokens' logits, as vLLM's `classifier_from_token` scores.

    Args:
        token_id: a token's id from its text as the vocabulary spells it (None: not one).

    `read`: the answer rows as the checkpoint stores them, by weight name, taken before
    `quantize` held the matrix in a block format (loader: a block format's error would go
    into every score).

    Raises:
        ModelError: a token the vocabulary does not have, or no LM head.
    """
    ids = []
    for text in tokens:
        i = token_id(text)
        if i is None:
            raise ModelError(f"{where}: the reranker's answer token {text!r} is not a token of "
                             "the vocabulary (rerank_tokens names them as it spells them)")
        ids.append(i)
    name = "lm_head.weight" if weights.get("lm_head.weight") is not None \
        else "model.embed_tokens.weight"
    if read and name in read:
        weight = np.ascontiguousarray(read[name][1:] - read[name][:1])
        return Pooling(mode=RANK, dense=(Dense(weight=weight),),
                       activation=DEFAULT_SCORE_ACTIVATION, position="last", prompt=prompt,
                       source="rerank")
    head = weights.get(name)
    if head is None or getattr(head, "ndim", 2) != 2:
        raise ModelError(f"{where}: a decoder reranker needs the LM head (lm_head.weight or "
                         "the tied embeddings)")
    rows = head[ids] if isinstance(head, np.ndarray) else head.rows(np.asarray(ids))
    rows = np.asarray(rows, dtype=np.float32)
    weight = np.ascontiguousarray(rows[1:] - rows[:1])
    return Pooling(mode=RANK, dense=(Dense(weight=weight),), activation=DEFAULT_SCORE_ACTIVATION,
                   position="last", prompt=prompt, source="rerank")


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelError(f"{path}: cannot be read as JSON ({exc})") from None


def _st_mode(path: Path) -> str:
    cfg = _read(path)
    bad = [k for k in ST_UNSUPPORTED if cfg.get(k)]
    modes = [m for k, m in ST_MODES.items() if cfg.get(k)]
    if bad or len(modes) != 1:
        raise ModelError(f"{path}: pooling {', '.join(bad) or modes or 'none'} is not "
                         f"supported (one of {', '.join(ST_MODES)})")
    return modes[0]


def _dense(folder: Path) -> Dense:
    from npu.load.safetensors import load_weights

    cfg = _read(folder / "config.json")
    act_name = cfg.get("activation_function") or "torch.nn.modules.linear.Identity"
    act = ST_ACTIVATIONS.get(act_name)
    if act is None:
        raise ModelError(f"{folder}/config.json: Dense activation {act_name!r} is not "
                         f"supported (supported: {', '.join(ST_ACTIVATIONS)})")
    if not (folder / "model.safetensors").exists():
        raise ModelError(f"{folder}: a Dense layer needs model.safetensors (convert "
                         "pytorch_model.bin to safetensors)")
    w = load_weights(folder, progress=False)
    try:
        weight = np.ascontiguousarray(w["linear.weight"], dtype=np.float32)
    except KeyError:
        raise ModelError(f"{folder}/model.safetensors lacks tensor 'linear.weight'") from None
    bias = w.get("linear.bias")
    if weight.shape != (cfg.get("out_features", weight.shape[0]),
                        cfg.get("in_features", weight.shape[1])):
        raise ModelError(f"{folder}: linear.weight has shape {list(weight.shape)}, config.json "
                         f"says {cfg.get('out_features')}x{cfg.get('in_features')}")
    return Dense(weight=weight, bias=None if bias is None else bias.astype(np.float32),
                 activation=act)


def pooling_from_directory(folder: Path) -> Pooling:
    """The pooling a Hugging Face directory's sentence-transformers files describe (the
    default without modules.json)."""
    modules_path = folder / "modules.json"
    if not modules_path.exists():
        return Pooling()
    modules = _read(modules_path)
    mode, dense = None, []
    for module in sorted(modules, key=lambda m: int(m.get("idx", 0))):
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        sub = folder / str(module.get("path", ""))
        if kind == "Pooling":
            mode = _st_mode(sub / "config.json")
        elif kind == "Dense":
            if mode is None:
                raise ModelError(f"{modules_path}: a Dense module before the Pooling module "
                                 "is not supported")
            dense.append(_dense(sub))
        elif kind not in ST_NEUTRAL:
            raise ModelError(f"{modules_path}: sentence-transformers module {kind!r} is not "
                             f"supported (supported: Transformer, Pooling, Dense, Normalize)")
    if mode is None:
        return Pooling()
    return Pooling(mode=mode, dense=tuple(dense), source="sentence-transformers")
