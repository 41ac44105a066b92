"""jinja_from_go: an Ollama Modelfile TEMPLATE (Go text/template, as Ollama executes it) as
a Jinja chat template, so a variant made by /api/create renders its prompts through the
same sandboxed chat-template path as every model (npu.ChatTemplate).

What Ollama does, and the Jinja does the same (read in ollama/ollama template/template.go):
- A template that reads `.Messages` gets `.System` (every system message, joined by a blank
  line), `.Messages` (consecutive messages of one role merged, tool results kept apart),
  `.Tools`, `.Response` "" and `.Think`.
- Any other ("legacy") template is executed once per exchange with `.System`, `.Prompt` and
  `.Response`; the last one is cut after `{{ .Response }}`, so the prompt ends where the
  model's answer starts.
- A message's content given as OpenAI's parts is its text parts joined (Ollama's is text).
- Fields are the messages' and tools' JSON names (`.Role`, `.Content`, `.ToolCalls`,
  `.Function.Arguments`); `$` is the top, `$x := ...` and `$x = ...` set variables, `range`
  (with `$i, $m :=`), `if`/`else if`/`else`, `with`, `break`/`continue`, trim markers
  `{{-`/`-}}`, comments; functions `eq ne lt le gt ge and or not len index slice json`.

Anything else (`define`, `template`, `block`, `printf`, a method call) is a
`GoTemplateError` naming it. No Ray, no I/O.
"""

from __future__ import annotations

import json
import re

__all__ = ["GoTemplateError", "is_go_template", "jinja_from_go"]


class GoTemplateError(ValueError):
    """The template is not one this translation reads (the message says what)."""


_ACTION = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.S)
_TOKEN = re.compile(r"""\s*(?:
    (?P<str>"(?:[^"\\]|\\.)*"|`[^`]*`)
  | (?P<num>-?\d+(?:\.\d+)?)
  | (?P<decl>:=)
  | (?P<assign>=)
  | (?P<punct>[(),|])
  | (?P<var>\$[A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)
  | (?P<field>(?:\.[A-Za-z_][A-Za-z0-9_]*)+|\.)
  | (?P<word>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)
)""", re.X)
# the top's fields in Jinja (legacy templates get _system/_prompt/_response per exchange)
_ROOT = {"System": "_system", "Prompt": "_prompt", "Response": "_response",
         "Messages": "_messages", "Tools": "tools", "Suffix": '""',
         "Think": "(enable_thinking is defined and enable_thinking)",
         "IsThinkSet": "(enable_thinking is defined and enable_thinking is not none)",
         "ThinkLevel": '(reasoning_effort | default(""))'}
# Ollama's api.Message fields whose JSON names are not the snake_case of the Go name
_FIELDS = {"ToolCallID": "tool_call_id", "Thinking": "reasoning_content"}
# how Go prints a value: nil as nothing (Ollama's fields are "" then), booleans as Go spells
# them, maps and lists as JSON (Ollama's tools and tool-call arguments print as JSON)
_PRINT = ('{{ "" if _o is none else ("true" if _o else "false") if _o is boolean else _o '
          'if _o is string or _o is number else (_o | tojson(separators=(",", ":"))) '
          'if _o is mapping or _o is iterable else _o }}')
_COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def is_go_template(source: str) -> bool:
    """Whether `source` reads as a Go template (`{{ .Field }}`, `{{ if ... }}`) rather than
    a Jinja chat template (`{% ... %}`, `{{ messages ... }}`)."""
    if "{%" in source:
        return False
    return bool(re.search(r"\{\{-?\s*(?:\.|\$|if\b|range\b|end\b|with\b|/\*)", source))


