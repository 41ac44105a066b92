"""read_gguf: a GGUF file as what a Hugging Face directory gives: a config.json dict, the
tokenizer's metadata, the chat template and the tensors under Hugging Face names.

The metadata and tensor table come from `gguf_header.read_header`; the file is then mapped
into memory (`MappedFile`) and read tensor by tensor, the next one read ahead (no float32
copy of any matrix): matrices in a format the kernels compute become `QMatrix` views of the
mapping (the engine repacks or fuses them from there; pages copied are handed back),
k-quants are converted in C on every core into memory of our own (logged with the error
made), vectors become float32.
What llama.cpp's converter changed is undone: the Llama family's Q/K row permutation (rows
are independent in every block format, so this reorders bytes) and Gemma's `1 +` folded
into its norm weights. A file that cannot be read, an unknown
architecture, an unsupported tensor type or a tensor whose shape disagrees with the
metadata is a `ModelError` naming the file and the tensor.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import numpy as np

from npu.config import ENCODER_ARCHITECTURES
from npu.engine.convert import fresh, packed_rows
from npu.engine.linear import PackedMatrix
from npu.engine.quant import (
    CONVERTED,
    QT,
    QMatrix,
    conversion_bound,
    converted_type,
    release_pages,
    row_bytes,
)
from npu.errors import ModelError
from npu.load.gguf_header import GGUFHeader, TensorInfo, read_header
from npu.load.mapped import MappedFile
from npu.load.progress import Progress

log = logging.getLogger(__name__)

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM", "gemma3": "Gemma3ForCausalLM",
                 "lfm2": "Lfm2ForCausalLM", "bert": "BertModel",
                 "nomic-bert": "NomicBertModel"}
ENCODERS = frozenset({"bert", "nomic-bert"})
# the ones whose attn_q / attn_k rows llama.cpp's converter permutes for ggml's RoPE
PERMUTED = frozenset({"llama"})
# the matrices the decoder engine multiplies (or looks rows up in): `read_gguf(packed=...)`
# converts these k-quants straight into the kernels' packed layout
LINEAR = re.compile(r"(token_embd|output|blk\.\d+\.(attn_(q|k|v|output)|ffn_(gate|up|down)))"
                    r"\.weight")

_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight",
           "output.weight": "lm_head.weight", "output_norm.weight": "model.norm.weight",
           "token_embd_norm.weight": "model.embedding_norm.weight",
           # a decoder reranker's answer rows (llama.cpp's Qwen3-Reranker: "yes", "no"), as
           # the encoders' head is named (npu.load.pooling reads it)
           "cls.output.weight": "classifier.out_proj.weight",
           "cls.output.bias": "classifier.out_proj.bias"}
_LAYER = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_LAYER_ARCH = {
    "gemma3": {"ffn_norm": "pre_feedforward_layernorm",
               "post_attention_norm": "post_attention_layernorm",
               "post_ffw_norm": "post_feedforward_layernorm"},
    "lfm2": {"attn_norm": "operator_norm", "ffn_norm": "ffn_norm",
             "attn_output": "self_attn.out_proj", "attn_q_norm": "self_attn.q_layernorm",
             "attn_k_norm": "self_attn.k_layernorm", "ffn_gate": "feed_forward.w1",
             "ffn_up": "feed_forward.w3", "ffn_down": "feed_forward.w2",
             "shortconv.conv": "conv.conv", "shortconv.in_proj": "conv.in_proj",
             "shortconv.out_proj": "conv.out_proj"},
}


# the encoders' names (npu.engine.encoder's roles), without the .weight / .bias suffix
_ENCODER_GLOBAL = {"token_embd": "embeddings.word_embeddings",
                   "token_types": "embeddings.token_type_embeddings",
                   "position_embd": "embeddings.position_embeddings",
                   # a reranker's classification head (npu.load.pooling reads it)
                   "cls": "classifier.dense", "cls.output": "classifier.out_proj"}
_ENCODER = {
    "bert": ("encoder.layer", {"token_embd_norm": "embeddings.LayerNorm"}, {
        "attn_q": "attention.self.query", "attn_k": "attention.self.key",
        "attn_v": "attention.self.value", "attn_output": "attention.output.dense",
        "attn_output_norm": "attention.output.LayerNorm", "ffn_up": "intermediate.dense",
        "ffn_down": "output.dense", "layer_output_norm": "output.LayerNorm"}),
    "nomic-bert": ("encoder.layers", {"token_embd_norm": "emb_ln"}, {
        "attn_qkv": "attn.Wqkv", "attn_output": "attn.out_proj", "attn_output_norm": "norm1",
        "ffn_up": "mlp.fc11", "ffn_gate": "mlp.fc12", "ffn_down": "mlp.fc2",
        "layer_output_norm": "norm2"}),
}


def _encoder_name(arch: str, name: str) -> str | None:
    layers, globals_, per_layer = _ENCODER[arch]
    parts = name.split(".")
    base, suffix = ".".join(parts[:-1]), parts[-1]
    mapped = _ENCODER_GLOBAL.get(base) or globals_.get(base)
    if mapped:
        return f"{mapped}.{suffix}"
    if parts[0] != "blk" or len(parts) < 4:
        return None
    mapped = per_layer.get(".".join(parts[2:-1]))
    return f"{layers}.{parts[1]}.{mapped}.{suffix}" if mapped else None


def hf_name(arch: str, name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor name (None: not one the engine uses)."""
    if arch in ENCODERS:
        return _encoder_name(arch, name)
    if name in _GLOBAL:
        return _GLOBAL[name]
    parts = name.split(".")
    if parts[0] != "blk" or len(parts) < 4:
        return None
    kind, suffix = ".".join(parts[2:-1]), parts[-1]
    mapped = _LAYER_ARCH.get(arch, {}).get(kind) or _LAYER.get(kind)
    return f"model.layers.{parts[1]}.{mapped}.{suffix}" if mapped else None


