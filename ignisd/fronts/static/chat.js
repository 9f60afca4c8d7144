// The conversation: messages (editable, deletable), the composer, and streamed replies from
// POST /v1/chat/completions (SSE), each with its reuse and timing figures.

import { ApiError, call, events } from "./api.js";
import { el, num } from "./format.js";

const TIERS = { device: "device", ram: "KV-RAM", disk: "KV-disk" };

function statItem(key, label, value, cls) {
  return el("div", { "data-k": key, class: cls }, el("dt", { text: label }), el("dd", { text: value }));
}

// The figures of a finished reply: ids and values the page reads from the stream's usage and ignis objects.
function statsList(m) {
  const u = m.usage || {};
  const cached = (u.prompt_tokens_details || {}).cached_tokens;
  const ig = m.ignis || {};
  const reuse = ig.reuse || {};
  const t = ig.timings || {};
  const hit = reuse.tier && reuse.cached_tokens > 0;
  const why = reuse.reason && reuse.reason !== "miss" ? `: ${reuse.reason}` : "";
  const reuseText = hit ? `${TIERS[reuse.tier] || reuse.tier} ${reuse.kind}` : `miss${why}`;
  return el("dl", { class: "stats", "aria-label": "Reply figures" },
    statItem("cached", "cached", cached === undefined ? "–" : String(cached), hit ? "" : "miss"),
    statItem("prompt", "of prompt", u.prompt_tokens === undefined ? "–" : String(u.prompt_tokens)),
    statItem("reuse", "reuse", reuseText, hit ? "" : "miss"),
    statItem("ttft", "TTFT", t.ttft_ms === undefined ? "–" : `${num(t.ttft_ms, 1)} ms`),
    statItem("rate", "decode", t.decode_tokens_per_s === undefined ? "–" : `${num(t.decode_tokens_per_s, 1)} tok/s`),
    statItem("generated", "generated", u.completion_tokens === undefined ? "–" : String(u.completion_tokens)),
    statItem("finish", "finish", m.finish || "–"),
    statItem("id", "id", m.id || "–"));
}

