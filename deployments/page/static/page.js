// flm-serve's chat page: lists the models (/v1/models), streams replies from
// /v1/chat/completions, shows reasoning (collapsed) and tool calls as they stream.
// Model output is text: every node is built with textContent, never parsed as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
const KEY = "flm-api-key";
const state = { history: [], controller: null, key: localStorage.getItem(KEY) || "" };

function headers() {
  const h = { "Content-Type": "application/json" };
  if (state.key) h.Authorization = "Bearer " + state.key;
  return h;
}

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

function say(text) { $("status").textContent = text || ""; }

async function errorText(response) {
  try {
    const body = await response.json();
    const e = body.error;
    return (typeof e === "string" ? e : e && e.message) || response.statusText;
  } catch { return `${response.status} ${response.statusText}`; }
}

function askForKey(reason) {
  $("key-form").hidden = false;
  $("key-reason").textContent = reason;
  $("api-key").focus();
}

async function loadModels() {
  let response;
  try { response = await fetch("v1/models", { headers: headers() }); }
  catch (e) { say("The server cannot be reached: " + e.message); return; }
  if (response.status === 401) {
    askForKey(state.key ? "The API key was refused; enter it again."
                        : "This server needs an API key.");
    return;
  }
  if (!response.ok) { say(await errorText(response)); return; }
  $("key-form").hidden = true;
  say("");
  const select = $("model");
  const previous = select.value || localStorage.getItem("flm-model");
  select.replaceChildren();
  for (const m of (await response.json()).data) {
    // an embedding model or a reranker does not chat: not offered here
    if (m.capabilities && !m.capabilities.includes("completion")) continue;
    const unavailable = m.status === "unavailable";
    const option = el("option", "", unavailable ? `${m.id} (unavailable)` : m.id);
    option.value = m.id;
    option.disabled = unavailable;
    if (unavailable) option.title = m.error || "";
    select.append(option);
  }
  const usable = [...select.options].filter((o) => !o.disabled);
  if (usable.some((o) => o.value === previous)) select.value = previous;
  else if (usable.length) select.value = usable[0].value;
  $("send").disabled = !usable.length;
}

// A tiny, safe markdown subset: ``` fenced code blocks and `inline code`.
function renderMarkdown(target, text) {
  const parts = text.split("```");
  const nodes = [];
  parts.forEach((part, i) => {
    if (i % 2 === 1) {  // inside a fence: its first line names the language
      const newline = part.indexOf("\n");
      const pre = el("pre");
      pre.append(el("code", "", newline >= 0 ? part.slice(newline + 1).replace(/\n$/, "") : ""));
      nodes.push(pre);
      return;
    }
    if (i > 0) part = part.replace(/^\n/, "");  // the line breaks around a block
    if (i < parts.length - 1) part = part.replace(/\n$/, "");
    part.split("`").forEach((piece, j) => {
      if (!piece) return;
      nodes.push(j % 2 === 1 ? el("code", "", piece) : document.createTextNode(piece));
    });
  });
  target.replaceChildren(...nodes);
}

function addTurn(role, text) {
  const li = el("li", "turn " + role);
  if (text !== undefined) li.textContent = text;
  $("turns").append(li);
  li.scrollIntoView({ block: "end" });
  return li;
}

// One assistant reply on the page: reasoning (collapsed), content, tool calls, stats.
class Reply {
  constructor() {
    this.li = addTurn("assistant");
    this.li.append(el("div", "who", $("model").value));
    this.reasoning = el("details", "reasoning");
    this.reasoning.hidden = true;
    this.reasoningSummary = el("summary", "", "Reasoning");
    this.reasoningText = el("div", "reasoning-text");
    this.reasoning.append(this.reasoningSummary, this.reasoningText);
    this.content = el("div", "content");
    this.calls = el("div", "tool-calls");
    this.stats = el("div", "stats");
    this.li.append(this.reasoning, this.content, this.calls, this.stats);
    this.text = ""; this.thought = ""; this.toolCalls = [];
    this.first = null; this.last = null; this.usage = null; this.finish = null;
  }

  apply(delta) {
    const now = performance.now();
    let grew = false;
    const reasoning = delta.reasoning_content || delta.reasoning;
    if (reasoning) { this.thought += reasoning; grew = true; }
    if (delta.content) { this.text += delta.content; grew = true; }
    for (const call of delta.tool_calls || []) {
      const slot = this.toolCalls[call.index] ||= { id: call.id || "", name: "", arguments: "" };
      if (call.function && call.function.name) slot.name += call.function.name;
      if (call.function && call.function.arguments) slot.arguments += call.function.arguments;
      grew = true;
    }
    if (grew) { this.first ??= now; this.last = now; }
    this.show();
  }

