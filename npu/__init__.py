"""npu: devices and models: loading, the numpy engine, tokenizer, templates and sampler."""

from npu.load.config import ModelConfig, config_from_json
from npu.errors import ContextLengthError, KVCacheFull, ModelError
from npu.load.model import Model, load_model
from npu.engine.numpy_engine import NumpyEngine
from npu.sampler import Sampler, SamplingParams, logprobs
from npu.load.template import ChatTemplate, TemplateError
from npu.load.tokenizer import Detokenizer, Tokenizer

__all__ = [
    "ChatTemplate",
    "ContextLengthError",
    "Detokenizer",
    "KVCacheFull",
    "Model",
    "ModelConfig",
    "ModelError",
    "NumpyEngine",
    "Sampler",
    "SamplingParams",
    "TemplateError",
    "Tokenizer",
    "config_from_json",
    "load_model",
    "logprobs",
]
