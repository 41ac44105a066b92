"""Anthropic's Messages requests on the same pipeline: the wire schema (msgspec Structs), its
content blocks as the chat messages templates read, its tools, tool_choice, output format
and thinking options as the chat library's `ConstraintRequest`; `messages_call` is the
ingress's Call for POST /v1/messages, `chat_request` also what count_tokens counts.

Every error is a 400 whose `param` (and message) names Anthropic's field: `tools[0].name`,
`output_config.format.schema`, `messages[1].content[0].type`.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from actors.events import ChatGenerate
from chat import ConstraintError, constraint_request_from_openai
from deployments.anthropic.reply import PING, MessageBuilder, MessagesReply, new_id
from deployments.body import PARTS_JOIN, decode_json
from deployments.errors import ApiError
from deployments.exchange import Call
from deployments.ingress import Ingress
from deployments.prefill import continuation

# Anthropic's smallest thinking budget
MIN_BUDGET = 1024


# -- the wire schema: unknown fields (cache_control, citations, ...) are accepted ----------
class TextBlock(msgspec.Struct, tag="text", tag_field="type", kw_only=True):
    text: str


class ImageBlock(msgspec.Struct, tag="image", tag_field="type", kw_only=True):
    source: Any = None


class DocumentBlock(msgspec.Struct, tag="document", tag_field="type", kw_only=True):
    source: Any = None
    title: str | None = None
    context: str | None = None


class ToolUseBlock(msgspec.Struct, tag="tool_use", tag_field="type", kw_only=True):
    id: str
    name: str
    input: dict


class ToolResultBlock(msgspec.Struct, tag="tool_result", tag_field="type", kw_only=True):
    tool_use_id: str
    content: str | list[TextBlock | ImageBlock | DocumentBlock] = ""
    is_error: bool | None = None


class ThinkingBlock(msgspec.Struct, tag="thinking", tag_field="type", kw_only=True):
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(msgspec.Struct, tag="redacted_thinking", tag_field="type",
                            kw_only=True):
    data: str = ""


Block = (TextBlock | ImageBlock | DocumentBlock | ToolUseBlock | ToolResultBlock
         | ThinkingBlock | RedactedThinkingBlock)


class MessageIn(msgspec.Struct, kw_only=True):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class Tool(msgspec.Struct, kw_only=True):
    name: str
    input_schema: dict | None = None
    description: str | None = None
    type: str | None = None  # "custom" (or absent); Anthropic's server tools are refused
    strict: bool | None = None  # the input follows input_schema exactly (else a 400)


class ToolChoice(msgspec.Struct, kw_only=True):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(msgspec.Struct, kw_only=True):
    type: Literal["enabled", "adaptive", "between_tools", "disabled"]
    budget_tokens: int | None = None
    display: Literal["summarized", "omitted"] | None = None


class OutputFormat(msgspec.Struct, kw_only=True):
    type: Literal["json_schema"]
    schema: dict


class OutputConfig(msgspec.Struct, kw_only=True):
    format: OutputFormat | None = None
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None


class CountIn(msgspec.Struct, kw_only=True):
    """POST /v1/messages/count_tokens's body (and the fields of every Messages request)."""

    model: str
    messages: Annotated[list[MessageIn], Meta(min_length=1)]
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    output_format: OutputFormat | None = None  # the structured-outputs beta's place for it


class MessagesIn(CountIn, kw_only=True):
    """POST /v1/messages's body. The current SDK no longer sends temperature, top_p and
    top_k; older clients do (Anthropic's ranges). `seed` is an extension (extra_body), as
    in chat completions: same seed, same output."""

    max_tokens: Annotated[int, Meta(ge=1)]
    stream: bool | None = None
    stop_sequences: list[str] | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Meta(ge=0)] | None = None
    seed: int | None = None
    metadata: dict | None = None


BLOCK_TYPES = "text, tool_use, tool_result, thinking and redacted_thinking"


def decode(body: bytes, kind: type[CountIn]) -> CountIn:
    """A typed Messages (or count_tokens) request; a 400 naming the field otherwise (a
    content block of a type this server does not read, such as a server tool's or a search
    result, said so)."""
    try:
        return decode_json(body, kind)
    except ApiError as err:
        param = err.param or ""
        if (param.endswith("].type") and param.startswith(("messages", "system"))
                and "Invalid value" in err.message):
            kind_name = err.message.split("'")[1] if err.message.count("'") >= 2 else "?"
            err.message = (f"'{param}' is '{kind_name}': this server reads {BLOCK_TYPES} "
                           "blocks (text only: no images, documents, search results or "
                           "server tools' blocks).")
        raise