def jinja_from_go(source: str) -> str:
    """The Jinja chat template that renders what Ollama renders with `source`.

    Raises:
        GoTemplateError: a construct this translation does not read, or unbalanced blocks.
    """
    items = _lex(source)
    legacy = not any(kind == "action" and re.search(r"\.Messages\b", body)
                     for kind, body in items)
    head = ('{%- set _c = namespace(system=[], messages=[]) -%}'
            '{%- for _m in messages -%}'
            '{%- if _m.content is iterable and _m.content is not string and _m.content is '
            'not mapping %}{% set _m = dict(_m, content=_m.content | selectattr("text", '
            '"defined") | map(attribute="text") | join) %}{% endif -%}'
            '{%- if _m.role == "system" %}{% set _c.system = _c.system + [_m.content] %}'
            '{% endif -%}'
            '{%- if _c.messages and _c.messages[-1].role == _m.role and _m.role != "tool" -%}'
            '{%- set _c.messages = _c.messages[:-1] + [dict(_c.messages[-1], content='
            '(_c.messages[-1].content or "") ~ "\\n\\n" ~ (_m.content or ""))] -%}'
            '{%- else %}{% set _c.messages = _c.messages + [_m] %}{% endif -%}'
            '{%- endfor -%}')
    if not legacy:
        return (head + '{%- set _system = _c.system | join("\\n\\n") -%}'
                '{%- set _messages = _c.messages -%}{%- set _prompt = "" -%}'
                '{%- set _response = "" -%}{%- set _v = namespace() -%}'
                + _Translator().run(items))
    cut = _cut_after_response(items)
    turn = "{%- set _v = namespace() -%}" + _Translator().run(items)
    last = "{%- set _v = namespace() -%}" + _Translator().run(cut, cut=True)
    reset = ('{%- set _l.system = "" %}{% set _l.prompt = "" %}'
             '{% set _l.response = "" -%}')
    return (head
            + "{%- macro _turn(_system, _prompt, _response) -%}" + turn + "{%- endmacro -%}"
            + "{%- macro _last(_system, _prompt, _response) -%}" + last + "{%- endmacro -%}"
            '{%- set _l = namespace(system="", prompt="", response="") -%}'
            '{%- for _m in _c.messages -%}'
            '{%- if _m.role == "system" -%}'
            '{%- if _l.prompt or _l.response %}{{ _turn(_l.system, _l.prompt, _l.response) }}'
            + reset + '{% endif -%}{%- set _l.system = _m.content or "" -%}'
            '{%- elif _m.role == "user" -%}'
            '{%- if _l.response %}{{ _turn(_l.system, _l.prompt, _l.response) }}'
            + reset + '{% endif -%}{%- set _l.prompt = _m.content or "" -%}'
            '{%- elif _m.role == "assistant" -%}{%- set _l.response = _m.content or "" -%}'
            '{%- endif -%}{%- endfor -%}'
            '{{ _last(_l.system, _l.prompt, _l.response) }}')


def _lex(source: str) -> list[tuple[str, str]]:
    """("text", text) and ("action", body) items, trim markers applied, comments dropped."""
    out: list[tuple[str, str]] = []
    at, trim_next = 0, False
    for m in _ACTION.finditer(source):
        text = source[at:m.start()]
        if trim_next:
            text = text.lstrip()
        if m.group(1):
            text = text.rstrip()
        if text:
            out.append(("text", text))
        body = m.group(2).strip()
        if not (body.startswith("/*") and body.endswith("*/")):
            out.append(("action", body))
        trim_next = bool(m.group(3))
        at = m.end()
    text = source[at:]
    if trim_next:
        text = text.lstrip()
    if "{{" in text:
        raise GoTemplateError("an action '{{' is not closed with '}}'")
    if text:
        out.append(("text", text))
    return out