  show() {
    if (this.thought) {
      this.reasoning.hidden = false;
      this.reasoningText.textContent = this.thought;
    }
    renderMarkdown(this.content, this.text);
    this.calls.replaceChildren(...this.toolCalls.filter(Boolean).map(
      (c) => el("div", "tool-call", `${c.name}(${c.arguments})`)));
    this.li.scrollIntoView({ block: "end" });
  }

  fail(message) { this.li.append(el("div", "error", message)); }

  done(started, stopped) {
    const bits = [];
    if (stopped) bits.push("stopped");
    else if (this.finish) bits.push(this.finish);
    if (this.usage) {
      const n = this.usage.completion_tokens;
      bits.push(`${n} tokens`);
      if (n > 1 && this.last > this.first) {
        bits.push(`${((n - 1) * 1000 / (this.last - this.first)).toFixed(1)} tokens/s`);
      }
    }
    if (this.first !== null) bits.push(`first token ${Math.round(this.first - started)} ms`);
    this.stats.textContent = bits.join(" · ");
  }

  message() {
    const m = { role: "assistant", content: this.text };
    const calls = this.toolCalls.filter(Boolean);
    if (calls.length) {
      m.tool_calls = calls.map((c) => ({ id: c.id, type: "function",
                                         function: { name: c.name, arguments: c.arguments } }));
    }
    return m;
  }
}

// The JSON of each `data:` event of a Server-Sent Events body, up to [DONE].
async function* events(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  }
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").disabled = !busy;
}

function request(messages) {
  const body = { model: $("model").value, messages, stream: true,
                 stream_options: { include_usage: true } };
  const system = $("system").value.trim();
  if (system) body.messages = [{ role: "system", content: system }, ...messages];
  const temperature = parseFloat($("temperature").value);
  if (!Number.isNaN(temperature)) body.temperature = temperature;
  const maxTokens = parseInt($("max-tokens").value, 10);
  if (maxTokens > 0) body.max_tokens = maxTokens;
  if ($("json-reply").checked) body.response_format = { type: "json_object" };
  const tools = $("tools").value.trim();
  if (tools) {
    body.tools = JSON.parse(tools);  // a SyntaxError is said where the reply goes
    body.tool_choice = $("tool-choice").value;
  }
  return body;
}

async function send(event) {
  event.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || state.controller || !$("model").value) return;
  $("prompt").value = "";
  localStorage.setItem("flm-model", $("model").value);
  // this chat's turns: "New chat" during the reply starts another list, which this reply
  // (stopped) never joins
  const history = state.history;
  history.push({ role: "user", content: text });
  addTurn("user", text);
  const reply = new Reply();
  const controller = state.controller = new AbortController();
  setBusy(true);
  const started = performance.now();
  let stopped = false;
  try {
    let body;
    try { body = JSON.stringify(request(history)); }
    catch (e) { reply.fail("Tools: " + e.message); return; }
    const response = await fetch("v1/chat/completions", {
      method: "POST", headers: headers(), body, signal: controller.signal });
    if (!response.ok) {
      reply.fail(await errorText(response));
      if (response.status === 401) askForKey("This server needs an API key.");
      return;
    }
    for await (const chunk of events(response.body)) {
      if (chunk.error) { reply.fail(chunk.error.message); break; }
      if (chunk.usage) reply.usage = chunk.usage;
      for (const choice of chunk.choices || []) {
        if (choice.delta) reply.apply(choice.delta);
        if (choice.finish_reason) reply.finish = choice.finish_reason;
      }
    }
  } catch (e) {
    if (e.name === "AbortError") stopped = true;
    else reply.fail(e.message || String(e));
  } finally {
    state.controller = null;
    setBusy(false);
    reply.done(started, stopped);
    const m = reply.message();
    if (m.content || m.tool_calls) history.push(m);
    else history.pop();  // nothing came back: the question is not in the chat
    $("prompt").focus();
  }
}

function newChat() {
  if (state.controller) state.controller.abort();
  state.history = [];
  $("turns").replaceChildren();
  $("prompt").focus();
}

document.addEventListener("DOMContentLoaded", () => {
  $("composer").addEventListener("submit", send);
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("composer").requestSubmit(); }
  });
  $("stop").addEventListener("click", () => state.controller && state.controller.abort());
  $("new-chat").addEventListener("click", newChat);
  $("key-form").addEventListener("submit", (e) => {
    e.preventDefault();
    state.key = $("api-key").value.trim();
    localStorage.setItem(KEY, state.key);
    loadModels();
  });
  loadModels();
});
