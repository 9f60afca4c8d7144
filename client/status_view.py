"""`ignis status` as text bars: the KV pool, the retained-slot block, the KV-RAM arena and the KV-disk tier with used
and free bytes, the lanes and the queue, and the retained states — what a person glances at (issue 13).

Standard library only. ``render_status(status)`` draws one `status` op result (DESIGN §5) as lines of plain text;
a bar is ``[`` + width cells + ``]``: ``#`` for live use, ``=`` for retained states (KV pool), ``.`` for free.
Sizes are binary (KiB, MiB, GiB); ages are s / m / h.
"""
from __future__ import annotations

BAR_WIDTH = 32
TIER_NAMES = {"ram": "KV-RAM", "disk": "KV-disk"}


def human_bytes(n: float) -> str:
    """Bytes in binary units with three significant figures: "0 B", "512 B", "1.50 KiB", "48.0 MiB", "2.00 GiB"."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            if unit == "B":
                return f"{int(n)} B"
            return f"{n:.2f} {unit}" if n < 10 else f"{n:.1f} {unit}" if n < 100 else f"{n:.0f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def human_age(s: float) -> str:
    """Seconds as "12s", "3m05s", "2h01m"."""
    s = int(s)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def bar(parts: list[tuple[float, str]], total: float, width: int = BAR_WIDTH) -> str:
    """``[###==.....]``: each (amount, char) part takes its share of `width` cells (rounded, at least one cell for a
    non-zero amount), the rest is ``.``. total 0 draws an empty bar of spaces."""
    if total <= 0:
        return "[" + " " * width + "]"
    cells, used = [], 0
    for amount, ch in parts:
        n = round(width * amount / total)
        if amount > 0:
            n = max(n, 1)
        n = min(n, width - used)
        cells.append(ch * n)
        used += n
    return "[" + "".join(cells) + "." * (width - used) + "]"


def _kv_lines(st: dict, width: int) -> list[str]:
    kv, page_bytes = st["kv_pool"], st["model"].get("page_bytes", 0)
    total, live, ret, free = kv["pages_total"], kv["pages_live"], kv["pages_retained"], kv["pages_free"]
    used = total - free
    return [f"KV pool   {bar([(live, '#'), (ret, '=')], total, width)} "
            f"{human_bytes(used * page_bytes)} used of {human_bytes(total * page_bytes)}, "
            f"{human_bytes(free * page_bytes)} free",
            f"          {live} live + {ret} retained of {total} pages ({st['model'].get('page_tokens', 64)} tokens a "
            f"page, {human_bytes(page_bytes)})"]


def _slot_line(st: dict, width: int) -> str:
    sl, each = st["slots"], st["model"].get("state_bytes", 0)
    total = sl["device_total"] + sl["host_total"]
    if total == 0:
        return "slots     none (no per-sequence state to retain on this model)"
    used = total - sl["device_free"] - sl["host_free"]
    return (f"slots     {bar([(used, '#')], total, width)} {used} used of {total} "
            f"(device {sl['device_total'] - sl['device_free']}/{sl['device_total']}, "
            f"host {sl['host_total'] - sl['host_free']}/{sl['host_total']}), "
            f"{human_bytes(used * each)} of {human_bytes(total * each)}")


def _tier_line(st: dict, tier: str, width: int) -> str:
    name = f"{TIER_NAMES[tier]:<9} "
    row = next((t for t in st.get("tiers", []) if t.get("tier") == tier), None)
    if row is None or not row.get("bytes_total"):
        return name + "off"
    total, used = row["bytes_total"], row["bytes_used"]
    return (f"{name}{bar([(used, '#')], total, width)} {human_bytes(used)} used of {human_bytes(total)}, "
            f"{human_bytes(total - used)} free, {row.get('states', 0)} states")


def _retained_lines(st: dict) -> list[str]:
    rows = st.get("retained", [])
    if not rows:
        return ["retained  none"]
    out = [f"retained  {'kind':<11}{'tokens':>7}  {'tier':<7}{'age':>7}  {'idle':>6}  priority"]
    for r in rows:
        out.append(f"          {r['kind']:<11}{r['tokens']:>7}  {r['tier']:<7}{human_age(r.get('age_s', 0)):>7}  "
                   f"{human_age(r.get('idle_s', 0)):>6}  {r.get('priority', '-')}")
    return out


def render_status(st: dict, width: int = BAR_WIDTH) -> str:
    """The whole picture of one `status` result, as text lines joined by newlines (ending with one)."""
    m, lanes, daemon = st["model"], st["lanes"], st.get("daemon", {})
    head = f"ignisd    {m.get('name')} ({m.get('arch')}, {m.get('kv_format')} KV, context {m.get('context_tokens')})"
    if daemon:
        head += f"  {daemon.get('state')}, up {human_age(daemon.get('uptime_s', 0))}"
    busy = lanes["prefill"] + lanes["decode"]
    lines = [head, *_kv_lines(st, width), _slot_line(st, width), _tier_line(st, "ram", width),
             _tier_line(st, "disk", width),
             f"lanes     {bar([(busy, '#')], lanes['total'], width)} {busy} of {lanes['total']} busy "
             f"({lanes['prefill']} prefill, {lanes['decode']} decode, {lanes['evicted']} evicted)",
             f"queue     {st['queue']['waiting']} waiting",
             *_retained_lines(st)]
    reqs = st.get("requests", [])
    if reqs:
        lines.append(f"requests  {'id':<24}{'state':<10}{'prompt':>7}{'cached':>7}{'generated':>10}")
        for r in reqs:   # by the id its log lines name (request_id); a daemon from before it gives only the key
            name = str(r.get("request_id", r["id"]))[:23]
            lines.append(f"          {name:<24}{r['state']:<10}{r['prompt_tokens']:>7}{r['cached_tokens']:>7}"
                         f"{r['generated']:>10}")
    return "\n".join(lines) + "\n"
