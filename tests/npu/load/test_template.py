"""Chat templates: every shared template renders a conversation with a system prompt, a
tool call and its result, and continues a last assistant message (a prefill); the sandbox
holds; thinking and tool switches are reported."""

from __future__ import annotations

import json

import pytest

from npu import ChatTemplate, TemplateError
from tests.shared import needs_shared, template, template_names

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{
        "id": "call_abcdefghijabcdefghijabcd", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_abcdefghijabcdefghijabcd", "name": "get_weather",
     "content": "18C and sunny"},
]
# Mistral's templates want tool-call ids of exactly 9 characters.
MISTRAL_ID = "abcDEF123"


def _conversation(name: str) -> list[dict]:
    if "mistral" in name.lower() or "Ministral" in name:
        conv = [dict(m) for m in CONVERSATION]
        conv[2] = {**conv[2], "tool_calls": [{**conv[2]["tool_calls"][0], "id": MISTRAL_ID}]}
        conv[3] = {**conv[3], "tool_call_id": MISTRAL_ID}
        return conv
    return CONVERSATION


@needs_shared
@pytest.mark.parametrize("name", template_names() or ["none"])
def test_every_shared_template_renders_a_tool_conversation(name: str) -> None:
    tpl = ChatTemplate(template(name), bos_token="<s>", eos_token="</s>")
    text = tpl.render(_conversation(name), TOOLS, add_generation_prompt=True)
    assert "Paris" in text and "18C and sunny" in text


def _as_sent_back(conversation: list[dict], tools: list[dict]) -> tuple[list, list]:
    """The conversation as OpenAI's SDK sends a reply back (the call's `content` null) and
    the tools without descriptions (optional in OpenAI's API)."""
    conv = [{**m, "content": None} if m.get("tool_calls") else m for m in conversation]
    bare = [{**t, "function": {k: v for k, v in t["function"].items() if k != "description"}}
            for t in tools]
    return conv, bare


def _undescribed(tools: list[dict]) -> list[dict]:
    return [{**t, "function": {**t["function"], "description": ""}} for t in tools]


def test_a_null_content_beside_calls_and_a_tool_without_description_render() -> None:
    """Found serving Qwen3, QwQ, LFM2, Hermes-3 and gpt-oss templates: OpenAI's own reply
    (content null beside its calls) sent back, or a tool without a description, was a 400
    ("the chat template failed"): templates concatenate both."""
    tpl = ChatTemplate("{% for t in tools %}{{ '// ' + t.function.description }}{% endfor %}"
                       "{% for m in messages %}{{ m.role + ': ' + m.content + ';' }}"
                       "{% endfor %}")
    conv, bare = _as_sent_back(CONVERSATION, TOOLS)
    assert tpl.render(conv, bare) == tpl.render(CONVERSATION, _undescribed(TOOLS))
    plain = ChatTemplate("{{ tools | tojson }}{% for m in messages %}{{ m.content }}{% endfor %}")
    assert '"description"' not in plain.render(CONVERSATION, bare)  # nothing added where read


def test_a_template_that_reads_tools_as_a_list_renders_without_them() -> None:
    """Hermes-3's tool_use template, served as a model's only template, loops over `tools`
    whatever they are: a request without tools was a 400 ("'NoneType' object is not
    iterable"). It renders with an empty list; a template that fails either way says its
    first failure."""
    tpl = ChatTemplate("{% for t in tools %}{{ t.function.name }};{% endfor %}"
                       "{% for m in messages %}{{ m.content }}{% endfor %}")
    assert tpl.render([{"role": "user", "content": "Hi"}]) == "Hi"
    broken = ChatTemplate("{% for t in tools %}{% endfor %}{{ messages[0].content + 1 }}")
    with pytest.raises(TemplateError, match="NoneType"):
        broken.render([{"role": "user", "content": "Hi"}])


@needs_shared
@pytest.mark.parametrize("name", template_names() or ["none"])
def test_every_shared_template_renders_a_reply_sent_back_as_openai_sends_it(name: str) -> None:
    tpl = ChatTemplate(template(name), bos_token="<s>", eos_token="</s>")
    conv, bare = _as_sent_back(_conversation(name), TOOLS)
    assert tpl.render(conv, TOOLS) == tpl.render(_conversation(name), TOOLS)
    assert "get_weather" in tpl.render(conv, bare)