class GGUFModel:
    """What a GGUF file holds, read."""

    def __init__(self, path: Path, meta: dict[str, Any], config: dict[str, Any],
                 tensors: dict[str, np.ndarray | QMatrix],
                 files: list[MappedFile] | None = None) -> None:
        self.path, self.meta, self.config, self.tensors = path, meta, config, tensors
        self.files = files or []  # the mapped files whose views `tensors` may hold

    def release_pages(self) -> None:
        """Hand the mapped files' resident pages back (once the engine has copied what it
        repacks: what it holds as views faults back in as it is read)."""
        for f in self.files:
            f.release()

    @property
    def chat_template(self) -> str | None:
        return self.meta.get("tokenizer.chat_template")


def config_from_gguf(meta: dict[str, Any], tensor_names: set[str], path: Path,
                     embed_rows: int | None,
                     freq_factors: np.ndarray | None = None) -> dict[str, Any]:
    """A config.json dict (the keys `config_from_json` reads) from a file's metadata (and
    its rope_freqs tensor, if it has one)."""
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ModelError(f"{path}: architecture {arch!r} is not supported (supported: "
                         f"{', '.join(sorted(ARCHITECTURES))})")

    def key(name: str, default: Any = ...) -> Any:
        value = meta.get(f"{arch}.{name}", default)
        if value is ...:
            raise ModelError(f"{path}: metadata {arch}.{name} is missing")
        return value

    if arch in ENCODERS:
        return _encoder_config(arch, key, meta, tensor_names, embed_rows)
    heads = int(key("attention.head_count"))
    hidden = int(key("embedding_length"))
    kv = key("attention.head_count_kv", heads)
    layers = int(key("block_count"))
    vocab = key("vocab_size", None) or len(meta.get("tokenizer.ggml.tokens") or ()) or embed_rows
    cfg: dict[str, Any] = {
        "architectures": [ARCHITECTURES[arch]],
        "hidden_size": hidden,
        "intermediate_size": int(key("feed_forward_length")),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": int(max(kv) if isinstance(kv, list) else kv),
        "head_dim": int(key("attention.key_length", hidden // heads)),
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon", 1e-6)),
        "max_position_embeddings": int(key("context_length", 4096)),
        "vocab_size": int(vocab),
        "rope_theta": float(key("rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
    }
    scaling = key("rope.scaling.type", None)
    if scaling in ("linear", "yarn"):
        cfg["rope_scaling"] = {"rope_type": scaling,
                               "factor": float(key("rope.scaling.factor", 1.0)),
                               "original_max_position_embeddings":
                                   int(key("rope.scaling.original_context_length", 8192))}
    elif scaling not in (None, "none"):
        raise ModelError(f"{path}: rope scaling {scaling!r} is not supported")
    if freq_factors is not None:
        if freq_factors.shape != (cfg["head_dim"] // 2,):
            raise ModelError(f"{path}: tensor rope_freqs.weight has shape "
                             f"{list(freq_factors.shape)}, expected [{cfg['head_dim'] // 2}]")
        cfg.setdefault("rope_scaling", {"rope_type": "default"})
        cfg["rope_scaling"]["freq_factors"] = [float(f) for f in freq_factors]
    if arch == "qwen2":
        cfg["attention_bias"] = "blk.0.attn_q.bias" in tensor_names
    if arch == "gemma3":
        cfg["hidden_activation"] = "gelu_pytorch_tanh"
        cfg["sliding_window"] = int(key("attention.sliding_window", 4096))
        cfg["rope_local_base_freq"] = 10000.0
        cfg["query_pre_attn_scalar"] = cfg["head_dim"]
        cfg["sliding_window_pattern"] = 6
    if arch == "lfm2":
        if not isinstance(kv, list):
            raise ModelError(f"{path}: lfm2.attention.head_count_kv should list every layer")
        cfg["layer_types"] = ["full_attention" if n else "conv" for n in kv]
        cfg["conv_L_cache"] = int(key("shortconv.l_cache", 3))
        cfg["norm_eps"] = cfg["rms_norm_eps"]
    return cfg


def _encoder_config(arch: str, key, meta: dict[str, Any], tensor_names: set[str],
                    embed_rows: int | None) -> dict[str, Any]:
    """A BertModel / NomicBertModel config.json dict from a bert / nomic-bert file."""
    types = meta.get("tokenizer.ggml.token_type_count")
    cfg: dict[str, Any] = {
        "architectures": [ARCHITECTURES[arch]],
        "hidden_size": int(key("embedding_length")),
        "intermediate_size": int(key("feed_forward_length")),
        "num_hidden_layers": int(key("block_count")),
        "num_attention_heads": int(key("attention.head_count")),
        "layer_norm_eps": float(key("attention.layer_norm_epsilon", 1e-12)),
        "max_position_embeddings": int(key("context_length", 512)),
        "vocab_size": int(len(meta.get("tokenizer.ggml.tokens") or ()) or embed_rows),
        "type_vocab_size": int(types if types is not None else
                               2 if "token_types.weight" in tensor_names else 0),
    }
    if arch == "nomic-bert":
        cfg["activation_function"] = "swiglu"
        cfg["rotary_emb_base"] = float(key("rope.freq_base", 10000.0))
    else:
        cfg["hidden_act"] = "gelu"
    return cfg


def _expected_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The shape each kind of tensor must have, by GGUF name pattern (layer-free)."""
    H, I = cfg["hidden_size"], cfg["intermediate_size"]
    nq = cfg["num_attention_heads"]
    nkv, hd = cfg.get("num_key_value_heads", nq), cfg.get("head_dim", H // nq)
    V = cfg["vocab_size"]
    return {"token_embd.weight": (V, H), "output.weight": (V, H), "output_norm.weight": (H,),
            "token_embd_norm.weight": (H,),
            "attn_q.weight": (nq * hd, H), "attn_k.weight": (nkv * hd, H),
            "attn_v.weight": (nkv * hd, H), "attn_output.weight": (H, nq * hd),
            "attn_q.bias": (nq * hd,), "attn_k.bias": (nkv * hd,), "attn_v.bias": (nkv * hd,),
            "attn_q_norm.weight": (hd,), "attn_k_norm.weight": (hd,),
            "attn_norm.weight": (H,), "ffn_norm.weight": (H,),
            "post_attention_norm.weight": (H,), "post_ffw_norm.weight": (H,),
            "ffn_gate.weight": (I, H), "ffn_up.weight": (I, H), "ffn_down.weight": (H, I),
            "shortconv.in_proj.weight": (3 * H, H), "shortconv.out_proj.weight": (H, H),
            "shortconv.conv.weight": (H, cfg.get("conv_L_cache", 3)),
            "attn_qkv.weight": (3 * H, H), "attn_qkv.bias": (3 * H,),
            "position_embd.weight": (cfg["max_position_embeddings"], H),
            "token_types.weight": (cfg.get("type_vocab_size", 0), H)}


SPLIT_NAME = re.compile(r"^(?P<stem>.+)-(?P<part>\d{5})-of-(?P<count>\d{5})\.gguf$",
                        re.IGNORECASE)


def split_parts(path: Path, meta: dict[str, Any]) -> list[Path]:
    """Every file of a model split by llama.cpp's gguf-split (`NAME-00001-of-0000N.gguf`,
    `split.count` in the first file's metadata); `[path]` for a whole file.

    Raises:
        ModelError: a part is missing, or the first file is not part 1.
    """
    count = int(meta.get("split.count", 1) or 1)
    if count <= 1:
        return [path]
    m = SPLIT_NAME.match(path.name)
    if not m or int(m["part"]) != 1:
        raise ModelError(f"{path}: one part of a model split in {count} files; give the "
                         f"first one, NAME-00001-of-{count:05d}.gguf")
    parts = [path.with_name(f"{m['stem']}-{i:05d}-of-{count:05d}.gguf")
             for i in range(1, count + 1)]
    missing = [p.name for p in parts if not p.exists()]
    if missing:
        raise ModelError(f"{path}: split parts missing: {', '.join(missing)}")
    return parts


def read_gguf_header(path: Path) -> GGUFHeader:
    """The file's header (metadata and tensor table), parsed.

    Raises:
        ModelError: not a readable GGUF file.
    """
    from npu.engine.convert import strings_joined

    try:
        return read_header(path, walk=strings_joined)
    except (OSError, ValueError) as exc:  # bad magic, truncated, corrupt tables, bad UTF-8
        raise ModelError(f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc})") \
            from None


def read_gguf(path: Path, *, progress: bool = True,
              header: GGUFHeader | None = None, packed: bool = False) -> GGUFModel:
    """Read a GGUF file, or the first of a split model's files (see the module's
    docstring; the metadata is the first file's, the tensors every part's). `header`: the
    file's, already parsed (read_gguf_header). `packed`: the decoder's k-quant matrices
    (LINEAR; the embedding where it is the output head too) come converted straight into
    the CPU kernels' packed layout where this build has one, as `PackedMatrix`es (the decoder
    engine's own, multiplied as they are; not for the NPU or an encoder).

    Raises:
        ModelError: naming the file (and the tensor) for anything that cannot be served.
    """
    header = header if header is not None else read_gguf_header(path)
    meta = header.meta
    where: dict[str, Path] = {}  # tensor -> the part that holds it
    infos: dict[str, TensorInfo] = {}
    for part in split_parts(path, meta):
        for t in (header if part == path else read_gguf_header(part)).tensors:
            infos[t.name], where[t.name] = t, part
    files = {part: MappedFile(part) for part in dict.fromkeys(where.values())}
    arch = meta.get("general.architecture")
    embed = infos.get("token_embd.weight")
    freqs = infos.get("rope_freqs.weight")
    cfg = config_from_gguf(meta, set(infos), path,
                           int(embed.shape[-1]) if embed is not None else None,
                           _vector(files[where["rope_freqs.weight"]], freqs)
                           if freqs is not None else None)
    shapes = _expected_shapes(cfg)
    if any(a in ENCODER_ARCHITECTURES for a in cfg.get("architectures", ())):
        packed = False  # the encoder engine multiplies blocks as they are
    group = packed_rows() if packed else 0  # the packed layout's rows a group (0: none)
    total = sum(t.n_bytes for t in infos.values())
    bar = Progress(path.name, total) if progress else None
    tensors: dict[str, np.ndarray | QMatrix] = {}
    converted: list[str] = []
    todo = [(name, target, t) for name, t in infos.items()
            if (target := hf_name(arch, name)) is not None]
    slots = _fused_slots(infos)
    for i, (name, target, t) in enumerate(todo):
        shape = t.shape[::-1]  # [rows, cols]
        kind = ".".join(name.split(".")[2:]) if name.startswith("blk.") else name
        want = shapes.get(kind)
        if want is not None and shape != want:
            raise ModelError(f"{path}: tensor {name} has shape {list(shape)}, the metadata "
                             f"implies {list(want)}")
        qtype = _qtype(path, t)
        raw = files[where[name]].view(t.data_offset, t.n_bytes, f"tensor {name}")
        if i + 1 < len(todo):  # the next one is read ahead while this one is converted
            nxt = todo[i + 1][2]
            files[where[nxt.name]].prefetch(nxt.data_offset, nxt.n_bytes)
        try:
            tensors[target], err = _tensor(qtype, shape, raw, arch, name, cfg, slots.get(name),
                                           group)
        except ModelError as exc:
            raise ModelError(f"{path}: tensor {name}: {exc}") from None
        if not _is_view(tensors[target], raw):  # copied or converted: its pages go back
            release_pages(raw)
        if bar:
            bar.add(raw.size)
        if err is not None:
            converted.append(f"{name} {qtype.name}->{tensors[target].qtype.name} "
                             f"(error at most {err:.2e} of max |w|)")
    elapsed = bar.end() if bar else 0.0
    if converted:
        log.warning("%s: converted %d tensors for the CPU kernels: %s%s", path.name,
                    len(converted), "; ".join(converted[:4]), " ..." if len(converted) > 4 else "")
    log.info("read %s (%s, %d tensors, %.0f MB) in %.1f s", path.name, arch, len(tensors),
             total / 1e6, elapsed)
    return GGUFModel(path, meta, cfg, tensors, list(files.values()))


def _is_view(value: np.ndarray | QMatrix | PackedMatrix, raw: np.ndarray) -> bool:
    """Whether `value` holds the mapped bytes `raw` themselves (not a copy)."""
    data = value.data if isinstance(value, (QMatrix, PackedMatrix)) else value
    return np.may_share_memory(data, raw)


def _qtype(path: Path, t: TensorInfo) -> QT:
    try:
        return QT(t.tensor_type)
    except ValueError:
        raise ModelError(f"{path}: tensor {t.name} has unknown type {t.tensor_type}") from None


def _vector(file: MappedFile, t: TensorInfo) -> np.ndarray:
    """A tensor read whole as a float32 vector (rope_freqs)."""
    raw = file.view(t.data_offset, t.n_bytes, f"tensor {t.name}")
    return QMatrix(_qtype(file.path, t), (1, int(np.prod(t.shape))), raw).dequantize()[0]


# a layer's matrices the engine stacks by rows (Q, K, V; gate, up), in its order
FUSED = (("attn_q", "attn_k", "attn_v"), ("ffn_gate", "ffn_up"))


def _fused_slots(infos: dict[str, TensorInfo]) -> dict[str, np.ndarray]:
    """Where each k-quant matrix of a layer's stacked ones is converted to: runs of them
    converted to one format share a buffer, one after the other in the engine's order, so
    that stacking them (`QMatrix.concat`) is a view, not a copy of most of the weights."""
    slots: dict[str, np.ndarray] = {}
    layers = {n.split(".")[1] for n in infos if n.startswith("blk.")}
    for layer in layers:
        for group in FUSED:
            run: list[tuple[str, QT, int, int]] = []  # name, format, rows, row bytes
            for kind in (*group, None):
                t = infos.get(f"blk.{layer}.{kind}.weight") if kind else None
                member = None
                if t is not None and len(t.shape) == 2 and t.tensor_type in _CONVERTED:
                    to = converted_type(QT(t.tensor_type))
                    rows, cols = int(t.shape[1]), int(t.shape[0])
                    try:
                        member = (t.name, to, rows, row_bytes(to, cols))
                    except ModelError:
                        member = None
                if run and (member is None or member[1:2] + member[3:] != run[0][1:2]
                            + run[0][3:]):
                    if len(run) > 1:
                        buf = fresh((sum(r * b for _, _, r, b in run),))
                        at = 0
                        for name, _, r, b in run:
                            slots[name] = buf[at : at + r * b].reshape(r, b)
                            at += r * b
                    run = []
                if member is not None:
                    run.append(member)
    return slots


_CONVERTED = frozenset(int(q) for q in CONVERTED)


def _tensor(qtype: QT, shape: tuple[int, ...], raw: np.ndarray, arch: str, name: str,
            cfg: dict[str, Any], out: np.ndarray | None = None, group: int = 0
            ) -> tuple[np.ndarray | QMatrix | PackedMatrix, float | None]:
    """One tensor's value, a float32 vector, a QMatrix or (a k-quant linear layer's matrix
    where `group`, the packed layout's rows a group, divides its rows; an untied embedding,
    only looked up, stays a QMatrix) a PackedMatrix, and a bound on the error of its
    conversion to a format the kernels compute (None: not converted; `out`: where a
    conversion writes, `_fused_slots`)."""
    if len(shape) == 1:
        value = QMatrix(qtype, (1, shape[0]), raw).dequantize()[0]
        if arch == "gemma3" and name.endswith("norm.weight"):
            value = value - np.float32(1.0)  # llama.cpp stores Gemma's norms as 1 + w
        return value, None
    if len(shape) != 2:
        raise ModelError(f"{len(shape)}-dimensional tensors are not supported")
    m = QMatrix(qtype, shape, raw)
    order = None
    if arch in PERMUTED and (".attn_q." in name or ".attn_k." in name):
        heads = cfg["num_attention_heads"] if ".attn_q." in name else cfg["num_key_value_heads"]
        order = unpermute_order(shape[0], heads)
    if (group and qtype in CONVERTED and shape[0] % group == 0 and LINEAR.fullmatch(name)
            and (name != "token_embd.weight" or cfg.get("tie_word_embeddings"))):
        from npu.engine.convert import convert
        from npu.engine.cpu_kernels import kernels

        target, data, s0, s1 = convert(qtype, m.data, out=out, order=order, packed=True)
        return (PackedMatrix(target, shape, data.reshape(-1), kernels()),
                conversion_bound(target, s0, s1))
    native, err = m.to_native(out=out, order=order)
    return native, (None if qtype not in CONVERTED else err)


def unpermute_order(rows: int, heads: int) -> np.ndarray:
    """Row order that undoes llama.cpp's Q/K permutation: its converter stores, per head,
    the rotary pairs (i, i + d/2) as adjacent rows (2i, 2i + 1); Hugging Face keeps halves."""
    half = rows // heads // 2
    # Hugging Face row (h, j, i) is stored row (h, i, j), j in {0, 1}
    return np.arange(rows).reshape(heads, half, 2).transpose(0, 2, 1).reshape(rows)
