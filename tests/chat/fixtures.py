"""Our own outputs for every format and edge, so the chat tests stand without ../shared.

Each case: (id, kind, prefill, raw, reasoning, content, calls, tools, partial).
`calls` holds (name, arguments object) pairs.
"""

from __future__ import annotations

WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                   "metric": {"type": "boolean"}, "ratio": {"type": "number"},
                   "tags": {"type": "array", "items": {"type": "string"}},
                   "opts": {"type": "object"}, "note": {"type": ["string", "null"]}},
    "required": ["city"]}}}]

Q = '<|"|>'

CASES = [
    # hermes_json
    ("hermes-plain", "hermes_json", "", "Hello there.", "", "Hello there.", [], None, False),
    ("hermes-think", "hermes_json", "", "<think>\nhmm\n</think>\n\nHi", "hmm", "Hi", [], None, False),
    ("hermes-prefilled-think", "hermes_json", "<think>", "\nhmm\n</think>\n\nHi", "hmm", "Hi", [],
     None, False),
    ("hermes-call", "hermes_json", "", '<tool_call>\n{"name": "get_weather", "arguments": '
     '{"city": "Paris", "days": 3}}\n</tool_call>', "", "",
     [("get_weather", {"city": "Paris", "days": 3})], WEATHER, False),
    ("hermes-call-escapes", "hermes_json", "", '<tool_call>{"name": "get_weather", "arguments": '
     '{"city": "P\\u00e9\\"r\\\\is\\n", "x": [1, -2.5e3, true, null, {}]}}</tool_call>', "", "",
     [("get_weather", {"city": 'P\u00e9"r\\is\n', "x": [1, -2.5e3, True, None, {}]})], None,
     False),
    ("hermes-surrogates", "hermes_json", "", '<tool_call>{"name": "f", "arguments": '
     '{"e": "\\ud83d\\ude00"}}</tool_call>', "", "", [("f", {"e": "\U0001F600"})], None, False),
    ("hermes-args-first", "hermes_json", "", '<tool_call>{"arguments": {"a": 1}, "name": "f"}'
     "</tool_call>", "", "", [("f", {"a": 1})], None, False),
    ("hermes-no-args", "hermes_json", "", '<tool_call>{"name": "f"}</tool_call>', "", "",
     [("f", {})], None, False),
    ("hermes-two-in-one-block", "hermes_json", "", '<tool_call>{"name": "f", "arguments": {}}\n'
     '{"name": "g", "arguments": {"b": "x"}}</tool_call>', "", "",
     [("f", {}), ("g", {"b": "x"})], None, False),
    ("hermes-content-around", "hermes_json", "", 'Before  <tool_call>{"name": "f", "arguments": '
     '{}}</tool_call>  after', "", "Before\n\nafter", [("f", {})], None, False),
    ("hermes-bad-json", "hermes_json", "", "<tool_call>{not json}</tool_call> tail", "",
     "<tool_call>{not json}</tool_call> tail", [], None, False),
    ("hermes-call-in-reasoning", "hermes_json", "<think>", 'Maybe <tool_call>{"name": "f", '
     '"arguments": {}}</tool_call> no.</think>Done',
     'Maybe <tool_call>{"name": "f", "arguments": {}}</tool_call> no.', "Done", [], None, False),
    ("hermes-call-ends-reasoning", "hermes_json", "<think>", 'Need a tool.\n<tool_call>{"name": '
     '"f", "arguments": {"a": 1}}</tool_call>', "Need a tool.", "", [("f", {"a": 1})], None,
     False),
    ("hermes-partial-number", "hermes_json", "", '<tool_call>{"name": "f", "arguments": {"a": 12',
     "", "", [("f", '{"a": ')], None, True),
    ("hermes-partial-marker", "hermes_json", "", "Hello <tool_ca", "", "Hello", [], None, True),
    ("hermes-partial-closer", "hermes_json", "", "<think>abc</thi", "abc", "", [], None, True),
    ("hermes-unicode", "hermes_json", "", "<think>思考</think>答え 😀", "思考", "答え 😀", [], None,
     False),
    # qwen_xml
    ("qwen-typed", "qwen_xml", "", "<tool_call>\n<function=get_weather>\n<parameter=city>\n"
     "New York\n</parameter>\n<parameter=days>\n5\n</parameter>\n<parameter=metric>\nTrue\n"
     "</parameter>\n<parameter=ratio>\n0.5\n</parameter>\n<parameter=tags>\n[\"a\", \"b\"]\n"
     "</parameter>\n<parameter=opts>\n{\"k\": 1}\n</parameter>\n<parameter=note>\nNone\n"
     "</parameter>\n</function>\n</tool_call>", "", "",
     [("get_weather", {"city": "New York", "days": 5, "metric": True, "ratio": 0.5,
                       "tags": ["a", "b"], "opts": {"k": 1}, "note": None})], WEATHER, False),
    ("qwen-untyped-string", "qwen_xml", "", "<tool_call>\n<function=other>\n<parameter=x>\n"
     "42\n</parameter>\n</function>\n</tool_call>", "", "", [("other", {"x": "42"})], WEATHER,
     False),
    ("qwen-bad-integer", "qwen_xml", "", "<tool_call>\n<function=get_weather>\n<parameter=days>"
     "\nfive\n</parameter>\n</function>\n</tool_call>", "", "", [("get_weather", {"days": "five"})],
     WEATHER, False),
    ("qwen-multiline-value", "qwen_xml", "", "<tool_call>\n<function=f>\n<parameter=code>\n\n"
     "a < b\n\n</parameter>\n</function>\n</tool_call>", "", "", [("f", {"code": "\na < b\n"})],
     None, False),
    ("qwen-unwrapped", "qwen_xml", "<think>", "plan\n</think>\n\n<function=f>\n</function>", "plan",
     "", [("f", {})], None, False),
    ("qwen-truncated-value", "qwen_xml", "", "<tool_call>\n<function=f>\n<parameter=s>\nabc\n",
     "", "", [("f", '{"s": "abc')], None, True),
    # gemma4
    ("gemma-thought", "gemma4", "", "<|channel>thought\nweigh it<channel|>Answer", "weigh it",
     "Answer", [], None, False),
    ("gemma-empty-thought", "gemma4", "", "<|channel>thought<channel|>Answer", "", "Answer", [],
     None, False),
    ("gemma-thoughtful", "gemma4", "", "<|channel>thoughtful<channel|>A", "thoughtful", "A", [],
     None, False),
    ("gemma-call", "gemma4", "", f"<|tool_call>call:get_weather{{city:{Q}Paris, \"FR\"{Q},"
     f"days:3,tags:[{Q}a{Q},{Q}b{Q}],opts:{{deep:{{x:-1.5}}}},metric:false,note:null}}"
     "<tool_call|>", "", "",
     [("get_weather", {"city": 'Paris, "FR"', "days": 3, "tags": ["a", "b"],
                       "opts": {"deep": {"x": -1.5}}, "metric": False, "note": None})], None,
     False),
    ("gemma-quoted-key", "gemma4", "", f"<|tool_call>call:f{{{Q}a key{Q}:1}}<tool_call|>", "", "",
     [("f", {"a key": 1})], None, False),
    ("gemma-stops-at-response", "gemma4", "", "<|tool_call>call:f{}<tool_call|><|tool_response>"
     "response:f{value:1}", "", "", [("f", {})], None, False),
    ("gemma-partial-quote", "gemma4", "", f"<|tool_call>call:f{{s:{Q}ab<|\"", "", "",
     [("f", '{"s": "ab')], None, True),
    # lfm2_pythonic
    ("lfm2-call", "lfm2_pythonic", "", "<|tool_call_start|>[get_weather(city='Paris', days=3, "
     "metric=True, opts={'a': None}, tags=('x', \"y\"))]<|tool_call_end|>Checking.", "",
     "Checking.", [("get_weather", {"city": "Paris", "days": 3, "metric": True,
                                    "opts": {"a": None}, "tags": ["x", "y"]})], None, False),
    ("lfm2-escapes", "lfm2_pythonic", "", "<|tool_call_start|>[f(s='a\\'b\\n\\x41\\u00e9', "
     "t=\"q\\\"\")]<|tool_call_end|>", "", "", [("f", {"s": "a'b\nA\u00e9", "t": 'q"'})], None,
     False),
    ("lfm2-json-block", "lfm2_pythonic", "", '<|tool_call_start|>{"name": "f", "arguments": '
     '{"a": 1}}<|tool_call_end|>', "", "", [("f", {"a": 1})], None, False),
    ("lfm2-empty-set-dict", "lfm2_pythonic", "", "<|tool_call_start|>[f(d={}, s={1, 2}, "
     "n=-07)]<|tool_call_end|>", "", "", [("f", {"d": {}, "s": [1, 2], "n": -7})], None, False),
    ("lfm2-comma-quote-in-string", "lfm2_pythonic", "", "<|tool_call_start|>[say(text='Hi', "
     "'there', n=1), say(text=\"a', 'b\", items=['x', 'y'])]<|tool_call_end|>", "", "",
     [("say", {"text": "Hi', 'there", "n": 1}),
      ("say", {"text": "a', 'b", "items": ["x", "y"]})], None, False),
    ("lfm2-double-quoted-values", "lfm2_pythonic", "", '<|tool_call_start|>[get_weather(city='
     '"Paris", unit="celsius")]<|tool_call_end|>', "", "",
     [("get_weather", {"city": "Paris", "unit": "celsius"})], None, False),
    ("lfm2-not-a-call", "lfm2_pythonic", "", "See [the docs](x).", "", "See [the docs](x).", [],
     None, False),
    # harmony
    ("harmony-all", "harmony", "assistant", "<|channel|>analysis<|message|>think<|end|>"
     "<|start|>assistant<|channel|>commentary<|message|>Let me look.<|end|><|start|>assistant"
     "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
     '{"city": "Oslo"}<|call|>', "think", "Let me look.", [("get_weather", {"city": "Oslo"})],
     None, False),
    ("harmony-recipient-in-role", "harmony", "assistant", " to=functions.get_weather"
     '<|channel|>commentary json<|message|>{"city": "Oslo"}<|call|>', "", "",
     [("get_weather", {"city": "Oslo"})], None, False),
    ("harmony-final", "harmony", "assistant", "<|channel|>final<|message|>Done.<|return|>", "",
     "Done.", [], None, False),
    ("harmony-builtin", "harmony", "assistant", " to=browser.search<|channel|>commentary"
     '<|message|>{"q": 1}<|call|>', "", "", [], None, False),
    ("harmony-plain-text", "harmony", "", "just words", "", "just words", [], None, False),
    # mistral_json and mistral_args: both syntaxes are read after [TOOL_CALLS]
    ("mistral-list", "mistral_json", "", '[TOOL_CALLS][{"name": "get_weather", "arguments": '
     '{"city": "Paris", "days": 3}}, {"name": "f", "arguments": {}, "id": "abcDEF123"}]', "",
     "", [("get_weather", {"city": "Paris", "days": 3}), ("f", {})], WEATHER, False),
    ("mistral-text-then-list", "mistral_json", "", 'Checking.[TOOL_CALLS] [{"name": "f", '
     '"arguments": {"a": [1, 2]}}]', "", "Checking.", [("f", {"a": [1, 2]})], None, False),
    ("mistral-list-cut", "mistral_json", "", '[TOOL_CALLS][{"name": "f", "arguments": {"a": "x',
     "", "", [("f", '{"a": "x')], None, True),
    ("mistral-args", "mistral_args", "", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'
     '[TOOL_CALLS]f[CALL_ID]abcDEF123[ARGS]{}', "", "",
     [("get_weather", {"city": "Paris"}), ("f", {})], WEATHER, False),
    ("mistral-args-think", "mistral_args", "", '<think>hmm</think>[TOOL_CALLS]f[ARGS]{"b": true}',
     "hmm", "", [("f", {"b": True})], None, False),
    ("mistral-args-list", "mistral_args", "", '[TOOL_CALLS][{"name": "f", "arguments": {}}]', "",
     "", [("f", {})], None, False),
    ("mistral-args-cut-name", "mistral_args", "", "[TOOL_CALLS]get_wea", "", "", [], None, True),
    ("mistral-empty-list", "mistral_json", "", "[TOOL_CALLS][]", "", "[TOOL_CALLS][]", [], None,
     False),
    ("mistral-args-two-ids", "mistral_args", "", "[TOOL_CALLS]f[CALL_ID]ab[CALL_ID]cd[ARGS]{}",
     "", "[TOOL_CALLS]f[CALL_ID]ab[CALL_ID]cd[ARGS]{}", [], None, False),
    ("mistral-args-bad", "mistral_args", "", "[TOOL_CALLS]no call here", "", "[TOOL_CALLS]no "
     "call here", [], None, False),
    # llama3_json: a bare call opens the turn, or `{"name": ` / <|python_tag|> anywhere
    ("llama-call", "llama3_json", "", '{"name": "get_weather", "parameters": {"city": "Paris"}}',
     "", "", [("get_weather", {"city": "Paris"})], WEATHER, False),
    ("llama-typed-calls", "llama3_json", "", '\n{"type": "function", "name": "get_weather", '
     '"parameters": {"city": "Oslo"}}; {"name": "get_weather", "parameters": {"days": 2}}', "",
     "", [("get_weather", {"city": "Oslo"}), ("get_weather", {"days": 2})], WEATHER, False),
    ("llama-text-then-call", "llama3_json", "", 'Let me check. {"name": "get_weather", '
     '"parameters": {"city": "Rome"}}', "", "Let me check.", [("get_weather", {"city": "Rome"})],
     WEATHER, False),
    ("llama-python-tag", "llama3_json", "", 'On it.<|python_tag|>{"name": "get_weather", '
     '"arguments": {"city": "Rome"}}', "", "On it.", [("get_weather", {"city": "Rome"})],
     WEATHER, False),
    ("llama-json-answer", "llama3_json", "", '{"name": "Ada", "age": 36}', "", '{"name": "Ada", '
     '"age": 36}', [], WEATHER, False),
    ("llama-not-a-tool", "llama3_json", "", '{"name": "search", "parameters": {}} then', "",
     '{"name": "search", "parameters": {}} then', [], WEATHER, False),
    ("llama-brace-text", "llama3_json", "", "{braces} and text", "", "{braces} and text", [],
     WEATHER, False),
    ("llama-tool-named-json-answer", "llama3_json", "", '{"name": "get_weather", "age": 3}',
     "", '{"name": "get_weather", "age": 3}', [], WEATHER, False),
    ("llama-call-then-object", "llama3_json", "", '{"name": "get_weather", "parameters": '
     '{"city": "x"}}\n{"note": "done"}', "", '{"note": "done"}', [("get_weather", {"city": "x"})],
     WEATHER, False),
    ("llama-call-then-separator-text", "llama3_json", "", '{"name": "get_weather", '
     '"parameters": {}}; that is all', "", "; that is all", [("get_weather", {})], WEATHER,
     False),
    ("llama-call-then-object-holding-a-call", "llama3_json", "", '{"name": "get_weather", '
     '"parameters": {}}{"a": {"name": "get_weather", "parameters": {}}}', "",
     '{"a": {"name": "get_weather", "parameters": {}}}', [("get_weather", {})], WEATHER, False),
    ("llama-cut-call", "llama3_json", "", '{"name": "get_weather", "parameters": {"city": "Pa',
     "", "", [("get_weather", '{"city": "Pa')], WEATHER, True),
    # content_only
    ("content-only", "content_only", "", "Just <tool_call> text", "", "Just <tool_call> text", [],
     None, False),
]