NINE_IDS = ChatTemplate(
    "{% for m in messages %}{% if m.tool_calls %}{% for c in m.tool_calls %}"
    "{% if c.id is not defined or c.id|length != 9 %}{{ raise_exception('ids of 9') }}"
    "{% endif %}[CALL {{ c.id }}]{{ c.function.name }}{% endfor %}"
    "{% elif m.role == 'tool' %}{% if m.tool_call_id|length != 9 %}"
    "{{ raise_exception('ids of 9') }}{% endif %}[RESULT {{ m.tool_call_id }}]{{ m.content }}"
    "{% else %}{{ m.content }}{% endif %}{% endfor %}")


def test_a_template_that_wants_ids_of_nine_renders_openai_ids_natively() -> None:
    """Found reading Mistral's templates: they raise on a call id that is not 9 characters,
    and OpenAI's are `call_` + 24 (ours too), so every agent's second turn on Mistral Nemo or
    Small 3.2 went through the polyfill (calls as `{"tool_calls": ...}` text, results as a
    user turn): not what the model was trained on. Ids are now 9 alphanumerics there, a call
    and its result mapped alike."""
    text = NINE_IDS.render(CONVERSATION, TOOLS)
    assert "Tool result" not in text and '"tool_calls"' not in text
    call = text.split("[CALL ")[1][:9]
    assert call.isalnum() and f"[CALL {call}]get_weather" in text
    assert f"[RESULT {call}]18C and sunny" in text
    # two calls without ids, answered without `tool_call_id` (Ollama's API has none)
    calls = [{"type": "function", "function": {"name": n, "arguments": "{}"}} for n in "ab"]
    conv = [{"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "tool", "content": "A"}, {"role": "tool", "content": "B"}]
    text = NINE_IDS.render(conv)
    first, second = (part[:9] for part in text.split("[CALL ")[1:])
    assert first != second
    assert f"[RESULT {first}]A[RESULT {second}]B" in text
    # ids already of nine are kept
    assert f"[CALL {MISTRAL_ID}]" in NINE_IDS.render(_conversation("mistral"))


def test_results_without_ids_pair_with_their_calls_by_name() -> None:
    """Ollama's API has no ids: a result names its tool (`tool_name`), and is paired with
    the next unanswered call of that name; one with an id takes that call's."""
    calls = [{"type": "function", "function": {"name": n, "arguments": "{}"}}
             for n in ("weather", "time")]
    conv = [{"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "tool", "tool_name": "time", "content": "T"},
            {"role": "tool", "tool_name": "weather", "content": "W"}]
    text = NINE_IDS.render(conv)
    weather, time = (part[:9] for part in text.split("[CALL ")[1:])
    assert f"[RESULT {time}]T[RESULT {weather}]W" in text
    ided = [{**c, "id": f"call_{n}"} for c, n in zip(calls, "ab")]
    conv = [conv[0], {**conv[1], "tool_calls": ided}, {"role": "tool", "content": "first"},
            {"role": "tool", "tool_call_id": "call_a", "content": "A"}]
    text = NINE_IDS.render(conv)
    a, b = (part[:9] for part in text.split("[CALL ")[1:])
    assert f"[RESULT {a}]first" in text and f"[RESULT {a}]A" in text  # as the client said


@needs_shared
@pytest.mark.parametrize("name", ["mistralai-Mistral-Nemo-Instruct-2407",
                                  "mistralai-Mistral-Small-3.2-24B-Instruct-2506"])
def test_mistral_templates_show_an_openai_tool_conversation_natively(name: str) -> None:
    tpl = ChatTemplate(template(name), bos_token="<s>", eos_token="</s>")
    text = tpl.render(CONVERSATION, TOOLS)
    assert "[TOOL_CALLS]" in text and "[TOOL_RESULTS]" in text and "Tool result" not in text
    # the system prompt too, though Nemo's writes it in the last user turn alone and an
    # agent's turn ends with a result
    assert "You are terse." in text


@needs_shared
def test_nemo_keeps_the_system_prompt_on_every_agent_turn() -> None:
    """Found by the second review: Nemo writes the system prompt in the last user turn only;
    an agent turn after a user turn that followed results, or one with two system
    messages, lost it (or was a 400); and two system messages without tools wrote an empty
    tools block."""
    tpl = ChatTemplate(template("mistralai-Mistral-Nemo-Instruct-2407"), bos_token="<s>",
                       eos_token="</s>")
    call = {**CONVERSATION[2], "tool_calls": [{**CONVERSATION[2]["tool_calls"][0],
                                                "id": "call_" + "y" * 24}]}
    again = [{"role": "user", "content": "And Rome?"}, call,
             {"role": "tool", "tool_call_id": "call_" + "y" * 24, "content": "rainy"}]
    text = tpl.render(CONVERSATION + again, TOOLS)
    assert "You are terse." in text and text.index("18C") < text.index("And Rome?")
    two = [{"role": "system", "content": "Be brief."}] + CONVERSATION
    text = tpl.render(two, TOOLS)
    assert "Be brief." in text and "You are terse." in text
    text = tpl.render(two[:3])
    assert "[AVAILABLE_TOOLS]" not in text and "Be brief." in text


def test_a_system_prompt_a_template_writes_its_own_way_is_left_there() -> None:
    """The check for a dropped system prompt reads past whitespace: a template that writes
    the prompt's lines on one line keeps it where it writes it."""
    tpl = ChatTemplate("{% for m in messages %}<|{{ m.role }}|>{% if m.role == 'system' %}"
                       "{{ m.content | replace('\n', ' ') }}{% else %}{{ m.content }}{% endif %}"
                       "<|end|>{% endfor %}")
    text = tpl.render([{"role": "system", "content": "Rule one.\nRule two."},
                       {"role": "user", "content": "hi"}])
    assert text == "<|system|>Rule one. Rule two.<|end|><|user|>hi<|end|>"


def test_a_system_prompt_a_template_drops_goes_into_the_first_user_turn() -> None:
    """Found reviewing the native Mistral render: Nemo's template writes the system prompt
    inside the last user turn only, so every agent turn after tool results lost it without
    a word. A system prompt missing from the render goes at the head of the first user
    turn."""
    last_user = ChatTemplate(
        "{% set sys = messages[0].content if messages[0].role == 'system' else '' %}"
        "{% for m in messages %}{% if m.role == 'user' and loop.last %}[{{ sys }} "
        "{{ m.content }}]{% elif m.role != 'system' %}[{{ m.content }}]{% endif %}"
        "{% endfor %}")
    text = last_user.render(CONVERSATION)
    assert text.startswith("[You are terse.\n\nWeather in Paris?]")
    assert last_user.render(CONVERSATION[:2]) == "[You are terse. Weather in Paris?]"


@needs_shared
def test_a_tool_result_as_text_parts_is_text_on_mistral_small() -> None:
    """Found probing Small 3.2 live: its template reads a user's parts but writes a tool
    result with `content|string`: a result sent as parts showed the model their Python repr
    (and was a 400 with a user turn after it). A tool result's or a system prompt's parts
    are joined as text for every template."""
    tpl = ChatTemplate(template("mistralai-Mistral-Small-3.2-24B-Instruct-2506"),
                       bos_token="<s>", eos_token="</s>")
    parts = [{"type": "text", "text": "PART_A"}, {"type": "text", "text": "PART_B"}]
    conv = [{**m, "content": parts} if m["role"] in ("tool", "system") else m
            for m in CONVERSATION]
    text = tpl.render(conv + [{"role": "user", "content": "U2"}], TOOLS)
    assert "[TOOL_CONTENT]PART_A\nPART_B[/TOOL_RESULTS]" in text and "'type'" not in text
    assert "PART_A\nPART_B[/SYSTEM_PROMPT]" in text


@needs_shared
@pytest.mark.parametrize("name", ["meta-llama-Llama-3.1-8B-Instruct",
                                  "meta-llama-Llama-3.2-3B-Instruct"])
def test_two_calls_of_one_turn_render_on_llama_templates(name: str) -> None:
    """Llama 3.x's templates raise on a turn of two calls ("only supports single tool-calls
    at once"), which parallel calls sent back are: each call goes as its own turn."""
    calls = [{"id": f"call_{i}", "type": "function", "function": {
        "name": "get_weather", "arguments": json.dumps({"city": c})}}
        for i, c in enumerate(("Paris", "Rome"))]
    conv = [{"role": "user", "content": "Weather in Paris and Rome?"},
            {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "tool_call_id": "call_0", "content": "sunny"},
            {"role": "tool", "tool_call_id": "call_1", "content": "rainy"}]
    text = ChatTemplate(template(name), bos_token="<s>").render(conv, TOOLS)
    paris = text.index('{"name": "get_weather", "parameters": {"city": "Paris"}}')
    rome = text.index('{"name": "get_weather", "parameters": {"city": "Rome"}}')
    assert paris < rome < text.index("sunny") < text.index("rainy")


AFTER_RESULT = CONVERSATION + [{"role": "user", "content": "And tomorrow?"}]
GREETED = [{"role": "assistant", "content": "Hello! How can I help?"},
           {"role": "user", "content": "Weather in Paris?"}]


def test_a_template_that_checks_the_order_of_roles_takes_a_user_turn_after_results() -> None:
    """Found driving the real Mistral templates: they refuse a user message right after tool
    results ("roles must alternate"), which Claude Code sends on every turn (a tool_result
    beside text), as Codex does (an output, then a message); and Gemma's and Mistral's
    refuse a conversation an app opens with its greeting. Where the order of roles is a
    template's only objection, the conversation renders as it is (as Ollama's templates
    write it); any other refusal still stands."""
    ordered = ChatTemplate(
        "{% set ns = namespace(i=0) %}{% for m in messages %}"
        "{% if m.role in ('user', 'assistant') and not m.tool_calls %}"
        "{% if (m.role == 'user') != (ns.i % 2 == 0) %}"
        "{{ raise_exception('Conversation roles must alternate user/assistant/...') }}"
        "{% endif %}{% set ns.i = ns.i + 1 %}{% endif %}{% endfor %}"
        "{% for m in messages %}[{{ m.role }}: {{ m.content }}]{% endfor %}")
    text = ordered.render(AFTER_RESULT, TOOLS)
    assert text.endswith("[tool: 18C and sunny][user: And tomorrow?]")
    assert ordered.render(GREETED) == \
        "[assistant: Hello! How can I help?][user: Weather in Paris?]"
    other = ChatTemplate("{% for m in messages %}{% if m.content == 'And tomorrow?' %}"
                         "{{ raise_exception('No forecasts past today') }}"
                         "{% endif %}{{ m.content }}{% endfor %}")
    with pytest.raises(TemplateError, match="No forecasts"):
        other.render(AFTER_RESULT, TOOLS)
    # a check of order whose render then leaves a message out is not taken
    drops = ChatTemplate("{{ raise_exception('Conversation roles must alternate') }}"
                         "{{ messages[0].content }}")
    with pytest.raises(TemplateError, match="alternate"):
        drops.render(GREETED)
    # nor one that leaves the greeting out, though its words are inside the next turn's
    users = ChatTemplate("{{ raise_exception('Conversation roles must alternate') }}"
                         "{% for m in messages if m.role == 'user' %}{{ m.content }}{% endfor %}")
    with pytest.raises(TemplateError, match="alternate"):
        users.render([{"role": "assistant", "content": "Hi"},
                      {"role": "user", "content": "Hi there"}])


@needs_shared
@pytest.mark.parametrize("name", template_names() or ["none"])
def test_every_shared_template_takes_a_user_turn_after_results_and_a_greeting(name) -> None:
    tpl = ChatTemplate(template(name), bos_token="<s>", eos_token="</s>")
    text = tpl.render(AFTER_RESULT, TOOLS)
    assert text.index("18C and sunny") < text.index("And tomorrow?")
    text = tpl.render(GREETED)
    assert text.index("How can I help?") < text.index("Weather in Paris?")


PARTS = [{"role": "user", "content": [{"type": "text", "text": "Hello"},
                                      {"type": "text", "text": "World"}]}]


def test_text_parts_render_as_text_on_a_template_that_reads_a_string() -> None:
    """Content as a list of text parts (OpenAI's SDKs, the Vercel AI SDK, LangChain) on a
    template that reads `content` as a string was a 400, dropped, or shown as the list's
    repr; it is the parts' text joined by a newline, as llama.cpp and vLLM join it. A
    template that reads parts itself renders them as it does."""
    plain = ChatTemplate("{% for m in messages %}[{{ m.content }}]{% endfor %}")
    assert not plain.capabilities.typed_content
    assert plain.render(PARTS) == "[Hello\nWorld]"
    reads = ChatTemplate("{% for m in messages %}{% if m.content is string %}{{ m.content }}"
                         "{% else %}{% for p in m.content %}<{{ p.text }}>{% endfor %}"
                         "{% endif %}{% endfor %}")
    assert reads.capabilities.typed_content and reads.render(PARTS) == "<Hello><World>"
    begun = [*PARTS, {"role": "assistant", "content": [{"type": "text", "text": "Hi"},
                                                        {"type": "text", "text": "there"}]}]
    assert plain.render(begun, continue_final=True) == "[Hello\nWorld][Hi\nthere"


@pytest.mark.parametrize("name", ["smollm2_chat_template.jinja", "flm_tiny_chat_template.jinja"])
def test_our_templates_join_text_parts_as_the_others_are_joined(name: str) -> None:
    from npu.load.loader import DATA

    tpl = ChatTemplate((DATA / name).read_text(encoding="utf-8"))
    assert tpl.render(PARTS) == tpl.render([{"role": "user", "content": "Hello\nWorld"}])


@pytest.mark.parametrize("name", ["smollm2_chat_template.jinja", "flm_tiny_chat_template.jinja"])
def test_our_templates_put_a_turns_tool_results_in_one_user_turn(name: str) -> None:
    """As Qwen's and Hermes' templates do (found probing: each result was a turn of its
    own); a result alone, and results of two turns, stay turns of their own."""
    from npu.load.loader import DATA

    tpl = ChatTemplate((DATA / name).read_text(encoding="utf-8"))
    call = {**CONVERSATION[2]["tool_calls"][0]}
    two = [*CONVERSATION[:2], {**CONVERSATION[2], "tool_calls": [call, call]},
           {**CONVERSATION[3], "content": "18C"}, {**CONVERSATION[3], "content": "sunny"},
           {"role": "user", "content": "And Oslo?"}]
    text = tpl.render(two, tools=TOOLS)
    assert "<tool_response>\n18C\n</tool_response>\n<tool_response>\nsunny\n</tool_response>" \
        "<|im_end|>\n<|im_start|>user\nAnd Oslo?" in text
    assert text.count("<|im_start|>user") == 3
    one = tpl.render([*CONVERSATION, {"role": "user", "content": "Thanks"}], tools=TOOLS)
    assert "<|im_start|>user\n<tool_response>\n18C and sunny\n</tool_response><|im_end|>\n" \
        "<|im_start|>user\nThanks" in one


@needs_shared
@pytest.mark.parametrize("name", template_names() or ["none"])
def test_every_shared_template_renders_text_parts_as_text(name: str) -> None:
    tpl = ChatTemplate(template(name), bos_token="<s>", eos_token="</s>")
    shown = tpl.render(PARTS)
    assert "Hello" in shown and "World" in shown and "'type': 'text'" not in shown \
        and '"type": "text"' not in shown
    if not tpl.capabilities.typed_content:
        assert shown == tpl.render([{"role": "user", "content": "Hello\nWorld"}])


TWO_SYSTEMS = [{"role": "system", "content": "Be brief."},
               {"role": "system", "content": "Answer in French."},
               {"role": "user", "content": "Hi"}, {"role": "user", "content": "Weather?"}]


def test_a_strict_template_takes_two_system_messages_and_two_user_turns() -> None:
    """Codex's instructions beside a developer message, a RAG app's second system prompt,
    two user turns in a row: Gemma's and Mistral's templates refuse them ("Conversation
    roles must alternate"), a 400. Where a template refuses, the conversation goes again
    with its system messages as one, first, and neighbouring turns of one role as one."""
    strict = ChatTemplate(
        "{% for m in messages %}{% if loop.index0 > 0 and m.role == 'system' %}"
        "{{ raise_exception('System message must be at the beginning.') }}{% endif %}"
        "{% if loop.index0 > 1 and m.role == messages[loop.index0 - 1].role %}"
        "{{ raise_exception('Conversation roles must alternate') }}{% endif %}"
        "[{{ m.role }}: {{ m.content }}]{% endfor %}")
    assert strict.render(TWO_SYSTEMS) == \
        "[system: Be brief.\n\nAnswer in French.][user: Hi\n\nWeather?]"
    refuses = ChatTemplate("{{ raise_exception('Conversation roles must alternate') }}")
    with pytest.raises(TemplateError, match="alternate"):  # what a merge does not mend: said
        refuses.render(TWO_SYSTEMS)
    lenient = ChatTemplate("{% for m in messages %}[{{ m.content }}]{% endfor %}")
    assert lenient.render(TWO_SYSTEMS) == "[Be brief.][Answer in French.][Hi][Weather?]"
    # one that keeps the last system message and drops the others without a word
    last = ChatTemplate("{% for m in messages %}{% if m.role == 'system' %}{% set ns = m %}"
                        "{% endif %}{% endfor %}"
                        "{% for m in messages if m.role == 'system' %}{% if loop.last %}"
                        "<{{ m.content }}>{% endif %}{% endfor %}"
                        "{% for m in messages if m.role != 'system' %}[{{ m.content }}]"
                        "{% endfor %}")
    assert last.render(TWO_SYSTEMS) == "<Be brief.\n\nAnswer in French.>[Hi][Weather?]"


@needs_shared
@pytest.mark.parametrize("name", template_names() or ["none"])
def test_every_shared_template_takes_two_system_messages_and_two_user_turns(name) -> None:
    shown = ChatTemplate(template(name), bos_token="<s>", eos_token="</s>").render(TWO_SYSTEMS)
    assert all(t in shown for t in ("Be brief.", "Answer in French.", "Hi", "Weather?"))


@needs_shared
@pytest.mark.parametrize("name,switch,expect", [
    ("Qwen-Qwen3-0.6B", None, True), ("Qwen-Qwen3-0.6B", False, False),
    ("google-gemma-4-31B-it", None, False), ("google-gemma-4-31B-it", True, True),
    ("Qwen-QwQ-32B", False, True),  # no switch: the template always thinks
])
def test_thinking_enabled(name: str, switch, expect: bool) -> None:
    assert ChatTemplate(template(name)).thinking_enabled(switch) is expect


@needs_shared
@pytest.mark.parametrize("name,expect", [
    ("Qwen-Qwen3-0.6B", True), ("google-gemma-2-2b-it", False),
    ("openai-gpt-oss-120b", True), ("LiquidAI-LFM2.5-Instruct", True),
])
def test_tools_enabled(name: str, expect: bool) -> None:
    assert ChatTemplate(template(name)).tools_enabled() is expect


PREFILLED = [{"role": "user", "content": "Describe a cat as JSON."},
             {"role": "assistant", "content": '{"name": "Tom",'}]
# what the assistant's text may be: JSON begun; a character that the template's own markers
# also hold; text that the user's message holds too, with the spaces a template may trim
ASKED = "Say Yes or No. Sure.\n zq9x"
BEGUN = ['{"name": "Tom",', "<", " Yes", "Sure.\n", "X"]


def _head(text: str, final: str) -> str:
    """`text` without the assistant's text at its end (as sent, or as a template trims it)."""
    pieces = [p for p in {final, final.lstrip(), final.rstrip(), final.strip()}
              if p and text.endswith(p)]
    assert pieces, f"{text[-40:]!r} does not end with {final!r}"
    return text[: len(text) - max(map(len, pieces))]


@needs_shared
@pytest.mark.parametrize("name", template_names() or ["none"])
def test_every_shared_template_continues_a_last_assistant_message(name: str) -> None:
    """The prompt ends with the assistant's own text, its turn left open: where the whole
    conversation writes that text, whatever the text (the same place for each)."""
    tpl = ChatTemplate(template(name), bos_token="<s>", eos_token="</s>")
    heads = set()
    for final in BEGUN:
        conv = [{"role": "user", "content": ASKED}, {"role": "assistant", "content": final}]
        whole = tpl.render(conv, TOOLS, add_generation_prompt=False)
        text = tpl.render(conv, TOOLS, continue_final=True)
        assert whole.startswith(text) and "zq9x" in text
        heads.add(_head(text, final))
    assert len(heads) == 1, heads


def test_only_an_assistant_message_with_its_text_shown_is_continued() -> None:
    tpl = ChatTemplate("{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}</>"
                       "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
    assert tpl.render(PREFILLED[:1] + [{"role": "assistant", "content": " a b  "}],
                      continue_final=True) == "<user>Describe a cat as JSON.</><assistant>a b"
    with pytest.raises(TemplateError, match="ends with an assistant message"):
        tpl.render(PREFILLED[:1], continue_final=True)
    hidden = ChatTemplate("{% for m in messages %}<{{ m.role }}>{% endfor %}")
    with pytest.raises(TemplateError, match="does not show the last assistant message"):
        hidden.render(PREFILLED, continue_final=True)


def test_generation_tag_and_hf_globals() -> None:
    tpl = ChatTemplate("{% for m in messages %}{% generation %}{{ m.content }}"
                       "{% endgeneration %}{% endfor %}{{ strftime_now('%Y') | length }}"
                       "{{ {'b': 'é'} | tojson }}")
    assert tpl.render([{"role": "user", "content": "x"}]) == 'x4{"b": "é"}'


def test_raise_exception_is_a_template_error() -> None:
    tpl = ChatTemplate("{{ raise_exception('only user and assistant roles') }}")
    with pytest.raises(TemplateError, match="only user and assistant roles"):
        tpl.render([])


@pytest.mark.parametrize("source", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__.__init__.__globals__ }}",
    "{% set x = messages.append(1) %}",
])
def test_sandbox_refuses_python_internals(source: str) -> None:
    with pytest.raises(TemplateError):
        ChatTemplate(source).render([{"role": "user", "content": "x"}])


def test_syntax_error_is_a_template_error() -> None:
    with pytest.raises(TemplateError, match="does not compile"):
        ChatTemplate("{% for %}")


def test_tool_call_arguments_reach_the_template_as_objects() -> None:
    tpl = ChatTemplate("{% for m in messages %}{% for c in m.tool_calls or [] %}"
                       "{{ c.function.name }}:{{ c.function.arguments.city }}{% endfor %}"
                       "{% endfor %}")
    msg = {"role": "assistant", "tool_calls": [{"function": {
        "name": "f", "arguments": "{\"city\": \"Oslo\"}"}}]}
    assert tpl.render([msg]) == "f:Oslo"


CUT_SHORT = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_cut", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Par"}}]},
    {"role": "tool", "tool_call_id": "call_cut", "content": "the arguments were cut short"},
    {"role": "user", "content": "Try again."},
]


