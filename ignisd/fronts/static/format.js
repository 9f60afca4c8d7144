// Small DOM and number helpers shared by the page's modules.

// An element: el("div", {class: "x", text: "hi", "data-k": "v"}, child, ...).
export function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "text") e.textContent = v;
    else if (k === "class") e.className = v;
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children) if (c !== null && c !== undefined) e.append(c);
  return e;
}

// Bytes with a binary unit: 1536 → "1.5 KiB".
export function bytes(n) {
  if (!Number.isFinite(n)) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? String(Math.round(n)) : n.toFixed(n < 10 ? 2 : 1)) + " " + units[i];
}

// Seconds as "42 s", "3 min 5 s", "2 h 1 min".
export function age(s) {
  if (!Number.isFinite(s)) return "–";
  s = Math.max(0, Math.round(s));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

// A number with at most `digits` decimals ("–" for null).
export function num(x, digits = 1) {
  if (x === null || x === undefined || !Number.isFinite(Number(x))) return "–";
  return Number(x).toLocaleString("en-US", { maximumFractionDigits: digits });
}

// fn called `ms` after the last of a burst of calls.
export function debounce(fn, ms) {
  let t = null;
  return (...args) => { clearTimeout(t); t = setTimeout(() => fn(...args), ms); };
}
