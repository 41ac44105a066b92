"""detect_format and format_prefill: every shared template, and our own small templates."""

from __future__ import annotations

import pytest

from chat import FormatKind, detect_format, format_prefill, spec_for_kind
from tests.shared import is_token_for, needs_shared, template, template_names

# The format ../shared/formats/README.md gives each template, and whether reasoning is on;
# Llama 3.x's and Mistral's, content_only there, have formats of their own here.
EXPECTED = {
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": ("hermes_json", False),
    "Qwen-Qwen2.5-7B-Instruct": ("hermes_json", False),
    "Qwen-QwQ-32B": ("hermes_json", True),
    "Qwen-Qwen3-0.6B": ("hermes_json", True),
    "Qwen-Qwen3-4B-Thinking-2507": ("hermes_json", True),
    "Qwen-Qwen3-Coder": ("qwen_xml", None),
    "Qwen-Qwen3.5-4B": ("qwen_xml", True),
    "google-gemma-4-31B-it": ("gemma4", True),
    "google-gemma-4-31B-it-initial": ("gemma4", True),
    "google-gemma-4-31B-it-interleaved": ("gemma4", True),
    "LiquidAI-LFM2-8B-A1B": ("lfm2_pythonic", True),
    "LiquidAI-LFM2.5-8B-A1B": ("lfm2_pythonic", True),
    "LiquidAI-LFM2.5-Instruct": ("lfm2_pythonic", True),
    "llama-cpp-lfm2": ("lfm2_pythonic", False),
    "openai-gpt-oss-120b": ("harmony", True),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": ("content_only", True),
    "deepseek-ai-DeepSeek-R1": ("content_only", True),
    "google-gemma-2-2b-it": ("content_only", False),
    "google-gemma-3-it": ("content_only", False),
    "meta-llama-Llama-3.1-8B-Instruct": ("llama3_json", False),
    "meta-llama-Llama-3.2-3B-Instruct": ("llama3_json", False),
    "microsoft-Phi-4-mini-instruct": ("content_only", False),
    "microsoft-phi-4": ("content_only", False),
    "mistralai-Mistral-Nemo-Instruct-2407": ("mistral_json", False),
    "mistralai-Mistral-Small-3.2-24B-Instruct-2506": ("mistral_args", False),
    "mistralai-Ministral-3-14B-Reasoning-2512": ("mistral_args", True),
}


@needs_shared
def test_every_shared_template_is_listed() -> None:
    assert sorted(EXPECTED) == template_names()


@needs_shared
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_shared_template_gets_its_format(name: str) -> None:
    spec = detect_format(template(name), is_token_for(name))
    kind, reasoning = EXPECTED[name]
    assert spec.kind is FormatKind(kind)
    if reasoning is not None:
        assert spec.reasoning is reasoning


@needs_shared
@pytest.mark.parametrize("name,forced", [
    ("Qwen-QwQ-32B", True), ("Qwen-Qwen3-4B-Thinking-2507", True),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", True), ("Qwen-Qwen3-0.6B", False),
    ("Qwen-Qwen3.5-4B", False), ("LiquidAI-LFM2.5-8B-A1B", False),
])
def test_forced_reasoning_is_detected(name: str, forced: bool) -> None:
    assert detect_format(template(name), is_token_for(name)).reasoning_forced is forced


def _no_tokens(_: str) -> bool:
    return False


@pytest.mark.parametrize("tpl,tokens,kind,reasoning", [
    ("{{'<|start|>assistant<|channel|>final<|message|>'}}", set(), "harmony", True),
    ("{{'<|tool_call>call:'}}{{'<|channel>'}}", set(), "gemma4", True),
    ("{{ 'List of tools: ' + tools|tojson }}", {"<|tool_call_start|>", "<think>"},
     "lfm2_pythonic", True),
    ("<tool_call>\n<function={{name}}>\n<parameter={{k}}>", set(), "qwen_xml", False),
    ("<tool_call>{\"name\": ...}</tool_call>{% if enable_thinking %}<think>{% endif %}", set(),
     "hermes_json", True),
    ("<tool_call>{\"name\": ...}</tool_call>", set(), "hermes_json", False),
    ("{{ bos_token }}{{ message.content }}", {"</think>"}, "content_only", True),
    ("[INST]{{ m }}[/INST][THINK]", {"[THINK]", "[/THINK]"}, "content_only", True),
    ("[INST]{{ m }}[/INST]{{ '[TOOL_CALLS][' }}", set(), "mistral_json", False),
    ("{{ '[TOOL_CALLS]' + name + '[ARGS]' }}[THINK]", {"[THINK]", "[/THINK]"}, "mistral_args",
     True),
    ("<|start_header_id|>{{ '{\"name\": ' + n + ', \"parameters\": ' }}", set(),
     "llama3_json", False),
    ("<|start_header_id|>{{ '<|python_tag|>' }}", set(), "llama3_json", False),
    ("<|start_header_id|>{{ m.content }}<|eot_id|>", set(), "content_only", False),
    ("{{ message.content }}", set(), "content_only", False),
])
def test_detection_rules(tpl: str, tokens: set, kind: str, reasoning: bool) -> None:
    spec = detect_format(tpl, tokens.__contains__)
    assert spec.kind is FormatKind(kind)
    assert spec.reasoning is reasoning


def test_vocabulary_alone_turns_reasoning_on() -> None:
    spec = detect_format("{{ content }}<tool_call>", lambda s: s == "</think>")
    assert spec.reasoning and spec.reasoning_start == "<think>"


def test_extra_stops() -> None:
    assert spec_for_kind("harmony").extra_stops == ("<|call|>",)
    assert spec_for_kind("gemma4").extra_stops == ("<|tool_response>",)
    assert spec_for_kind("hermes_json").extra_stops == ()


def test_thinking_switch_is_reported() -> None:
    tpl = "<tool_call>{% if enable_thinking is false %}<think>\n\n</think>{% endif %}"
    assert detect_format(tpl, _no_tokens).thinking_switch


@pytest.mark.parametrize("kind,tail,prefill", [
    ("hermes_json", "<|im_start|>assistant\n<think>\n", "<think>"),
    ("hermes_json", "<|im_start|>assistant\n<think>\n\n</think>\n\n", ""),
    ("hermes_json", "<|im_start|>assistant\n", ""),
    ("gemma4", "<|turn>model\n<|channel>thought\n<channel|>", ""),
    ("gemma4", "<|turn>model\n<|channel>thought\n", "<|channel>"),
    ("harmony", "<|start|>user<|message|>hi<|end|><|start|>assistant", "assistant"),
    ("content_only", "<｜Assistant｜><think>\n", "<think>"),
])
def test_format_prefill(kind: str, tail: str, prefill: str) -> None:
    assert format_prefill(spec_for_kind(kind), tail) == prefill


def test_prefill_is_empty_without_reasoning() -> None:
    spec = spec_for_kind("hermes_json", reasoning=False)
    assert format_prefill(spec, "<think>\n") == ""


def test_unknown_format_name_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="hermes_json"):
        spec_for_kind("nope")
