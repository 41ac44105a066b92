"""ChatTemplate: Hugging Face chat templates rendered in a sandboxed Jinja environment.

The environment is the one transformers uses: `ImmutableSandboxedEnvironment` with
`trim_blocks`/`lstrip_blocks`, loop controls, the `{% generation %}` tag, the globals
`raise_exception` and `strftime_now`, and `tojson` as HF defines it. A template that
reaches for Python internals fails with a `ModelError`, never a crash.
"""

from __future__ import annotations

import hashlib
import json
import string
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from npu.errors import ModelError

_PROBE_TOOL = {"type": "function", "function": {
    "name": "probe_tool_x9", "description": "probe",
    "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}}}


class TemplateError(ModelError):
    """The template raised or could not be rendered; the message says why."""


def _environment():
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(Extension):
        """`{% generation %}...{% endgeneration %}` (HF's assistant-mask marker): renders its
        body."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(
                lineno)

        def _render(self, caller):
            return caller()

    def raise_exception(message):
        raise TemplateError(f"the chat template refused the conversation: {message}")

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def _described(tools: list[dict] | None) -> list[dict] | None:
    """The tools with "" for each function's missing description (optional in OpenAI's API;
    some templates write `"// " + tool.description`); None when none is missing."""
    out, missing = [], False
    for tool in tools or []:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and fn.get("description") is None:
            tool, missing = {**tool, "function": {**fn, "description": ""}}, True
        out.append(tool)
    return out if missing else None


def _retries(context: dict[str, Any], tools: list[dict] | None, *, merge: bool):
    """The contexts to render again with, in turn, when a template fails on `context`: a
    tool without a description as "" (templates write `"// " + tool.description`); no
    tools as an empty list (a template that loops over `tools` whatever they are: Hermes'
    tool_use one, served alone); then (`merge`) the conversation as the strictest templates
    take it (Gemma's and Mistral's refuse two system messages or two user turns in a row,
    which agents send): its system messages as one, neighbouring turns of one role as one;
    and with each call its own assistant turn (Llama 3.x's take one call a turn)."""
    fixed = _described(tools) if tools else []
    tried = {**context, "tools": fixed} if fixed is not None else context
    if tried is not context:
        yield tried
    if merge:
        messages = _neighbours_as_one(_systems_as_one(context["messages"]))
        one_each = _one_call_each(messages)
        # the request's own tools first (an empty list makes Nemo's write an empty tools block)
        for base in (context, tried) if tried is not context else (context,):
            if messages != context["messages"]:
                yield {**base, "messages": messages}
            if one_each != messages:
                yield {**base, "messages": one_each}


# what the templates that insist on an order of roles say (Gemma's, Mistral's, Llama 2's)
_ORDER_CHECK = "must alternate"


def _order_unchecked():
    """A `raise_exception` that lets a complaint about the order of roles pass and raises
    any other (a call id Mistral refuses, a role a template does not know)."""
    def raise_exception(message: str) -> str:
        if _ORDER_CHECK in str(message).lower():
            return ""
        raise TemplateError(f"the chat template refused the conversation: {message}")
    return raise_exception


def _shows_every_text(messages: list[dict], text: str) -> bool:
    """Whether every message's text but the system prompt's is in `text`, in order: a render
    that skipped a check wrote the whole conversation, not what a template writes when it
    has refused (a system prompt it leaves out is mended after, see `_drops_a_system`)."""
    at = 0
    for m in messages:
        piece = _text(m.get("content")).strip() if isinstance(m, dict) else ""
        if not piece or m.get("role") == "system":
            continue
        found = text.find(piece, at)
        if found < 0:
            return False
        at = found + len(piece)
    return bool(text)


def _one_call_each(messages: list[dict]) -> list[dict]:
    """The conversation with an assistant turn of several calls as one turn a call (its
    text on the first), as a template that takes one call a turn shows them."""
    out: list[dict] = []
    for m in messages:
        calls = m.get("tool_calls") if isinstance(m, dict) else None
        if isinstance(calls, list) and len(calls) > 1 and m.get("role") == "assistant":
            out.extend({**m, "content": m.get("content") if i == 0 else "",
                        "tool_calls": [call]} for i, call in enumerate(calls))
        else:
            out.append(m)
    return out


def _drops_a_system(messages: list[dict], text: str) -> bool:
    """Whether a system message's text is not in `text` (whitespace aside: a template that
    trims it or writes its lines on one keeps it). Runs on every render: the prompt is
    only normalised where a text is not found as it is."""
    systems = [_text(m.get("content")).strip() for m in messages if m.get("role") == "system"]
    missing = [s for s in systems if s and s not in text]
    if not missing:
        return False
    shown = " ".join(text.split())
    return any(" ".join(s.split()) not in shown for s in missing)


def _system_into_user(messages: list[dict]) -> list[dict]:
    """The conversation with its system messages' text at the head of the first user turn
    (a turn of its own where there is none)."""
    system = "\n\n".join(_text(m.get("content")) for m in messages if m.get("role") == "system")
    out = [m for m in messages if m.get("role") != "system"]
    if not system:
        return out
    for i, m in enumerate(out):
        if m.get("role") == "user":
            out[i] = {**m, "content": system + "\n\n" + _text(m.get("content"))}
            return out
    return [{"role": "user", "content": system}] + out


def _systems_as_one(messages: list[dict]) -> list[dict]:
    """The conversation with its system messages as one, first, their texts parted by a
    blank line."""
    systems = [m for m in messages if m.get("role") == "system"]
    if not systems:
        return messages
    one = {**systems[0], "content": "\n\n".join(_text(m.get("content")) for m in systems)}
    return [one] + [m for m in messages if m.get("role") != "system"]


def _neighbours_as_one(messages: list[dict]) -> list[dict]:
    """The conversation with neighbouring user (or assistant, without calls) messages as
    one, their texts parted by a blank line (some templates insist on alternation)."""
    out: list[dict] = []
    for m in messages:
        if (out and m.get("role") in ("user", "assistant") and m.get("role") ==
                out[-1].get("role") and not m.get("tool_calls")
                and not out[-1].get("tool_calls")):
            out[-1] = {**out[-1], "content": _text(out[-1].get("content")) + "\n\n"
                       + _text(m.get("content"))}
        else:
            out.append(m)
    return out


def _arguments_as_objects(messages: list[dict]) -> list[dict]:
    """Tool-call arguments arrive as JSON text (OpenAI); templates expect objects. An
    assistant's content that is null or absent beside its calls (OpenAI's reply, sent back
    as it came) is "" (templates concatenate it or test it with `in`), as llama.cpp reads it;
    its `reasoning_content` is also its `thinking`, the name gpt-oss's template reads (as
    llama.cpp passes it; not beside calls and text, which that template refuses together)."""
    out = []
    for m in messages:
        calls = m.get("tool_calls") if isinstance(m, dict) else None
        if isinstance(m, dict) and m.get("role") == "assistant" and m.get("content") is None:
            m = {**m, "content": ""}
        if isinstance(m, dict) and m.get("role") == "assistant" and "thinking" not in m \
                and isinstance(m.get("reasoning_content"), str) and m["reasoning_content"] \
                and not (calls and m.get("content")):
            m = {**m, "thinking": m["reasoning_content"]}
        if calls:
            m = dict(m)
            fixed = []
            for call in calls:
                call = dict(call)
                fn = dict(call.get("function") or {})
                args = fn.get("arguments")
                if isinstance(args, str):
                    try:
                        fn["arguments"] = json.loads(args) if args.strip() else {}
                    except ValueError:
                        pass
                call["function"] = fn
                fixed.append(call)
            m["tool_calls"] = fixed
        out.append(m)
    return out


def _readable(arguments: Any) -> bool:
    """Whether a call's arguments are an object, or JSON text of one (a polyfill's)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return False
    return isinstance(arguments, dict)


def _objects_only(messages: list[dict]) -> list[dict] | None:
    """`messages` with each call's arguments that are no JSON object (a call cut short by
    max_tokens, sent back as it came: `{"city": "Par`) as {}; None where all are objects."""
    def args(call: dict) -> Any:
        return (call.get("function") or {}).get("arguments", {})

    out, changed = [], False
    for m in messages:
        calls = m.get("tool_calls") if isinstance(m, dict) else None
        if calls:  # each call's arguments read once
            kept = [c if _readable(args(c)) else
                    {**c, "function": {**c["function"], "arguments": {}}} for c in calls]
            if any(k is not c for k, c in zip(kept, calls)):
                changed = True
                m = {**m, "tool_calls": kept}
        out.append(m)
    return out if changed else None


class Capabilities:
    """What a template renders natively (probed once, as llama.cpp's minja does)."""

    def __init__(self, render) -> None:
        def shows(messages, needle, **kw) -> bool:
            try:
                return needle in render(messages, **kw)
            except ModelError:
                return False

        user = {"role": "user", "content": "probe_user_x9"}
        call = {"id": "call_probe", "type": "function",
                "function": {"name": "probe_tool_x9", "arguments": {"probe_arg_x9": 1}}}
        asst = {"role": "assistant", "content": "", "tool_calls": [call]}
        self.system = shows([{"role": "system", "content": "probe_system_x9"}, user],
                            "probe_system_x9")
        self.tool_calls = shows([user, asst], "probe_tool_x9")
        # Mistral's templates refuse a call id that is not 9 alphanumerics (OpenAI's are
        # `call_` + 24): such a template gets every id as 9 (see `_short_ids`)
        self.short_ids = not self.tool_calls and shows(_short_ids([user, asst]),
                                                       "probe_tool_x9")
        if self.short_ids:
            self.tool_calls = True
        string_call = {**call, "function": {**call["function"],
                                            "arguments": '{"probe_arg_x9": 1}'}}
        self.string_arguments = (not self.tool_calls and shows(
            [user, {**asst, "tool_calls": [string_call]}], "probe_tool_x9"))
        if self.string_arguments:
            self.tool_calls = True
        tool_msg = {"role": "tool", "tool_call_id": "call_probe", "name": "probe_tool_x9",
                    "content": "probe_result_x9"}
        probe = [user, asst if self.tool_calls else {"role": "assistant", "content": "ok"},
                 tool_msg]
        self.tool_results = shows(_short_ids(probe) if self.short_ids else probe,
                                  "probe_result_x9")
        # content as a list of text parts (OpenAI's, the SDKs' and most apps'): rendered as
        # text, not dropped, refused or written as the list's repr (as minja probes it)
        typed = [{"role": "user", "content": [{"type": "text", "text": "probe_user_x9"}]}]
        try:
            shown = render(typed)
            self.typed_content = "probe_user_x9" in shown and not any(
                r in shown for r in ("'type': 'text'", '"type": "text"', '"type":"text"'))
        except ModelError:
            self.typed_content = False


_ALNUM = string.ascii_letters + string.digits


def _short_id(key: str) -> str:
    """`key` as 9 alphanumerics: itself where it is such, else a digest of it (the same key
    gives the same id, so a call and its result still match)."""
    if len(key) == 9 and key.isascii() and key.isalnum():
        return key
    digest = hashlib.sha256(key.encode()).digest()
    return "".join(_ALNUM[b % len(_ALNUM)] for b in digest[:9])


def _short_ids(messages: list[dict]) -> list[dict]:
    """The conversation with its tool-call ids as 9 alphanumerics, as Mistral's templates
    demand: each call's id and each result's `tool_call_id` mapped alike; a call without an
    id gets one from its place, a result without one its turn's next unanswered call of its
    name (or of any)."""
    out: list[dict] = []
    waiting: list[tuple[str, str]] = []  # (id, function name) of the calls not yet answered
    for at, m in enumerate(messages):
        if not isinstance(m, dict):
            out.append(m)
            continue
        if m.get("role") == "assistant" and m.get("tool_calls"):
            calls = []
            for i, call in enumerate(m["tool_calls"]):
                key = call.get("id") if isinstance(call, dict) else None
                short = _short_id(key if isinstance(key, str) and key else f"call-{at}-{i}")
                calls.append({**call, "id": short} if isinstance(call, dict) else call)
            waiting = [(c["id"], (c.get("function") or {}).get("name"))
                       for c in calls if isinstance(c, dict)]
            m = {**m, "tool_calls": calls}
        elif m.get("role") == "tool":
            key = m.get("tool_call_id")
            if isinstance(key, str) and key:
                short = _short_id(key)
            else:  # the next unanswered call of its name (Ollama's `tool_name`), or of any
                name = m.get("name") or m.get("tool_name")
                named = [w for w in waiting if w[1] == name]
                short = (named or waiting or [(_short_id(f"result-{at}"), None)])[0][0]
            waiting = [w for w in waiting if w[0] != short]
            m = {**m, "tool_call_id": short}
        elif m.get("role") == "user":
            waiting = []
        out.append(m)
    return out


# the roles whose text parts are joined even for a template that reads parts
_STRING_ROLES = ("system", "developer", "tool")

# what joins a message's text parts where the template reads its content as one string
# (llama.cpp's and vLLM's choice)
PARTS_JOIN = "\n"


def _text(content: Any, join: str = PARTS_JOIN) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return join.join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _as_strings(messages: list[dict], roles: tuple[str, ...] | None = None) -> list[dict]:
    """The messages (of `roles`; None: all) with each list of text parts as one string
    (PARTS_JOIN between)."""
    return [{**m, "content": _text(m["content"])}
            if isinstance(m, dict) and isinstance(m.get("content"), list)
            and (roles is None or m.get("role") in roles) else m
            for m in messages]


# stands in for the last message's text to find where a template writes it (private-use
# characters: no template writes them, no trimming touches them)
_SENTINEL = "\ue000flm-continue\ue001"


def _final_text(messages: list[dict], join: str) -> str:
    last = messages[-1] if messages else {}
    if last.get("role") != "assistant":
        raise TemplateError("only a conversation that ends with an assistant message can be "
                            "continued")
    return _text(last.get("content"), join)


def polyfill(messages: list[dict], caps: Capabilities) -> list[dict]:
    """Rewrite a conversation into what the template can show: the system prompt into the
    first user turn, tool calls into assistant text, tool results into user turns; then
    merge neighbours of the same role (some templates insist on alternation)."""
    out: list[dict] = []
    for m in messages if caps.system else _system_into_user(messages):
        role = m.get("role")
        if role == "assistant" and m.get("tool_calls") and not caps.tool_calls:
            calls = [{"name": (c.get("function") or {}).get("name"),
                      "arguments": (c.get("function") or {}).get("arguments")}
                     for c in m["tool_calls"]]
            body = _text(m.get("content"))
            m = {"role": "assistant",
                 "content": (body + "\n" if body else "") + json.dumps({"tool_calls": calls})}
        elif role == "assistant" and m.get("tool_calls") and caps.string_arguments:
            m = dict(m)
            m["tool_calls"] = [{**c, "function": {**c["function"], "arguments": json.dumps(
                c["function"]["arguments"]) if not isinstance(c["function"]["arguments"], str)
                else c["function"]["arguments"]}} for c in m["tool_calls"]]
        elif role == "tool" and not caps.tool_results:
            m = {"role": "user", "content": f"Tool result ({m.get('name') or 'tool'}): "
                                            f"{_text(m.get('content'))}"}
        out.append(m)
    if caps.tool_results and caps.system:
        return out
    return _neighbours_as_one(out)


class ChatTemplate:
    """A compiled chat template.

    Args:
        source: the Jinja source.
        bos_token / eos_token: the strings templates may write.
    """

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "") -> None:
        import jinja2

        self.source = source
        self.bos_token, self.eos_token = bos_token, eos_token
        self._caps: Capabilities | None = None
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"the chat template does not compile: {exc}") from None

    def render(self, messages: list[dict], tools: list[dict] | None = None, *,
               add_generation_prompt: bool = True, enable_thinking: bool | None = None,
               continue_final: bool = False, _native: bool = False, **kwargs: Any) -> str:
        """Render a conversation. What the template cannot show natively (a system prompt,
        tool calls, tool results) is rewritten first, see `polyfill`. `continue_final`: the
        last message is an assistant turn the model goes on writing (a prefill): the text
        ends with that message's text, without what closes its turn (as transformers'
        `continue_final_message`).

        Raises:
            TemplateError: the template raised, or tried something the sandbox forbids; or,
                continuing, the last message is not the assistant's or its text is not in
                what the template wrote.
        """
        if continue_final:
            return self._continued(messages, tools, enable_thinking=enable_thinking,
                                   _native=_native, **kwargs)
        native = _native
        context: dict[str, Any] = dict(kwargs)
        context.update(messages=_arguments_as_objects(messages), tools=tools or None,
                       add_generation_prompt=add_generation_prompt,
                       bos_token=self.bos_token, eos_token=self.eos_token)
        if enable_thinking is not None:
            context["enable_thinking"] = enable_thinking
        if not native:
            caps = self.capabilities
            # a template that reads a user's parts still writes a system prompt or a tool
            # result as a string (`content|string`: Mistral Small 3.2's tool results, its
            # system prompt's first part alone)
            shown = _as_strings(context["messages"],
                                _STRING_ROLES if caps.typed_content else None)
            if caps.short_ids:
                shown = _short_ids(shown)
            context["messages"] = polyfill(shown, caps)
        try:
            text = self._render(context)
        except TemplateError as first:
            text, context = self._refused(first, context, tools, native)
        if not native and _drops_a_system(context["messages"], text):
            # a template that shows one system message (the first, or the last) and drops
            # the others silently (DeepSeek-R1's distills, gpt-oss): they go as one; one
            # that drops it where the conversation does not end with a user turn (Mistral
            # Nemo's writes it in the last user turn only: an agent's turn after tool
            # results): it goes at the head of the first user turn
            for again in (_systems_as_one(context["messages"]),
                          _system_into_user(context["messages"])):
                try:
                    shown = self._render({**context, "messages": again})
                except TemplateError:
                    continue
                if not _drops_a_system(context["messages"], shown):
                    return shown
        return text

    def _refused(self, first: TemplateError, context: dict[str, Any],
                 tools: list[dict] | None, native: bool) -> tuple[str, dict[str, Any]]:
        """What a template that refused `context` renders instead, and the context it took.

        Raises:
            TemplateError: `first`, where nothing mends the refusal.
        """
        for retry in self._attempts(context, tools, native):
            try:
                return self._render(retry), retry
            except TemplateError:
                continue
        if not native and _ORDER_CHECK in str(first).lower():
            # A template whose only objection is the order of roles (Mistral's refuse a
            # user turn right after tool results: Claude Code's tool_result beside text,
            # Codex's output then a message; Gemma's and Mistral's a first assistant turn)
            # renders the conversation as it is, as Ollama's templates do
            merged = _neighbours_as_one(_systems_as_one(context["messages"]))
            lenient = {**context, "messages": merged,
                       "tools": _described(tools) or context["tools"],
                       "raise_exception": _order_unchecked()}
            try:
                text = self._render(lenient)
            except TemplateError:
                text = ""
            if _shows_every_text(merged, text):
                return text, lenient
        raise first from None

    @staticmethod
    def _attempts(context: dict[str, Any], tools: list[dict] | None,
                  native: bool) -> Iterator[dict[str, Any]]:
        """The contexts a refused one is tried as: its retries; then, where a call's
        arguments are no object (a template that reads them as a mapping fails on a call
        cut short), those arguments as {}, and its retries."""
        yield from _retries(context, tools, merge=not native)
        objects = _objects_only(context["messages"])
        if objects is not None:
            mended = {**context, "messages": objects}
            yield mended
            yield from _retries(mended, tools, merge=not native)

    def _render(self, context: dict[str, Any]) -> str:
        """The template on `context`, its failures as TemplateError."""
        import jinja2
        from jinja2.exceptions import SecurityError

        try:
            return self._template.render(**context)
        except TemplateError:
            raise
        except SecurityError as exc:
            raise TemplateError(f"the chat template tried an unsafe operation: {exc}") from None
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError,
                IndexError, ZeroDivisionError) as exc:
            raise TemplateError(f"the chat template failed: {type(exc).__name__}: {exc}") from None

    def _continued(self, messages: list[dict], tools: list[dict] | None,
                   **kwargs: Any) -> str:
        """The conversation rendered whole, cut right after its last message's text: where
        the template writes that message's text (found by rendering a stand-in for it), the
        text as sent, or as the template trims it."""
        # its text parts as we join them, or as a template that reads parts may
        finals = dict.fromkeys(_final_text(messages, join) for join in (PARTS_JOIN, ""))
        text = self.render(messages, tools, add_generation_prompt=False, **kwargs)
        probe = self.render(messages[:-1] + [{**messages[-1], "content": _SENTINEL}], tools,
                            add_generation_prompt=False, **kwargs)
        at = probe.find(_SENTINEL)
        if at >= 0 and text[:at] == probe[:at]:
            for final in finals:
                for piece in (final, final.lstrip(), final.rstrip(), final.strip()):
                    if piece and text.startswith(piece, at):
                        return text[: at + len(piece)]
        raise TemplateError("the chat template does not show the last assistant message's text "
                            "as it was sent, so the model cannot continue it")

    @property
    def capabilities(self) -> Capabilities:
        if self._caps is None:
            self._caps = Capabilities(
                lambda messages, **kw: self.render(messages, add_generation_prompt=False,
                                                   _native=True, **kw))
        return self._caps

    def thinking_enabled(self, enable_thinking: bool | None = None) -> bool:
        """Whether the model thinks when rendered with this switch: the generation prompt
        is the one rendered with thinking explicitly on. A template with no switch thinks
        (or not) on its own: True. (Probed once per switch value.)"""
        cache = self.__dict__.setdefault("_thinking", {})
        if enable_thinking not in cache:
            cache[enable_thinking] = self._probe_thinking(enable_thinking)
        return cache[enable_thinking]

    def _probe_thinking(self, enable_thinking: bool | None) -> bool:
        probe = [{"role": "user", "content": "hi"}]
        try:
            return (self.render(probe, enable_thinking=enable_thinking)
                    == self.render(probe, enable_thinking=True))
        except TemplateError:
            return True

    def tools_enabled(self) -> bool:
        """Whether the template shows the request's tools to the model (probed once)."""
        if "_tools" not in self.__dict__:
            probe = [{"role": "user", "content": "hi"}]
            try:
                self._tools = "probe_tool_x9" in self.render(probe, tools=[_PROBE_TOOL])
            except TemplateError:
                self._tools = False
        return self._tools
