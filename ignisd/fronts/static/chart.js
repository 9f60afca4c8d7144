// The Monitor's strip chart: reuse hits, restored tokens and mean TTFT per second over the last minutes, drawn on a
// canvas from the differences of the status stream's running counters.

const BANDS = [
  { key: "hits", label: "reuse hits / s", color: "--retained", kind: "bars" },
  { key: "restored", label: "restored tokens / s", color: "--live", kind: "area" },
  { key: "ttft", label: "mean TTFT ms", color: "--amber", kind: "dots" },
];

export class StripChart {
  constructor(canvas, seconds = 300) {
    this.canvas = canvas;
    this.seconds = seconds;
    this.samples = [];          // {t, hits, restored, ttft (null: no request finished)}
    this.last = null;           // {t, counters}
  }

  // A status snapshot's counters at time t (ms): one sample of per-second rates.
  push(t, c) {
    if (!c) return;
    const prev = this.last;
    this.last = { t, c };
    if (!prev) return;
    const dt = Math.max(0.001, (t - prev.t) / 1000);
    const dCount = c.ttft_count - prev.c.ttft_count;
    const dHits = c.reuse_hits - prev.c.reuse_hits;
    if (dCount < 0 || dHits < 0) { this.samples = []; return; }      // the daemon restarted
    this.samples.push({ t, hits: dHits / dt, restored: (c.reuse_tokens_restored - prev.c.reuse_tokens_restored) / dt,
      ttft: dCount > 0 ? 1000 * (c.ttft_sum_s - prev.c.ttft_sum_s) / dCount : null });
    const horizon = t - this.seconds * 1000;
    while (this.samples.length && this.samples[0].t < horizon) this.samples.shift();
  }

  totals() {
    const s = this.samples;
    const sum = (k) => s.reduce((a, x) => a + (x[k] || 0), 0);
    return { hits: sum("hits"), restored: sum("restored") };
  }

  draw() {
    const cv = this.canvas;
    const ratio = window.devicePixelRatio || 1;
    const w = cv.clientWidth || 560, h = cv.clientHeight || 180;
    if (cv.width !== Math.round(w * ratio)) { cv.width = Math.round(w * ratio); cv.height = Math.round(h * ratio); }
    const g = cv.getContext("2d");
    g.setTransform(ratio, 0, 0, ratio, 0, 0);
    g.clearRect(0, 0, w, h);
    const css = getComputedStyle(document.documentElement);
    const fg = css.getPropertyValue("--muted").trim() || "#666";
    const line = css.getPropertyValue("--line").trim() || "#ccc";
    const now = this.last ? this.last.t : 0;
    const left = 6, right = w - 6, bandH = h / BANDS.length;
    const x = (t) => right - (now - t) / (this.seconds * 1000) * (right - left);
    g.font = "11px system-ui, sans-serif";
    BANDS.forEach((b, i) => {
      const top = i * bandH + 14, bottom = (i + 1) * bandH - 3;
      const vals = this.samples.map((s) => s[b.key]).filter((v) => v !== null);
      const max = Math.max(1e-9, ...vals);
      const y = (v) => bottom - (v / max) * (bottom - top);
      g.strokeStyle = line;
      g.beginPath(); g.moveTo(left, bottom + 0.5); g.lineTo(right, bottom + 0.5); g.stroke();
      const color = css.getPropertyValue(b.color).trim() || "#333";
      g.fillStyle = color; g.strokeStyle = color;
      const last = this.samples.length ? this.samples[this.samples.length - 1][b.key] : null;
      if (b.kind === "bars") {
        for (const s of this.samples) if (s[b.key] > 0) g.fillRect(x(s.t) - 1.5, y(s[b.key]), 3, bottom - y(s[b.key]));
      } else if (b.kind === "area") {
        g.globalAlpha = 0.35;
        g.beginPath(); g.moveTo(x(this.samples.length ? this.samples[0].t : now), bottom);
        for (const s of this.samples) g.lineTo(x(s.t), y(s[b.key]));
        g.lineTo(x(now), bottom); g.closePath(); g.fill();
        g.globalAlpha = 1;
      } else {
        for (const s of this.samples) {
          if (s[b.key] === null) continue;
          g.beginPath(); g.arc(x(s.t), y(s[b.key]), 2.5, 0, 2 * Math.PI); g.fill();
        }
      }
      g.fillStyle = fg;
      const peak = vals.length ? Math.max(...vals) : 0;
      g.fillText(`${b.label}  (peak ${peak.toFixed(peak < 10 ? 1 : 0)}` +
        (last !== null && last !== undefined ? `, now ${last.toFixed(last < 10 ? 1 : 0)})` : ")"), left, top - 3);
    });
  }
}
