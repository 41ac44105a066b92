"""parse_modelfile: an Ollama Modelfile's instructions (FROM, SYSTEM, TEMPLATE, PARAMETER) as
/api/create's fields, for clients that still send `modelfile` text (Ollama's older API).

Read as Ollama's parser reads them: an instruction per line (any case), `#` comments, a
value on one line or between triple quotes over several, a quoted value unquoted; a
PARAMETER repeated (`stop`) is a list, LICENSE repeated a list of licenses. ADAPTER and
MESSAGE are refused by name; REQUIRES is ignored. No I/O.
"""

from __future__ import annotations

import json
import re
from typing import Any

from deployments.errors import ApiError

_LINE = re.compile(r"^\s*([A-Za-z]+)\s+(.*)$")


def parse_modelfile(text: str) -> dict[str, Any]:
    """`from`, `system`, `template` and `parameters` of a Modelfile (absent ones left out).

    Raises:
        ApiError: 400 naming the line or the instruction that cannot be made here.
    """
    out: dict[str, Any] = {}
    params: dict[str, Any] = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _LINE.match(line)
        if m is None:
            raise ApiError(400, f"modelfile line {i}: expected an instruction and a value: "
                                f"{line.strip()[:60]!r}", param="modelfile")
        word, value = m[1].upper(), m[2].strip()
        if value.startswith('"""'):  # over several lines, to the closing triple quote
            parts = [value[3:]]  # each line looked at once (a body of lines is not searched)
            while '"""' not in parts[-1] and i < len(lines):
                parts.append(lines[i])
                i += 1
            if '"""' not in parts[-1]:
                raise ApiError(400, f"modelfile: the {word} value's '\"\"\"' is not closed.",
                               param="modelfile")
            body = "\n".join(parts)
            value = body[:body.index('"""')]
        else:
            value = _unquote(value)
        if word == "FROM":
            out["from"] = value
        elif word in ("SYSTEM", "TEMPLATE"):
            out[word.lower()] = value
        elif word == "PARAMETER":
            key, _, raw = value.partition(" ")
            parsed = _value(_unquote(raw.strip()))
            if key in params or key == "stop":
                held = params.get(key, [])
                params[key] = (held if isinstance(held, list) else [held]) + [str(parsed)
                               if key == "stop" else parsed]
            else:
                params[key] = parsed
        elif word in ("ADAPTER", "MESSAGE"):
            raise ApiError(400, f"modelfile: {word} is not supported here (a variant has a "
                                "system prompt, a template and parameters).",
                           param="modelfile")
        elif word == "LICENSE":
            out.setdefault("license", []).append(value)
        elif word != "REQUIRES":
            raise ApiError(400, f"modelfile line {i}: unknown instruction {m[1]!r} (FROM, "
                                "SYSTEM, TEMPLATE, PARAMETER).", param="modelfile")
    if params:
        out["parameters"] = params
    return out


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] == '"':
        try:
            return json.loads(value)
        except ValueError:
            return value[1:-1]
    return value


def _value(text: str) -> Any:
    """A PARAMETER's value: a number or a boolean when it reads as one, else the text."""
    if text in ("true", "false"):
        return text == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text
