"""Canonical outputs of each format, written the way the constraint grammars spell them."""

from __future__ import annotations

import json

Q = '<|"|>'


def _gemma(value) -> str:
    if isinstance(value, str):
        return Q + value + Q
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_gemma(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_gemma(v) for v in value) + "]"
    return json.dumps(value)


def _py(value) -> str:
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, bool):
        return "True" if value else "False"
    if value is None:
        return "None"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_py(k)}: {_py(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_py(v) for v in value) + "]"
    return json.dumps(value)


def call_text(kind: str, name: str, args: dict) -> str:
    if kind == "hermes_json":
        return ('<tool_call>\n' + json.dumps({"name": name, "arguments": args})
                + "\n</tool_call>")
    if kind == "qwen_xml":
        params = "".join(
            f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n"
            for k, v in args.items())
        return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"
    if kind == "gemma4":
        return f"<|tool_call>call:{name}{_gemma(args)}<tool_call|>"
    if kind == "lfm2_pythonic":
        kwargs = ", ".join(f"{k}={_py(v)}" for k, v in args.items())
        return f"<|tool_call_start|>[{name}({kwargs})]<|tool_call_end|>"
    if kind == "harmony":
        return (f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>"
                f"{json.dumps(args)}<|call|>")
    if kind == "mistral_json":
        return "[TOOL_CALLS]" + json.dumps([{"name": name, "arguments": args}])
    if kind == "mistral_args":
        return f"[TOOL_CALLS]{name}[ARGS]{json.dumps(args)}"
    if kind == "llama3_json":
        return json.dumps({"name": name, "parameters": args})
    raise ValueError(kind)


def calls_text(kind: str, calls: list[tuple[str, dict]]) -> str:
    if kind == "lfm2_pythonic":
        inner = ", ".join(call_text(kind, n, a)[len("<|tool_call_start|>[") : -len(
            ")]<|tool_call_end|>")] + ")" for n, a in calls)
        return f"<|tool_call_start|>[{inner}]<|tool_call_end|>"
    if kind == "mistral_json":
        return "[TOOL_CALLS]" + json.dumps([{"name": n, "arguments": a} for n, a in calls])
    sep = "" if kind in ("gemma4", "harmony", "mistral_args") else "\n"
    return sep.join(call_text(kind, n, a) for n, a in calls)


def reasoning_text(kind: str, text: str) -> str:
    if kind == "gemma4":
        return f"<|channel>thought\n{text}<channel|>"
    if kind == "harmony":
        return f"<|channel|>analysis<|message|>{text}<|end|><|start|>assistant"
    return f"<think>\n{text}\n</think>\n\n"


def final_text(kind: str, text: str) -> str:
    if kind == "harmony":
        return f"<|channel|>final<|message|>{text}<|return|>"
    return text
