// The reuse fingerprint: the next request's prompt rendered through POST /ignis/tokenize, and what it would resume
// from the kept states (POST /ignis/reuse: the admission's own lookup, as a peek) — tokens, tier, kind, and the
// first divergence (ignis.reuse.diverged_at) marked in the rendered text. Amber at a miss.

import { json } from "./api.js";
import { debounce, el } from "./format.js";

const TIERS = { device: "device", ram: "KV-RAM", disk: "KV-disk" };

export class Fingerprint {
  // body(): the chat body the next request would send ({messages, tools, ...}).
  constructor(body) {
    this.body = body;
    this.seq = 0;
    this.summary = document.getElementById("fp-summary");
    this.divergence = document.getElementById("fp-divergence");
    this.excerpt = document.getElementById("fp-excerpt");
    this.text = document.getElementById("fp-text");
    this.count = document.getElementById("fp-count");
    this.schedule = debounce(() => this.refresh(), 200);
  }

  async refresh() {
    const seq = ++this.seq;
    const body = this.body();
    if (!body.messages.length) {
      this.show("idle", "nothing to render yet: write a system prompt or a message");
      this.text.replaceChildren();
      return;
    }
    try {
      const [tok, probe] = await Promise.all([json("/ignis/tokenize", { method: "POST", body }),
        json("/ignis/reuse", { method: "POST", body })]);
      if (seq === this.seq) this.render(tok, probe);
    } catch (e) {
      if (seq === this.seq) this.show("error", `cannot render: ${e.message}`);
    }
  }

  show(state, text, data) {
    this.summary.dataset.state = state;
    this.summary.textContent = text;
    for (const k of ["cached", "total", "reason", "tier", "kind", "char"]) delete this.summary.dataset[k];
    Object.assign(this.summary.dataset, data || {});
    if (state !== "hit" && state !== "miss") {
      this.divergence.textContent = "";
      this.excerpt.hidden = true;
    }
  }

  render(tok, probe) {
    const r = probe.reuse;
    const total = probe.prompt_tokens;
    const cached = r.cached_tokens;
    const hit = r.tier !== null && cached > 0;
    const d = r.diverged_at;
    const data = { cached, total, reason: r.reason || "", tier: r.tier || "", kind: r.kind || "",
      char: d ? d.char_offset : "" };
    if (hit) {
      this.show("hit", `resumes ${cached} of ${total} tokens from a ${r.kind} in ${TIERS[r.tier] || r.tier}; ` +
        `${total - cached} to prefill`, data);
    } else {
      const why = r.reason === "miss" ? "" : ` (${r.reason})`;
      this.show("miss", `miss${why}: 0 of ${total} tokens would resume`, data);
    }
    this.count.textContent = `(${tok.tokens.length} tokens, ${tok.text.length} characters)`;
    if (d) {
      const where = d.message_index === null ? "in the template's own text"
        : `in message ${d.message_index} (${d.role})`;
      const best = r.best_candidate;
      const against = best ? ` against a kept ${best.kind} of ${best.tokens} tokens in ${TIERS[best.tier] || best.tier}`
        : "";
      this.divergence.textContent = `first divergence at token ${d.token}, character ${d.char_offset} ${where}${against}`;
      document.getElementById("fp-ours").textContent = d.ours.replaceAll("\n", "\u21b5");
      document.getElementById("fp-theirs").textContent = d.theirs.replaceAll("\n", "\u21b5");
      this.excerpt.hidden = false;
    } else {
      this.divergence.textContent = hit ? `the prompt continues the kept ${r.kind}: new text from token ${cached}`
        : (r.best_candidate ? "" : "no kept state shares a token with this prompt");
      this.excerpt.hidden = true;
    }
    this.paint(tok, hit ? cached : 0, d ? d.char_offset : null, d ? d.token : null);
  }

  // The rendered text: the resumed characters shaded; the first divergence marked from its character to the end of
  // the token that holds it (at least one character).
  paint(tok, cached, divChar, divToken) {
    const text = tok.text;
    let resumedEnd = 0;
    if (cached > 0) resumedEnd = cached < tok.offsets.length ? tok.offsets[cached][0] : text.length;
    const cuts = new Set([0, text.length, resumedEnd]);
    let divEnd = null;
    if (divChar !== null) {
      const t = divToken !== null && divToken < tok.offsets.length ? tok.offsets[divToken] : null;
      divEnd = Math.min(text.length, Math.max(divChar + 1, t && t[0] <= divChar ? t[1] : 0));
      cuts.add(Math.min(divChar, text.length));
      cuts.add(divEnd);
    }
    const points = [...cuts].sort((a, b) => a - b);
    const parts = [];
    for (let i = 0; i + 1 < points.length; i++) {
      const [a, b] = [points[i], points[i + 1]];
      const piece = text.slice(a, b);
      if (divChar !== null && a === divChar) {
        parts.push(el("mark", { id: "fp-mark", "data-char": a, "data-end": divEnd,
          title: `first divergence, character ${a}` }, text.slice(a, divEnd)));
      } else if (!(divChar !== null && a > divChar && b <= divEnd)) {
        parts.push(el("span", { class: b <= resumedEnd ? "resumed" : "after" }, piece));
      }
    }
    if (divChar !== null && divChar >= text.length) {
      parts.push(el("mark", { id: "fp-mark", "data-char": divChar, title: "first divergence: the end" }, "\u200b"));
    }
    this.text.replaceChildren(...parts);
    const mark = document.getElementById("fp-mark");
    if (mark) this.text.scrollTop = Math.max(0, mark.offsetTop - this.text.clientHeight / 2);
  }
}