# -- blocks -> chat messages ----------------------------------------------------------------
def _as_text(block: Any) -> Any:
    """A document whose source is text (`{"type": "text", "data": ...}`, or `content`: a
    string or text blocks) as a text block: its title and context, each a line, then its
    text; any other block as it is."""
    source = block.source if isinstance(block, DocumentBlock) else None
    if not isinstance(source, dict):
        return block
    if source.get("type") == "text" and isinstance(source.get("data"), str):
        body = source["data"]
    elif source.get("type") == "content" and isinstance(source.get("content"), str):
        body = source["content"]
    elif source.get("type") == "content" and isinstance(source.get("content"), list) and all(
            isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
            for b in source["content"]):
        body = PARTS_JOIN.join(b["text"] for b in source["content"])
    else:
        return block
    return TextBlock(text=PARTS_JOIN.join(t for t in (block.title, block.context, body) if t))


def _refuse_media(block: Any, where: str) -> None:
    if isinstance(block, (ImageBlock, DocumentBlock)):
        kind = "image" if isinstance(block, ImageBlock) else "document"
        raise ApiError(400, f"'{where}.type' is '{kind}'; this server's models read text "
                            "only, so content blocks must be text.", param=f"{where}.type")


def _text(content: str | list, where: str) -> str:
    """A system prompt's or a tool result's text: a string, or text blocks joined by
    PARTS_JOIN (as the OpenAI API's text parts: two blocks are two texts, not one word)."""
    if isinstance(content, str):
        return content
    content = [_as_text(b) for b in content]
    for j, block in enumerate(content):
        _refuse_media(block, f"{where}[{j}]")
    return PARTS_JOIN.join(b.text for b in content)


class Turn(msgspec.Struct):
    """One turn of the conversation: a role and its blocks, each with the message it was
    sent in and where (`messages[2].content[0]`: a string content is one text block at
    `messages[2].content`); `index` is its first message's."""

    role: str
    index: int
    blocks: list[tuple[int, str, Any]]


# what parts the texts of two consecutive messages of one role, merged into one turn
SEAM = "\n\n"


class _Joined:
    """Texts of one field of a turn: parted by `within` inside a message (a user's blocks by
    PARTS_JOIN, as the OpenAI API's text parts: Claude Code's system reminder and its prompt,
    an MCP tool's texts; an assistant's as they come: one text cut into blocks), by SEAM
    where a non-empty one follows another's from an earlier message."""

    def __init__(self, within: str = "") -> None:
        self.parts: list[str] = []
        self.last = -1  # the message of the last non-empty text
        self.within = within

    def add(self, message: int, text: str) -> None:
        if text:
            if self.parts:
                self.parts.append(SEAM if message != self.last else self.within)
            self.parts.append(text)
            self.last = message

    def text(self) -> str:
        return "".join(self.parts)

    def __bool__(self) -> bool:
        return bool(self.parts)


def turns(messages: list[MessageIn]) -> list[Turn]:
    """The messages as turns: consecutive messages of one role are one turn, their blocks in
    order (Anthropic's rule: "consecutive user or assistant turns in your request will be
    combined into a single turn")."""
    out: list[Turn] = []
    for i, m in enumerate(messages):
        where = f"messages[{i}].content"
        blocks = [(i, where, TextBlock(text=m.content))] if isinstance(m.content, str) else \
            [(i, f"{where}[{j}]", _as_text(b)) for j, b in enumerate(m.content)]
        if out and out[-1].role == m.role:
            out[-1].blocks.extend(blocks)
        else:
            out.append(Turn(m.role, i, blocks))
    return out


def _assistant(blocks: list[tuple[int, str, Any]], names: dict[str, str]) -> dict:
    text, reasoning, calls = _Joined(), _Joined(), []
    for i, at, block in blocks:
        _refuse_media(block, at)
        if isinstance(block, TextBlock):
            text.add(i, block.text)
        elif isinstance(block, ThinkingBlock):
            reasoning.add(i, block.thinking)
        elif isinstance(block, ToolUseBlock):
            names[block.id] = block.name
            calls.append({"id": block.id, "type": "function", "function": {
                "name": block.name, "arguments": json.dumps(block.input, ensure_ascii=False)}})
        elif isinstance(block, ToolResultBlock):
            raise ApiError(400, f"'{at}' is a tool_result; tool results go in a user turn.",
                           param=f"{at}.type")
        # redacted_thinking: nothing a template can read
    msg: dict[str, Any] = {"role": "assistant", "content": text.text()}
    if reasoning:
        msg["reasoning_content"] = reasoning.text()
    if calls:
        msg["tool_calls"] = calls
    return msg