def _cut_after_response(items: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The items up to the first action that prints `.Response` (Ollama's last exchange)."""
    for i, (kind, body) in enumerate(items):
        if kind == "action" and re.search(r"\.Response\b", body) and not re.match(
                r"(if|else|range|with)\b", body):
            return items[: i + 1]
    return items


def _tokens(body: str) -> list[tuple[str, str]]:
    out, at = [], 0
    body = body.rstrip()
    while at < len(body):
        m = _TOKEN.match(body, at)
        if m is None or m.end() == at:
            raise GoTemplateError(f"cannot read '{body[at:at + 20]}' in {{{{ {body} }}}}")
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        at = m.end()
    return out


class _Translator:
    """Go template items -> Jinja (block stack: what each `end` closes, and the dot)."""

    def __init__(self) -> None:
        self.blocks: list[str] = []  # "if", "for", "with"
        self.dots: list[str] = ["$"]  # the dot of each open block ("$": the top)
        self.n = 0

    def run(self, items: list[tuple[str, str]], *, cut: bool = False) -> str:
        """Jinja of `items`; `cut`: a template cut short on purpose (its open blocks are
        closed), else an open block is an error, as Go's parser ends at "unexpected EOF"."""
        out = []
        for kind, body in items:
            out.append(self.text(body) if kind == "text" else self.action(body))
        if self.blocks and not cut:
            raise GoTemplateError(f"an '{self.blocks[-1].replace('for', 'range')}' is not "
                                  "closed with {{ end }} (unexpected EOF)")
        while self.blocks:  # a cut template: close what is open
            out.append(self.end())
        return "".join(out)

    @staticmethod
    def text(text: str) -> str:
        return "{{ " + _literal(text) + " }}"

    def action(self, body: str) -> str:
        word = body.split(None, 1)[0] if body else ""
        rest = body[len(word):].strip()
        if word == "if":
            self.blocks.append("if")
            self.dots.append(self.dots[-1])
            return "{% if " + self.expr(_tokens(rest)) + " %}"
        if word == "else":
            if not self.blocks:
                raise GoTemplateError("'else' outside an if or range")
            if rest.startswith("if "):
                return "{% elif " + self.expr(_tokens(rest[3:])) + " %}"
            if rest:
                raise GoTemplateError(f"cannot read {{{{ else {rest} }}}}")
            if self.blocks[-1] != "if":
                raise GoTemplateError("'else' of a range or with is not supported")
            return "{% else %}"
        if word == "end":
            if not self.blocks:
                raise GoTemplateError("'end' without an open if, range or with")
            return self.end()
        if word == "range":
            return self.range(_tokens(rest))
        if word == "with":
            self.n += 1
            name, value = f"_w{self.n}", self.expr(_tokens(rest))
            self.blocks.append("with")
            self.dots.append(name)
            return "{% set " + name + " = " + value + " %}{% if " + name + " %}"
        if word in ("break", "continue"):
            return "{% " + word + " %}"
        if word in ("define", "template", "block"):
            raise GoTemplateError(f"'{word}' is not supported in a variant's template")
        toks = _tokens(body)
        if len(toks) >= 2 and toks[0][0] == "var" and toks[1][0] in ("decl", "assign"):
            return "{% set " + self.var(toks[0][1]) + " = " + self.expr(toks[2:]) + " %}"
        if len(toks) == 1 and toks[0][0] == "str":  # text as it is
            return "{{ " + self.expr(toks) + " }}"
        return "{% set _o = " + self.expr(toks) + " %}" + _PRINT

    def end(self) -> str:
        kind = self.blocks.pop()
        self.dots.pop()
        return {"if": "{% endif %}", "with": "{% endif %}", "for": "{% endfor %}"}[kind]

    def range(self, toks: list[tuple[str, str]]) -> str:
        names: list[str] = []
        if any(k == "decl" for k, _ in toks):
            at = next(i for i, (k, _) in enumerate(toks) if k == "decl")
            names = [v for k, v in toks[:at] if k == "var"]
            toks = toks[at + 1:]
        self.n += 1
        item = f"_r{self.n}"
        sets = ""
        if len(names) == 2:
            sets = ("{% set " + self.var(names[0]) + " = loop.index0 %}{% set "
                    + self.var(names[1]) + " = " + item + " %}")
        elif len(names) == 1:
            sets = "{% set " + self.var(names[0]) + " = " + item + " %}"
        source = self.expr(toks)
        self.blocks.append("for")
        self.dots.append(item)
        return "{% for " + item + " in " + source + " %}" + sets

    @staticmethod
    def var(name: str) -> str:
        if name == "$" or "." in name:
            raise GoTemplateError(f"cannot set {name}")
        return "_v." + name[1:]

    # -- expressions -------------------------------------------------------------------
    def expr(self, toks: list[tuple[str, str]]) -> str:
        """A pipeline: commands joined by '|', each one's value the next one's last
        argument."""
        commands, cur, depth = [], [], 0
        for tok in toks:
            if tok == ("punct", "("):
                depth += 1
            elif tok == ("punct", ")"):
                depth -= 1
            if tok == ("punct", "|") and depth == 0:
                commands.append(cur)
                cur = []
            else:
                cur.append(tok)
        commands.append(cur)
        value = None
        for cmd in commands:
            args = self.operands(cmd)
            if value is not None:
                args.append(value)
            value = self.call(args, cmd)
        if value is None:
            raise GoTemplateError("an empty action")
        return value

    def operands(self, toks: list[tuple[str, str]]) -> list[str | tuple[str]]:
        """Each operand in Jinja, or ("word",) for a function's name."""
        out: list[str | tuple[str]] = []
        i = 0
        while i < len(toks):
            kind, text = toks[i]
            if text == "(" and kind == "punct":
                depth, j = 1, i + 1
                while j < len(toks) and depth:
                    depth += {"(": 1, ")": -1}.get(toks[j][1], 0) if toks[j][0] == "punct" \
                        else 0
                    j += 1
                if depth:
                    raise GoTemplateError("unbalanced parentheses")
                out.append("(" + self.expr(toks[i + 1:j - 1]) + ")")
                i = j
                continue
            if kind == "str":
                out.append(_literal(_go_string(text)))
            elif kind == "num":
                out.append(text)
            elif kind == "field":
                out.append(self.field(self.dots[-1], text))
            elif kind == "var":
                name, _, rest = text.partition(".")
                base = "$" if name == "$" else "_v." + name[1:]
                out.append(self.field(base, "." + rest) if rest else
                           (self.field("$", ".") if name == "$" else base))
            elif kind == "word":
                if text in ("true", "false"):
                    out.append(text)
                elif text == "nil":
                    out.append("none")
                else:
                    out.append((text,))
            else:
                raise GoTemplateError(f"cannot read '{text}' here")
            i += 1
        return out

    @staticmethod
    def field(base: str, path: str) -> str:
        """`.A.B` read from `base` ("$": the top)."""
        if path == ".":
            if base == "$":
                raise GoTemplateError("the top '.' itself cannot be printed or passed")
            return base
        parts = path.strip(".").split(".")
        if base == "$":
            first = parts.pop(0)
            if first not in _ROOT:
                raise GoTemplateError(f"unknown field .{first} (known: "
                                      + ", ".join(f".{k}" for k in _ROOT) + ")")
            base = _ROOT[first]
        for p in parts:
            base += "[" + _literal(_FIELDS.get(p) or _snake(p)) + "]"
        return base

    def call(self, args: list, cmd: list) -> str:
        if not args:
            raise GoTemplateError("an empty command")
        head = args[0]
        if not isinstance(head, tuple):
            if len(args) != 1:
                raise GoTemplateError(f"cannot call a value: {' '.join(t for _, t in cmd)}")
            return head
        fn, rest = head[0], [a for a in args[1:]]
        if any(isinstance(a, tuple) for a in rest):
            raise GoTemplateError(f"'{fn}': a function as an argument needs parentheses")
        if fn in _COMPARE and len(rest) >= 2:
            if fn == "eq":
                return "(" + " or ".join(f"{rest[0]} == {b}" for b in rest[1:]) + ")"
            return f"({rest[0]} {_COMPARE[fn]} {rest[1]})"
        if fn in ("and", "or") and rest:
            return "(" + f" {fn} ".join(rest) + ")"
        if fn == "not" and len(rest) == 1:
            return f"(not {rest[0]})"
        if fn == "len" and len(rest) == 1:
            return f"({rest[0]} | length)"
        if fn == "index" and rest:
            return rest[0] + "".join(f"[{k}]" for k in rest[1:])
        if fn == "slice" and 1 <= len(rest) <= 3:
            bounds = rest[1:] + [""] * (2 - len(rest[1:]))
            return f"{rest[0]}[{bounds[0]}:{bounds[1]}]"
        if fn == "json" and len(rest) == 1:
            return f"({rest[0]} | tojson(separators=(\",\", \":\")))"
        raise GoTemplateError(f"the function '{fn}' (with {len(rest)} arguments) is not "
                              "supported in a variant's template")


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()


def _go_string(text: str) -> str:
    if text.startswith("`"):
        return text[1:-1]
    try:
        return json.loads(text)
    except ValueError:
        raise GoTemplateError(f"cannot read the string {text}") from None


def _literal(text: str) -> str:
    """A Jinja string literal of `text`, its newlines and markers kept as they are (the
    chat format detection reads the template's source)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