def test_a_call_cut_short_renders_where_arguments_are_read_as_a_mapping() -> None:
    """A call cut by max_tokens, sent back as it came (OpenAI takes it back): templates that
    loop over `arguments|items` (Qwen3-Coder, Qwen3.5, LFM2.5) failed on its text, a 400 on
    every later turn of the agent. Such arguments render as {}; a template that writes the
    text keeps it."""
    items = ChatTemplate("{% for m in messages %}{% for c in m.tool_calls or [] %}"
                         "<{{ c.function.name }}{% for k, v in c.function.arguments|items %}"
                         " {{ k }}={{ v }}{% endfor %}>{% endfor %}{{ m.content or '' }};"
                         "{% endfor %}")
    assert items.render(CUT_SHORT) == (
        "Weather in Paris?;<get_weather>;the arguments were cut short;Try again.;")
    assert items.render(CONVERSATION[1:3]) == "Weather in Paris?;<get_weather city=Paris>;"
    text = ChatTemplate("{% for m in messages %}{% for c in m.tool_calls or [] %}"
                        "<{{ c.function.name }} {{ c.function.arguments }}>{% endfor %}"
                        "{{ m.content or '' }};{% endfor %}")
    assert text.render(CUT_SHORT) == (
        'Weather in Paris?;<get_weather {"city": "Par>;the arguments were cut short;Try again.;')
    # a template that refuses for another reason (the order of roles here) and renders
    # once mended keeps every whole call's arguments, beside a call cut short
    strict = ChatTemplate("{% for m in messages %}{% if m.role == 'system' and not loop.first %}"
                          "{{ raise_exception('system first') }}{% endif %}"
                          "{% for c in m.tool_calls or [] %}<{{ c.function.name }}"
                          "{% for k, v in c.function.arguments|items %} {{ k }}={{ v }}"
                          "{% endfor %}>{% endfor %}{{ m.content or '' }};{% endfor %}")
    both = [*CONVERSATION, *CUT_SHORT[1:], {"role": "system", "content": "Be brief."}]
    assert strict.render(both).endswith(
        ";Weather in Paris?;<get_weather city=Paris>;18C and sunny;<get_weather>;"
        "the arguments were cut short;Try again.;")