def _user(blocks: list[tuple[int, str, Any]], names: dict[str, str]) -> list[dict]:
    """A user turn: its tool results as tool messages, its text as a user message, in
    the order they come."""
    out: list[dict] = []
    text = _Joined(PARTS_JOIN)
    for i, at, block in blocks:
        _refuse_media(block, at)
        if isinstance(block, TextBlock):
            text.add(i, block.text)
        elif isinstance(block, ToolResultBlock):
            if block.tool_use_id not in names:
                raise ApiError(400, f"'{at}.tool_use_id' is {block.tool_use_id!r}, which no "
                                    "tool_use block of an earlier assistant turn has.",
                               param=f"{at}.tool_use_id")
            if text:
                out.append({"role": "user", "content": text.text()})
                text = _Joined(PARTS_JOIN)
            result = _text(block.content, f"{at}.content")
            out.append({"role": "tool", "tool_call_id": block.tool_use_id,
                        "name": names[block.tool_use_id],
                        "content": f"Error: {result}" if block.is_error else result})
        else:
            kind = "tool_use" if isinstance(block, ToolUseBlock) else "thinking"
            raise ApiError(400, f"'{at}' is a {kind} block; those belong to assistant turns.",
                           param=f"{at}.type")
    if text or not out:
        out.append({"role": "user", "content": text.text()})
    return out


def chat_messages(req: CountIn) -> list[dict]:
    """The conversation as chat messages (OpenAI's shape, as chat templates read it):
    `system` first, consecutive messages of one role merged into one turn (`turns`), text
    blocks joined, `tool_use` as the assistant's tool_calls, `tool_result` as tool
    messages, `thinking` as the assistant's reasoning_content (the template keeps or drops
    earlier reasoning as it does)."""
    out: list[dict] = []
    if req.system:
        out.append({"role": "system", "content": _text(req.system, "system")})
    names: dict[str, str] = {}
    conversation = turns(req.messages)
    for k, turn in enumerate(conversation):
        if k:
            _check_results(conversation[k - 1], turn)
        if turn.role == "assistant":
            out.append(_assistant(turn.blocks, names))
        else:
            out.extend(_user(turn.blocks, names))
    return out


def _check_results(before: Turn, turn: Turn) -> None:
    """Anthropic's rule: each tool_use block of an assistant turn has its tool_result in
    the next turn (else the model would read a call that never got its answer).

    Raises:
        ApiError: 400 naming the turn and the ids without results.
    """
    if before.role != "assistant":
        return
    calls = [b.id for _, _, b in before.blocks if isinstance(b, ToolUseBlock)]
    if not calls:
        return
    answered = {b.tool_use_id for _, _, b in turn.blocks if isinstance(b, ToolResultBlock)}
    missing = [c for c in calls if c not in answered]
    if missing:
        i = turn.index
        raise ApiError(400, f"messages.{i}: `tool_use` ids were found without `tool_result` "
                            f"blocks immediately after: {', '.join(missing)}. Each `tool_use` "
                            "block must have a corresponding `tool_result` block in the next "
                            "message.", param=f"messages[{i}].content")


# -- tools, tool_choice, output format, thinking -> the OpenAI options the chat library reads --
def _tools(tools: list[Tool] | None) -> list[dict] | None:
    if not tools:
        return None
    out = []
    for i, t in enumerate(tools):
        if t.type not in (None, "custom"):
            raise ApiError(400, f"'tools[{i}].type' is {t.type!r}; this server runs client "
                                "tools only (a name and an input_schema).",
                           param=f"tools[{i}].type")
        if t.input_schema is None:
            raise ApiError(400, f"'tools[{i}].input_schema' is missing; a tool needs the "
                                "JSON schema of its input.", param=f"tools[{i}].input_schema")
        fn = {"name": t.name, "parameters": t.input_schema}
        if t.description is not None:
            fn["description"] = t.description
        if t.strict is not None:
            fn["strict"] = t.strict
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: ToolChoice | None) -> tuple[Any, bool | None]:
    """OpenAI's tool_choice and parallel_tool_calls."""
    if choice is None:
        return None, None
    parallel = None if choice.disable_parallel_tool_use is None \
        else not choice.disable_parallel_tool_use
    if choice.type == "tool":
        # Anthropic's forced tool may be called several times unless the request says not
        parallel = True if parallel is None else parallel
        if not choice.name:
            raise ApiError(400, "'tool_choice.name' is missing; a tool_choice of type 'tool' "
                                "names the tool.", param="tool_choice.name")
        return {"type": "function", "function": {"name": choice.name}}, parallel
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type], parallel


