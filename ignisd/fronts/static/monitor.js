// The Monitor: GET /ignis/status/stream (one status snapshot a second) drawn as bars (KV pool, retained slots,
// KV-RAM arena, KV-disk), lanes and queue, the running requests, the retained states and the strip chart.

import { call, events } from "./api.js";
import { age, bytes, el } from "./format.js";
import { StripChart } from "./chart.js";

const $ = (id) => document.getElementById(id);

// The fields `names` of object `o`, 0 where absent (a daemon that has no such feature yet reports none).
function zeros(o, names) {
  return Object.fromEntries(names.map((n) => [n, Number((o || {})[n]) || 0]));
}

// Segments of a bar as fractions of its width; the bar's data attributes carry the raw values for readers.
function setBar(bar, fractions, label, data) {
  const segs = bar.querySelectorAll(".seg");
  fractions.forEach((f, i) => { segs[i].style.width = `${Math.max(0, Math.min(1, f)) * 100}%`; });
  bar.setAttribute("aria-label", label);
  Object.assign(bar.dataset, data || {});
}

export class Monitor {
  // interval: seconds between snapshots; onretained(): the retained states changed.
  constructor({ interval = 1, onretained, onmodel }) {
    this.interval = interval;
    this.onretained = onretained;
    this.onmodel = onmodel;
    this.chart = new StripChart($("chart"));
    this.retainedKey = null;
    this.status = null;
  }

  async run() {
    for (;;) {
      try {
        const resp = await call(`/ignis/status/stream?interval=${this.interval}`);
        if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
        $("conn").textContent = "monitor live";
        for await (const { event, data } of events(resp)) if (event === "status") this.update(data);
        $("conn").textContent = "monitor: stream ended; reconnecting";
      } catch (e) {
        $("conn").textContent = `monitor: ${e.message}; reconnecting`;
      }
      await new Promise((r) => setTimeout(r, 2000));
    }
  }

  update(st) {
    this.status = st;
    this.onmodel(st);
    this.pool(st);
    this.slots(st);
    this.tiers(st);
    this.lanes(st);
    this.requests(st);
    this.retained(st);
    this.chart.push(performance.now(), st.counters);
    this.chart.draw();
  }

  pool(st) {
    // a page can be held by a live sequence and a retained state at once (a capture shares the pages in place):
    // the bar shows live pages, then the pages held by retained states only, then free pages
    const k = zeros(st.kv_pool, ["pages_total", "pages_free", "pages_live", "pages_retained"]);
    const pb = (st.model || {}).page_bytes || 0, total = k.pages_total;
    const used = total - k.pages_free, retainedOnly = Math.max(0, used - k.pages_live);
    const shared = Math.max(0, k.pages_retained - retainedOnly);
    const f = (n) => (total ? n / total : 0);
    setBar($("kv-bar"), [f(k.pages_live), f(retainedOnly)],
      `KV pool: ${k.pages_live} live, ${k.pages_retained} retained, ${k.pages_free} free of ${total} pages`,
      { live: k.pages_live, retained: k.pages_retained, shared, free: k.pages_free, total });
    $("kv-text").textContent = `live ${k.pages_live} · retained ${k.pages_retained}` +
      (shared ? ` (${shared} shared with live)` : "") + ` · free ${k.pages_free} of ${total} pages · ` +
      `${bytes(used * pb)} of ${bytes(total * pb)}`;
  }

  slots(st) {
    const s = st.slots || {}, sb = (st.model || {}).state_bytes || 0;
    for (const tier of ["device", "host"]) {
      const total = s[`${tier}_total`] || 0, free = s[`${tier}_free`] || 0, used = total - free;
      setBar($(`slots-${tier}-bar`), [total ? used / total : 0], `${tier} retained slots: ${used} of ${total} used`,
        { used, total });
      $(`slots-${tier}-text`).textContent = total ? `${used} of ${total} slots · ${bytes(used * sb)} of ` +
        `${bytes(total * sb)}` : "none";
    }
  }

  tiers(st) {
    for (const [tier, id] of [["ram", "ram"], ["disk", "disk"]]) {
      const row = (st.tiers || []).find((r) => r.tier === tier);
      if (!row) {
        setBar($(`${id}-bar`), [0], `${tier}: off`, { used: 0, total: 0 });
        $(`${id}-text`).textContent = "off";
        continue;
      }
      setBar($(`${id}-bar`), [row.bytes_total ? row.bytes_used / row.bytes_total : 0],
        `${tier}: ${bytes(row.bytes_used)} of ${bytes(row.bytes_total)}, ${row.states} states`,
        { used: row.bytes_used, total: row.bytes_total, states: row.states });
      $(`${id}-text`).textContent = `${bytes(row.bytes_used)} of ${bytes(row.bytes_total)} · ${row.states} ` +
        `state${row.states === 1 ? "" : "s"}`;
    }
  }

  lanes(st) {
    const l = zeros(st.lanes, ["total", "prefill", "decode", "evicted"]), boxes = [];
    const kinds = [["prefill", l.prefill], ["decode", l.decode]];
    for (const [kind, n] of kinds) for (let i = 0; i < n; i++) boxes.push(el("span", { class: `lane ${kind}`, title: kind }));
    while (boxes.length < l.total) boxes.push(el("span", { class: "lane", title: "idle" }));
    const lanes = $("lanes");
    lanes.replaceChildren(...boxes);
    lanes.setAttribute("aria-label", `${l.total} lanes: ${l.prefill} prefill, ${l.decode} decode`);
    $("lanes-text").textContent = `${l.prefill} prefill · ${l.decode} decode · ${l.evicted} evicted of ${l.total}`;
    $("queue").textContent = String((st.queue || {}).waiting || 0);
  }

  requests(st) {
    const rows = (st.requests || []).map((r) => el("tr", {},
      el("td", { text: r.request_id ?? r.id }), el("td", { text: r.state }), el("td", { text: r.prompt_tokens }),
      el("td", { text: r.cached_tokens }), el("td", { text: r.generated })));
    if (!rows.length) rows.push(el("tr", {}, el("td", { colspan: 5, class: "muted", text: "none running" })));
    $("requests").tBodies[0].replaceChildren(...rows);
  }

  retained(st) {
    const list = [...(st.retained || [])].sort((a, b) => a.age_s - b.age_s);
    const rows = list.map((r) => el("tr", { "data-kind": r.kind, "data-tier": r.tier, "data-tokens": r.tokens },
      el("td", { text: r.kind }), el("td", { text: r.tokens }), el("td", { text: r.tier }),
      el("td", { text: r.priority }), el("td", { text: age(r.age_s) }), el("td", { text: age(r.idle_s) }),
      el("td", { text: r.holders })));
    if (!rows.length) rows.push(el("tr", {}, el("td", { colspan: 7, class: "muted", text: "none kept yet" })));
    $("retained").tBodies[0].replaceChildren(...rows);
    $("retained-count").textContent = `(${list.length})`;
    const key = list.map((r) => `${r.kind}:${r.tier}:${r.tokens}`).sort().join(",");
    // the fingerprint asks again when the kept states change, but never wakes a model the daemon unloaded
    const serving = !st.daemon || st.daemon.state === "ready";
    if (key !== this.retainedKey && serving) {
      this.retainedKey = key;
      this.onretained();
    }
  }
}
