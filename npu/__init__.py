"""npu: devices and models: loading, the numpy engine, tokenizer, templates and sampler."""

from npu.config import ModelConfig, config_from_json
from npu.errors import ContextLengthError, ModelError
from npu.model import Model, load_model
from npu.numpy_engine import NumpyEngine
from npu.sampler import Sampler, SamplingParams, logprobs
from npu.template import ChatTemplate, TemplateError
from npu.tokenizer import Detokenizer, Tokenizer

__all__ = [
    "ChatTemplate",
    "ContextLengthError",
    "Detokenizer",
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