def _thinking(req: CountIn) -> tuple[bool | None, str | None]:
    """The thinking switch (None: the template's default, as `adaptive` and
    `between_tools` leave it: the model decides) and the reasoning effort the template
    gets (`output_config.effort`, else from the budget: templates such as gpt-oss's read
    low, medium or high). The budget also caps the reasoning (the worker's
    `reasoning_budget`)."""
    effort = req.output_config.effort if req.output_config else None
    effort = "high" if effort in ("xhigh", "max") else effort
    t = req.thinking
    if t is None or t.type in ("adaptive", "between_tools"):
        return None, effort
    if t.type == "disabled":
        return False, effort
    if t.budget_tokens is None:
        raise ApiError(400, "'thinking.budget_tokens' is missing; enabled thinking needs a "
                            "budget.", param="thinking.budget_tokens")
    if t.budget_tokens < MIN_BUDGET:
        raise ApiError(400, f"'thinking.budget_tokens' is {t.budget_tokens}; it must be at "
                            f"least {MIN_BUDGET}.", param="thinking.budget_tokens")
    if effort is None:
        effort = "low" if t.budget_tokens < 4096 else \
            "medium" if t.budget_tokens < 16384 else "high"
    return True, effort


# OpenAI's names (as the chat library's errors use them) -> Anthropic's, in order
_PARAMS = ((".function.parameters", ".input_schema"), (".function.", "."),
           ("response_format.json_schema.schema", "output_config.format.schema"),
           ("response_format", "output_config.format"),
           ("parallel_tool_calls", "tool_choice.disable_parallel_tool_use"),
           ("is 'required' but", "is 'any' but"))


def _anthropic(text: str) -> str:
    for ours, theirs in _PARAMS:
        text = text.replace(ours, theirs)
    return text


def chat_request(req: CountIn) -> ChatGenerate:
    """The worker's request for a Messages (or count_tokens) request.

    Raises:
        ApiError: 400 naming Anthropic's field.
    """
    tools = _tools(req.tools)
    choice, parallel = _tool_choice(req.tool_choice)
    thinking, effort = _thinking(req)
    fmt = (req.output_config.format if req.output_config else None) or req.output_format
    raw: dict[str, Any] = {"tools": tools, "tool_choice": choice,
                           "parallel_tool_calls": parallel, "think": thinking is not False,
                           "response_format": None if fmt is None else {
                               "type": "json_schema",
                               "json_schema": {"name": "output", "schema": fmt.schema,
                                               "strict": True}}}  # (Anthropic's always is)
    try:
        constraint = constraint_request_from_openai(raw)
    except ConstraintError as exc:
        raise ApiError(400, _anthropic(exc.message),
                       param=exc.param and _anthropic(exc.param)) from None
    extra: dict[str, Any] = {}
    if isinstance(req, MessagesIn):
        budget = req.thinking.budget_tokens if thinking and req.thinking else None
        extra = dict(max_tokens=req.max_tokens, stop=list(req.stop_sequences or []),
                     temperature=req.temperature, top_p=req.top_p,
                     top_k=req.top_k or None, seed=req.seed, reasoning_budget=budget)
    messages = chat_messages(req)
    last = messages[-1] if messages else {}
    if (last.get("role") == "assistant" and not last.get("tool_calls")
            and last["content"] != last["content"].rstrip()):  # a prefill, as Anthropic's
        raise ApiError(400, "final assistant content cannot end with trailing whitespace",
                       param=f"messages[{len(req.messages) - 1}].content")
    messages, prefilled = continuation(messages)
    return ChatGenerate(request_id=new_id(), messages=messages,
                        constraint=constraint, tools=tools, thinking=thinking,
                        template_kwargs={"reasoning_effort": effort} if effort else {},
                        continue_final=prefilled, **extra)


def messages_call(body: bytes, ingress: Ingress) -> Call:
    """POST /v1/messages's Call: streamed with pings while the first event is late."""
    req = decode(body, MessagesIn)
    ingress.check_model(req.model)
    greq = chat_request(req)
    omit = req.thinking is not None and req.thinking.display == "omitted"
    builder = MessageBuilder({"id": f"msg_{greq.request_id}", "model": req.model},
                             greq.stop, omit_thinking=omit)
    return Call(model=req.model, request=greq, stream=bool(req.stream),
                reply=MessagesReply(builder), keep_alive=PING,
                params={**{f"tools[{i}].function.parameters": f"tools[{i}].input_schema"
                           for i in range(len(req.tools or []))},  # (a strict tool's 400)
                        "response_format": "output_config.format",
                        "response_format.json_schema.schema": "output_config.format.schema",
                        "tools": "tools",
                        "tool_choice": "tool_choice"})
