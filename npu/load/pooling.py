"""A model's pooling (npu.engine.pooling.Pooling) from its files: a GGUF file's
`{arch}.pooling_type` (llama.cpp's enum), a Hugging Face directory's sentence-transformers
files (`modules.json`, the Pooling module's config.json and the Dense modules' weights), else
the default: mean over the input's tokens, for decoders and encoders alike (what
sentence-transformers does with a plain transformers checkpoint; llama.cpp has no default: a
file without a pooling type embeds per token there).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from npu.engine.pooling import GGUF_POOLING, Dense, Pooling
from npu.errors import ModelError

# sentence-transformers' Pooling config keys -> our modes
ST_MODES = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls",
            "pooling_mode_lasttoken": "last", "pooling_mode_max_tokens": "max"}
ST_UNSUPPORTED = ("pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens")
ST_ACTIVATIONS = {"torch.nn.modules.linear.Identity": "identity",
                  "torch.nn.modules.activation.Tanh": "tanh"}
# modules that do not change the pooled vector (Normalize: the caller normalizes)
ST_NEUTRAL = ("Transformer", "Normalize")


def pooling_from_gguf(meta: dict[str, Any], path: Path) -> Pooling:
    """The pooling a GGUF file's metadata names (the default when it names none)."""
    arch = meta.get("general.architecture")
    value = meta.get(f"{arch}.pooling_type")
    if value in (None, 0):
        return Pooling()
    mode = GGUF_POOLING.get(int(value))
    if mode is None:
        raise ModelError(f"{path}: {arch}.pooling_type {value} is not supported (1 mean, 2 cls, "
                         "3 last; 4 rank is a reranker's head)")
    return Pooling(mode=mode, source="gguf")


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