export class Chat {
  // settings(): the sampling fields and tools of a request; onchange(): the conversation or draft changed.
  constructor({ settings, onchange, ondone }) {
    this.settings = settings;
    this.onchange = onchange;
    this.ondone = ondone;
    this.history = [];                 // {role, content, reasoning, toolCalls, tool_call_id, usage, ignis, ...}
    this.controller = null;
    this.log = document.getElementById("log");
    this.input = document.getElementById("input");
    this.role = document.getElementById("role");
    this.system = document.getElementById("system");
    this.sendButton = document.getElementById("send");
    this.stopButton = document.getElementById("stop");
    this.errorLine = document.getElementById("chat-error");
    document.getElementById("composer").addEventListener("submit", (ev) => { ev.preventDefault(); this.send(); });
    this.input.addEventListener("keydown", (ev) => {
      if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); this.send(); }
    });
    this.input.addEventListener("input", () => this.onchange());
    this.stopButton.addEventListener("click", () => this.stop());
    document.getElementById("new-chat").addEventListener("click", () => this.clear());
  }

  // The OpenAI messages of the conversation (system prompt first), optionally with the draft as the next message.
  messages(withDraft) {
    const out = [];
    if (this.system.value.trim()) out.push({ role: "system", content: this.system.value });
    for (const m of this.history) {
      if (m.failed) continue;
      if (m.role === "assistant") {
        const a = { role: "assistant", content: m.content || (m.toolCalls.length ? null : "") };
        if (m.toolCalls.length) a.tool_calls = m.toolCalls.map((c) => ({ id: c.id, type: "function",
          function: { name: c.name, arguments: c.arguments } }));
        out.push(a);
      } else {
        out.push(m.role === "tool" ? { role: "tool", content: m.content, tool_call_id: m.tool_call_id }
          : { role: m.role, content: m.content });
      }
    }
    if (withDraft && this.input.value.trim()) out.push(this.draftMessage());
    return out;
  }

  draftMessage() {
    if (this.role.value === "tool") {
      const last = [...this.history].reverse().find((m) => m.toolCalls && m.toolCalls.length);
      return { role: "tool", content: this.input.value, tool_call_id: last ? last.toolCalls[0].id : "call_0" };
    }
    return { role: "user", content: this.input.value };
  }

  busy() { return this.controller !== null; }

  async send() {
    if (this.busy() || !this.input.value.trim()) return;
    this.errorLine.textContent = "";
    const draft = this.draftMessage();
    this.history.push({ ...draft, toolCalls: [] });
    this.input.value = "";
    const body = { ...this.settings(), messages: this.messages(false), stream: true,
      stream_options: { include_usage: true } };
    const m = { role: "assistant", content: "", reasoning: "", toolCalls: [], pending: true };
    this.history.push(m);
    this.render();
    this.controller = new AbortController();
    this.sendButton.disabled = true;
    this.stopButton.disabled = false;
    try {
      await this.stream(m, body, this.controller.signal);
    } catch (e) {
      if (e.name === "AbortError") m.finish = "stopped";
      else { m.failed = true; m.error = e instanceof ApiError ? `${e.code || e.status}: ${e.message}` : String(e); }
    } finally {
      m.pending = false;
      this.controller = null;
      this.sendButton.disabled = false;
      this.stopButton.disabled = true;
      this.render();
      this.input.focus();
      this.ondone(m);
    }
  }

  async stream(m, body, signal) {
    const resp = await call("/v1/chat/completions", { method: "POST", body, signal });
    if (!resp.ok) {
      let err = null;
      try { err = await resp.json(); } catch { err = null; }
      throw new ApiError(resp.status, err);
    }
    for await (const { data } of events(resp)) {
      if (data === "[DONE]") break;
      if (data.error) throw new ApiError(500, data);
      if (data.id) m.id = data.id;
      if (data.ignis) m.ignis = data.ignis;
      if (data.usage) m.usage = data.usage;
      const choice = (data.choices || [])[0];
      if (!choice) continue;
      const d = choice.delta || {};
      if (d.content) m.content += d.content;
      if (d.reasoning_content) m.reasoning += d.reasoning_content;
      for (const p of d.tool_calls || []) {
        const c = m.toolCalls[p.index] || (m.toolCalls[p.index] = { id: "", name: "", arguments: "" });
        if (p.id) c.id = p.id;
        if (p.function && p.function.name) c.name = p.function.name;
        if (p.function && p.function.arguments) c.arguments += p.function.arguments;
      }
      if (choice.finish_reason) m.finish = choice.finish_reason;
      this.update(m);
    }
  }

  stop() {
    if (this.controller) this.controller.abort();
  }

  clear() {
    this.stop();
    this.history = [];
    this.render();
    this.onchange();
  }

  // ---- rendering ----
  render() {
    this.log.replaceChildren(...this.history.map((m, i) => this.item(m, i)));
    this.log.scrollTop = this.log.scrollHeight;
  }

  update(m) {
    const i = this.history.indexOf(m);
    const old = this.log.children[i];
    if (old) old.replaceWith(this.item(m, i));
    this.log.scrollTop = this.log.scrollHeight;
  }

  item(m, i) {
    const actions = el("span", { class: "actions" });
    if (!m.pending) {
      const edit = el("button", { type: "button", text: m.editing ? "Done" : "Edit",
        "aria-label": `${m.editing ? "Finish editing" : "Edit"} message ${i + 1}` });
      edit.addEventListener("click", () => { m.editing = !m.editing; this.render(); if (!m.editing) this.onchange(); });
      const del = el("button", { type: "button", text: "Delete", "aria-label": `Delete message ${i + 1}` });
      del.addEventListener("click", () => { this.history.splice(i, 1); this.render(); this.onchange(); });
      actions.append(edit, del);
    }
    const who = el("div", { class: "who" }, el("span", { text: m.role === "tool" ? "tool result" : m.role }),
      m.pending ? el("span", { class: "muted", text: "streaming…" }) : null, actions);
    const li = el("li", { class: `msg ${m.role}`, "data-index": i, "data-role": m.role }, who);
    if (m.reasoning) {
      li.append(el("details", { class: "reasoning" }, el("summary", { text: `reasoning (${m.reasoning.length} chars)` }),
        el("div", { class: "text", text: m.reasoning })));
    }
    if (m.editing) {
      const ta = el("textarea", { class: "edit", rows: 3, "aria-label": `Text of message ${i + 1}` });
      ta.value = m.content || "";
      ta.addEventListener("input", () => { m.content = ta.value; this.onchange(); });
      ta.addEventListener("keydown", (ev) => { if (ev.key === "Escape") { m.editing = false; this.render(); } });
      li.append(ta);
      setTimeout(() => ta.focus(), 0);
    } else {
      li.append(el("div", { class: "body", text: m.content || "" }));
    }
    for (const c of m.toolCalls || []) {
      li.append(el("div", { class: "toolcall", "data-k": "tool-call" }, `tool call ${c.name}(${c.arguments})`,
        c.id ? el("span", { class: "muted", text: `  ${c.id}` }) : null));
    }
    if (m.failed) li.append(el("p", { class: "error", text: m.error }));
    if (m.role === "assistant" && !m.pending && !m.failed) li.append(statsList(m));
    return li;
  }
}
