"""npu: devices and models: loading, the numpy engine, tokenizer, templates and sampler."""

from npu.config import ModelConfig, config_from_json
from npu.engine.numpy_engine import NumpyEngine
from npu.errors import ContextLengthError, KVCacheFull, ModelError
from npu.load.loader import load_model
from npu.load.options import LoadOptions
from npu.load.template import ChatTemplate, TemplateError
from npu.load.tokenizer import Detokenizer, Tokenizer
from npu.model import Model
from npu.sampler import Sampler, SamplingParams, logprobs

__all__ = [
    "ChatTemplate",
    "ContextLengthError",
    "Detokenizer",
    "KVCacheFull",
    "LoadOptions",
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
