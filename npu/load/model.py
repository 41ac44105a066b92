"""load_model and Model: a Hugging Face model directory ready to serve.

A model directory holds config.json, *.safetensors (possibly sharded with an index),
tokenizer.json, tokenizer_config.json and/or chat_template.jinja, and optionally
generation_config.json. A missing or unsupported piece is a `ModelError` naming it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


from npu.load.config import ModelConfig, config_from_json
from npu.errors import ModelError
from npu.engine.numpy_engine import NumpyEngine
from npu.sampler import SamplingParams
from npu.load.template import ChatTemplate
from npu.load.tokenizer import Tokenizer
from npu.load.safetensors import load_weights


class Model:
    """A loaded model: tokenizer, chat template, engine and generation defaults."""

    def __init__(self, *, name: str, path: Path, config: ModelConfig, tokenizer: Tokenizer,
                 template: ChatTemplate | None, engine: Any, eos_token_ids: tuple[int, ...],
                 defaults: SamplingParams) -> None:
        self.name = name
        self.path = path
        self.config = config
        self.tokenizer = tokenizer
        self.template = template
        self.engine = engine
        self.eos_token_ids = eos_token_ids
        self.defaults = defaults

    @property
    def token_table(self) -> list[bytes]:
        """The bytes each token decodes to, one entry per logit (built once)."""
        table = getattr(self, "_token_table", None)
        if table is None:
            table = self._token_table = self.tokenizer.token_bytes(self.config.vocab_size)
        return table

    @property
    def chat_template_source(self) -> str:
        return self.template.source if self.template else ""

    @property
    def context_length(self) -> int:
        return self.config.max_position

    def render(self, messages: list[dict], tools: list[dict] | None = None, *,
               enable_thinking: bool | None = None, add_generation_prompt: bool = True,
               **kwargs: Any) -> str:
        """The prompt text for a conversation (with the template's BOS, if it writes one)."""
        if self.template is None:
            raise ModelError(f"model {self.name} has no chat template: use /v1/completions")
        return self.template.render(messages, tools, enable_thinking=enable_thinking,
                                    add_generation_prompt=add_generation_prompt, **kwargs)

    def prompt_ids(self, text: str) -> list[int]:
        """Token ids of a prompt; BOS is added when the tokenizer wants it and the text does
        not already start with it."""
        tok = self.tokenizer
        ids = tok.encode(text)
        if tok.add_bos and tok.bos_id is not None and (not ids or ids[0] != tok.bos_id):
            ids = [tok.bos_id] + ids
        return ids

    def thinking_enabled(self, enable_thinking: bool | None = None) -> bool:
        return self.template.thinking_enabled(enable_thinking) if self.template else True

    def tools_enabled(self) -> bool:
        return self.template.tools_enabled() if self.template else False


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


def _template_source(folder: Path, tok_config: dict) -> str | None:
    jinja = folder / "chat_template.jinja"
    if jinja.exists():
        return jinja.read_text(encoding="utf-8")
    source = tok_config.get("chat_template")
    if isinstance(source, list):  # named templates: take "default"
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default") or next(iter(named.values()), None)
    return source if isinstance(source, str) else None


def load_model(path: str | Path, device: str = "cpu", *, name: str | None = None,
               kernel_dir: str | Path | None = None, device_index: int = 0,
               xrt: Any = None) -> Model:
    """Load a model directory (or the embedded `flm-tiny`).

    Args:
        path: a model directory, or "flm-tiny" (generated on first use into a cache).
        device: "cpu" (the numpy engine) or "npu" (the XRT engine: linear layers on the
            NPU's GEMM kernel).
        kernel_dir: "npu": the GEMM kernel directory (manifest.json, xclbin, insts.bin).
        device_index: "npu": which NPU.
        xrt: "npu": an `npu.xrt.XRT` (default: over the real pyxrt).

    Raises:
        ModelError: a missing or unsupported file, key or architecture, named.
    """
    if str(path) == "flm-tiny":
        from npu.load.tiny import ensure_tiny

        path, name = ensure_tiny(), name or "flm-tiny"
    folder = Path(path)
    if not folder.is_dir():
        raise ModelError(f"model directory {folder} does not exist")
    if device not in ("cpu", "npu"):
        raise ModelError(f"device {device!r} is not one of 'cpu', 'npu'")
    if device == "npu" and kernel_dir is None:
        raise ModelError("device 'npu' needs a GEMM kernel directory (kernel_dir)")
    config_path = folder / "config.json"
    if not config_path.exists():
        raise ModelError(f"{folder}: config.json is missing")
    config = config_from_json(_read_json(config_path))
    tok_config = _read_json(folder / "tokenizer_config.json")
    tok_path = folder / "tokenizer.json"
    if not tok_path.exists():
        raise ModelError(f"{folder}: tokenizer.json is missing")
    bos = _token_text(tok_config.get("bos_token"))
    eos = _token_text(tok_config.get("eos_token"))
    tokenizer = Tokenizer(tok_path, bos_token=bos, eos_token=eos,
                          unk_token=_token_text(tok_config.get("unk_token")),
                          pad_token=_token_text(tok_config.get("pad_token")),
                          add_bos=bool(tok_config.get("add_bos_token", False)))
    source = _template_source(folder, tok_config)
    template = ChatTemplate(source, bos_token=bos or "", eos_token=eos or "") if source else None
    gen = _read_json(folder / "generation_config.json")
    eos_ids: list[int] = []
    for value in (gen.get("eos_token_id"), config.eos_token_ids, tokenizer.eos_id):
        for t in ([value] if isinstance(value, int) else list(value or ())):
            if isinstance(t, int) and t not in eos_ids:
                eos_ids.append(t)
    defaults = SamplingParams(
        temperature=float(gen.get("temperature", 1.0)) if gen.get("do_sample", True) else 0.0,
        top_k=int(gen.get("top_k") or 0), top_p=float(gen.get("top_p") or 1.0),
        min_p=float(gen.get("min_p") or 0.0),
        repetition_penalty=float(gen.get("repetition_penalty") or 1.0))
    if device == "npu":
        from npu.xrt import XRT
        from npu.xrt.engine import XRTEngine

        engine = XRTEngine(config, load_weights(folder), xrt=xrt or XRT(),
                           device_index=device_index, kernel_dir=Path(kernel_dir))
    else:
        engine = NumpyEngine(config, load_weights(folder))
    if engine.vocab_size < tokenizer.size:
        raise ModelError(f"{folder}: the tokenizer has {tokenizer.size} tokens but the model "
                         f"only {engine.vocab_size} logits")
    return Model(name=name or folder.name, path=folder, config=config, tokenizer=tokenizer,
                 template=template, engine=engine, eos_token_ids=tuple(eos_ids),
                 defaults=defaults)


__all__ = ["Model", "load_model"]
