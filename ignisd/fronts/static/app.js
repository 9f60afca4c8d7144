// The playground page: chat, reuse fingerprint and monitor, wired together. Plain ES modules, same origin only.

import { apiKey, askKey } from "./api.js";
import { Chat } from "./chat.js";
import { Fingerprint } from "./fingerprint.js";
import { Monitor } from "./monitor.js";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);

const DEFAULT_SYSTEM = "You are a concise assistant served by ignis, a local inference daemon. Answer in plain " +
  "sentences, keep replies short, and say so when you do not know. The conversation may be long and the user " +
  "may edit earlier messages; treat the latest version of each message as the truth.";

function number(id, integer) {
  const v = $(id).value.trim();
  if (v === "") return undefined;
  const n = Number(v);
  return Number.isFinite(n) ? (integer ? Math.trunc(n) : n) : undefined;
}

// The sampling fields and tools of the next request (blank fields are left to the daemon's defaults).
function settings() {
  const out = {};
  for (const [k, integer] of [["temperature", false], ["top_p", false], ["max_tokens", true], ["seed", true]]) {
    const v = number(k, integer);
    if (v !== undefined) out[k] = v;
  }
  const thinking = $("thinking").value;
  if (thinking) out.chat_template_kwargs = { enable_thinking: thinking === "on" };
  const tools = $("tools").value.trim();
  if (tools) {
    try {
      out.tools = JSON.parse(tools);
      $("tools").removeAttribute("aria-invalid");
    } catch {
      $("tools").setAttribute("aria-invalid", "true");
    }
  }
  return out;
}

function main() {
  $("system").value = params.get("system") ?? DEFAULT_SYSTEM;
  let fingerprint = null;
  const chat = new Chat({
    settings,
    onchange: () => fingerprint.schedule(),
    ondone: () => fingerprint.schedule(),
  });
  // the body the next request would send: its messages with the draft, tools and template kwargs
  fingerprint = new Fingerprint(() => {
    const s = settings();
    const body = { messages: chat.messages(true) };
    if (s.tools) body.tools = s.tools;
    if (s.chat_template_kwargs) body.chat_template_kwargs = s.chat_template_kwargs;
    return body;
  });
  for (const id of ["system", "tools", "thinking", "role"]) {
    $(id).addEventListener("input", () => fingerprint.schedule());
  }
  const monitor = new Monitor({
    interval: Number(params.get("interval")) || 1,
    onretained: () => fingerprint.schedule(),
    onmodel: (st) => {
      const m = st.model || {};
      const d = st.daemon ? ` · ${st.daemon.state}` : "";
      $("model").textContent = `${m.name || "?"} · ${m.kv_format || "?"} · context ${m.context_tokens || "?"} ` +
        `tokens · page ${m.page_tokens || "?"} tokens${d}`;
    },
  });
  $("key-button").hidden = !apiKey();
  $("key-button").addEventListener("click", () => { sessionStorage.removeItem("ignis.apiKey"); askKey(""); });
  monitor.run();
  fingerprint.schedule();
  $("input").focus();
}

main();