@needs_shared
@pytest.mark.parametrize("name", template_names() or ["none"])
def test_every_shared_template_renders_a_call_cut_short(name: str) -> None:
    tpl = ChatTemplate(template(name), bos_token="<s>", eos_token="</s>")
    assert "Try again." in tpl.render(CUT_SHORT, TOOLS)


def test_conversation_is_rewritten_for_templates_that_cannot_show_it() -> None:
    # no system role, no tool calls, no tool messages, strict alternation (like Gemma 2)
    tpl = ChatTemplate(
        "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system') }}"
        "{% endif %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('alternate') }}{% endif %}<{{ m.role }}>{{ m.content }}"
        "{% endfor %}")
    text = tpl.render([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {
            "name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
        {"role": "tool", "name": "get_weather", "content": "sunny"},
    ])
    assert text.startswith("<user>Be brief.\n\nWeather?<assistant>")
    assert "get_weather" in text and text.endswith("<user>Tool result (get_weather): sunny")


def test_reasoning_sent_back_is_the_thinking_a_template_reads() -> None:
    """Found probing live: gpt-oss's template reads an assistant's `thinking`, and the
    reasoning sent back (`reasoning_content`) never reached its prompt; it is given under
    both names (not beside calls and text, which that template refuses together)."""
    tpl = ChatTemplate("{% for m in messages %}[{{ m.thinking }}]{{ m.content }}"
                       "{% for c in m.tool_calls or [] %}<{{ c.function.name }}>{% endfor %}"
                       "{% endfor %}")
    call = {"type": "function", "function": {"name": "f", "arguments": "{}"}}
    conv = [{"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "", "reasoning_content": "I call f.",
             "tool_calls": [call]},
            {"role": "assistant", "content": "Sure.", "reasoning_content": "So.",
             "tool_calls": [call]},
            {"role": "assistant", "content": "Done.", "reasoning_content": "Easy.",
             "thinking": "Own."}]
    assert tpl.render(conv, TOOLS) == "[]Hi[I call f.]<f>[]Sure.<f>[Own.]Done."


@needs_shared
def test_gpt_oss_renders_the_reasoning_of_a_call_sent_back() -> None:
    name = next(n for n in template_names() if "gpt-oss" in n)
    tpl = ChatTemplate(template(name))
    call = {"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    conv = [{"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": None, "reasoning_content": "I should call it.",
             "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "Sunny"}]
    text = tpl.render(conv, TOOLS)
    assert "<|channel|>analysis<|message|>I should call it.<|end|>" in text
