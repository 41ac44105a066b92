"""actors/go_template.py: Ollama's Go templates rendered through the Jinja chat-template path
give what Ollama's template.Execute gives (legacy per-exchange templates cut after
`.Response`, `.Messages` templates over merged messages), and what it cannot read is an
error naming it."""

from __future__ import annotations

import pytest

from actors.go_template import GoTemplateError, is_go_template, jinja_from_go
from npu import ChatTemplate

CHAT = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"}, {"role": "user", "content": "again"}]


def render(go: str, messages: list[dict], tools: list[dict] | None = None) -> str:
    return ChatTemplate(jinja_from_go(go)).render(messages, tools, _native=True)


def test_a_legacy_template_runs_per_exchange_and_the_last_is_cut_after_the_response() -> None:
    legacy = ("{{ if .System }}<|system|>{{ .System }}</s>{{ end }}<|user|>\n{{ .Prompt }}</s>"
              "\n<|assistant|>\n{{ .Response }}</s>\n")
    assert render(legacy, CHAT) == ("<|system|>Be terse.</s><|user|>\nhi</s>\n<|assistant|>"
                                    "\nyo</s>\n<|user|>\nagain</s>\n<|assistant|>\n")
    assert render("{{ .Prompt }}", [{"role": "user", "content": "just this"}]) == "just this"


def test_a_messages_template_gets_the_merged_messages_variables_and_functions() -> None:
    go = ('{{- if .System }}S:{{ .System }}\n{{ end }}'
          '{{- $lastUser := -1 }}{{- range $i, $m := .Messages }}'
          '{{- if eq .Role "user" }}{{ $lastUser = $i }}{{ end }}{{ end -}}'
          '{{/* a comment */}}'
          '{{- range $i, $m := .Messages }}{{- $last := eq (len (slice $.Messages $i)) 1 -}}'
          '{{- if ne $m.Role "system" }}[{{ $i }}:{{ .Role }}] {{ .Content }}'
          '{{- if eq $i $lastUser }} (last user){{ end }}\n{{ end }}'
          '{{- if and $last (eq .Role "user") }}A:{{ end }}{{- end }}')
    msgs = [{"role": "system", "content": "one"}, {"role": "system", "content": "two"},
            {"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    # consecutive messages of one role are one message (Ollama's collate)
    assert render(go, msgs) == "S:one\n\ntwo\n[1:user] a\n\nb (last user)\nA:"
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"},
                                           {"type": "image_url", "image_url": {}},
                                           {"type": "text", "text": "b"}]}]
    assert render("{{ range .Messages }}{{ .Content }}{{ end }}", parts) == "ab"


def test_tools_and_tool_calls_read_as_ollama_names_them() -> None:
    go = ('{{ if .Tools }}T:{{ range .Tools }}{{ .Function.Name }};{{ end }}\n{{ end }}'
          '{{ range .Messages }}{{ .Role }}:{{ .Content }}'
          '{{ range .ToolCalls }}<call>{{ json .Function.Arguments }}</call>{{ end }}\n{{ end }}')
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    msgs = [{"role": "user", "content": "x"},
            {"role": "assistant", "content": "",
             "tool_calls": [{"type": "function",
                             "function": {"name": "f", "arguments": '{"a": 1}'}}]}]
    assert render(go, msgs, tools) == 'T:f;\nuser:x\nassistant:<call>{"a":1}</call>\n'
    # values print as Go prints them: maps as JSON (Ollama's tools), booleans, nothing for nil
    go = "{{ range .Tools }}{{ . }}{{ end }}|{{ eq 1 1 }}|{{ .Think }}|{{ nil }}|"
    assert render(go, msgs, tools) == ('{"type":"function","function":{"name":"f",'
                                       '"parameters":{}}}|true|false||')


def test_with_pipelines_literals_and_trim_markers() -> None:
    go = ('{{ with .System }}[{{ . }}]{{ end }}  \n  {{- "q\\"uote" }} {{ `raw` }} '
          '{{ .Messages | len }}{{ if not .Tools }} no-tools{{ end }}')
    assert render(go, CHAT) == '[Be terse.]q"uote raw 4 no-tools'


@pytest.mark.parametrize("go,says", [
    ('{{ define "x" }}a{{ end }}', "define"),
    ("{{ printf \"%s\" .Prompt }}", "printf"),
    ("{{ .Nope }}", ".Nope"),
    ("{{ if .System }}open", "'if' is not closed"),  # Ollama's "unexpected EOF" at create
    ("{{ range .Messages }}{{ .Content }}", "'range' is not closed"),
    ("{{ .Prompt", "not closed"),
    ("{{ end }}", "without an open"),
])
def test_what_it_cannot_read_is_an_error_naming_it(go: str, says: str) -> None:
    with pytest.raises(GoTemplateError, match=says):
        jinja_from_go(go)


def test_go_and_jinja_templates_are_told_apart() -> None:
    assert is_go_template("{{ .Prompt }}") and is_go_template("{{- range .Messages }}{{ end }}")
    assert is_go_template("{{ if .System }}x{{ end }}")
    assert not is_go_template("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert not is_go_template("{{ bos_token }}{{ messages[0].content }}")
