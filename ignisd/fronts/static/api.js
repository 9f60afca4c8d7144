// The daemon's HTTP routes as the page uses them: the API key (asked once, kept for the tab in sessionStorage and
// sent as "Authorization: Bearer KEY"), JSON requests, and server-sent events read from a fetch() body (EventSource
// cannot send the header). Same origin only.

const KEY_NAME = "ignis.apiKey";
let asking = null;          // the pending key prompt, shared by every request that got 401 meanwhile

export function apiKey() {
  return sessionStorage.getItem(KEY_NAME);
}

function headers(extra) {
  const h = { ...(extra || {}) };
  const key = apiKey();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

// Ask for the key with the page's dialog; resolves once the user gave one (it is stored for the tab).
export function askKey(message) {
  if (asking) return asking;
  const dialog = document.getElementById("key-dialog");
  const form = document.getElementById("key-form");
  const input = document.getElementById("key-input");
  document.getElementById("key-error").textContent = message || "";
  asking = new Promise((resolve) => {
    const done = (ev) => {
      ev.preventDefault();
      const key = input.value.trim();
      if (!key) return;
      sessionStorage.setItem(KEY_NAME, key);
      form.removeEventListener("submit", done);
      dialog.close();
      input.value = "";
      asking = null;
      resolve(key);
    };
    form.addEventListener("submit", done);
    dialog.addEventListener("cancel", (ev) => ev.preventDefault(), { once: true });   // a key is needed
    if (!dialog.open) dialog.showModal();
    input.focus();
  });
  return asking;
}

export class ApiError extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    super(e.message || `HTTP ${status}`);
    this.status = status;
    this.code = e.code || (e.ignis && e.ignis.code) || null;
    this.field = e.param || null;
  }
}

// fetch() with the key; a 401 asks for the key (again: the stored one was wrong) and retries. A 401 to a request
// sent with a key that has been replaced meanwhile (the user entered another while it was in flight) just retries
// with the new one: only the key that was refused is dropped.
export async function call(path, { method = "GET", body, signal } = {}) {
  for (;;) {
    const sent = apiKey();
    const init = { method, signal, headers: headers(body !== undefined ? { "Content-Type": "application/json" } : {}) };
    if (body !== undefined) init.body = JSON.stringify(body);
    const resp = await fetch(path, init);
    if (resp.status !== 401) return resp;
    const had = apiKey();
    if (had && had !== sent) continue;
    sessionStorage.removeItem(KEY_NAME);
    document.getElementById("key-button").hidden = false;
    await askKey(had ? "That key was refused; enter the daemon's key." : "");
  }
}

// A JSON route: the decoded body, or ApiError.
export async function json(path, opts) {
  const resp = await call(path, opts);
  const text = await resp.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch { body = null; }
  if (!resp.ok) throw new ApiError(resp.status, body);
  return body;
}

// The server-sent events of a response body: yields {event, data} with data decoded as JSON ("[DONE]" kept).
export async function* events(resp) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const frame = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      let event = null;
      const data = [];
      for (const line of frame.split("\n")) {
        if (line.startsWith("event: ")) event = line.slice(7);
        else if (line.startsWith("data: ")) data.push(line.slice(6));
      }
      if (!data.length) continue;
      const payload = data.join("\n");
      yield { event, data: payload === "[DONE]" ? payload : JSON.parse(payload) };
    }
  }
}
