"""Prometheus metrics of one daemon (prometheus-client, in a registry of its own). †: imports no torch.

Served by the ``metrics`` op (``{"text": render()}``) and, later, over HTTP. Names and units follow the Prometheus
conventions: seconds, ``_total`` on counters (added by prometheus-client), ``_bytes`` on sizes.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.exposition import generate_latest

from ignis_client.protocol import ERROR_CODES, FINISH_REASONS

# `*_created` timestamp series double every counter's exposition and no dashboard reads them
disable_created_metrics()

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
INTER_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5)


class Metrics:
    """All metrics of ignisd. Attributes (prometheus-client objects; call .set/.inc/.observe on them):

    kv_pool_pages (gauge, pages in the KV pool), kv_pool_used_pages (gauge, pages held by sequences or retained
    states), kv_page_bytes (gauge, bytes of one page over all attention layers, K and V), lanes_busy (gauge, lanes
    running a request), queue_depth (gauge, requests waiting), prefill_tokens_total (counter, prompt tokens run
    through the model), decode_tokens_total (counter, tokens generated), requests_total (counter with label
    finish_reason, finished requests), errors_total (counter with label code, error replies), ttft_seconds (histogram,
    arrival → first token), inter_token_seconds (histogram, gap between consecutive tokens of one request).
    Attribute names equal the exposed sample names less ``ignis_``; prefill_tokens, decode_tokens, requests and errors
    are aliases of the four counters. Prompt reuse (DESIGN §4.4): reuse_lookups, reuse_hits (labels kind, tier),
    reuse_tokens_restored, reuse_captures (label kind), reuse_captures_skipped (label reason); the tokens prefilled
    are prefill_tokens. Tiers (DESIGN §4.5), label tier: tier_bytes_used, tier_bytes_total, tier_states (gauges),
    tier_demotions, tier_restores, tier_restore_bytes, tier_restore_seconds (counters); tier_disk_writes,
    tier_disk_write_bytes, tier_disk_reads, tier_disk_read_bytes, tier_disk_errors (counters); live_evictions
    (label how: moved / recomputed).
    """

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.kv_pool_pages = Gauge("ignis_kv_pool_pages", "Pages in the KV pool.", registry=r)
        self.kv_pool_used_pages = Gauge("ignis_kv_pool_used_pages",
                                        "KV pool pages held by live sequences or retained states.", registry=r)
        self.kv_page_bytes = Gauge("ignis_kv_page_bytes",
                                   "Bytes of one KV page (64 tokens, every attention layer, K and V).", registry=r)
        self.lanes_busy = Gauge("ignis_lanes_busy", "Decode lanes running a request.", registry=r)
        self.queue_depth = Gauge("ignis_queue_depth", "Requests waiting for admission.", registry=r)
        self.prefill_tokens_total = Counter("ignis_prefill_tokens", "Prompt tokens run through the model (prefill).",
                                            registry=r)
        self.decode_tokens_total = Counter("ignis_decode_tokens", "Tokens generated (decode).", registry=r)
        self.requests_total = Counter("ignis_requests", "Requests finished, by finish reason.", ["finish_reason"],
                                      registry=r)
        self.errors_total = Counter("ignis_errors", "Error replies sent, by error code.", ["code"], registry=r)
        self.ttft_seconds = Histogram("ignis_ttft_seconds", "Time from a request's arrival to its first token.",
                                      buckets=TTFT_BUCKETS, registry=r)
        self.inter_token_seconds = Histogram("ignis_inter_token_seconds",
                                             "Time between consecutive generated tokens of one request.",
                                             buckets=INTER_TOKEN_BUCKETS, registry=r)
        self.reuse_lookups = Counter("ignis_reuse_lookups", "Retained-state lookups at admission.", registry=r)
        self.reuse_hits = Counter("ignis_reuse_hits",
                                  "Admissions that resumed from a retained state, by kind and tier.",
                                  ["kind", "tier"], registry=r)
        self.reuse_tokens_restored = Counter("ignis_reuse_tokens_restored",
                                             "Prompt tokens restored from retained states instead of prefilled.",
                                             registry=r)
        self.reuse_captures = Counter("ignis_reuse_captures", "Retained states captured, by kind.", ["kind"],
                                      registry=r)
        self.reuse_captures_skipped = Counter("ignis_reuse_captures_skipped",
                                              "Captures not taken, by reason (no_slot, duplicate).", ["reason"],
                                              registry=r)
        self.tier_bytes_used = Gauge("ignis_tier_bytes_used", "Bytes held in each tier (device, ram, disk).",
                                     ["tier"], registry=r)
        self.tier_bytes_total = Gauge("ignis_tier_bytes_total", "Size of each tier in bytes.", ["tier"], registry=r)
        self.tier_states = Gauge("ignis_tier_states", "Retained states held in each tier.", ["tier"], registry=r)
        self.tier_demotions = Counter("ignis_tier_demotions", "Retained states moved down into a tier.", ["tier"],
                                      registry=r)
        self.tier_restores = Counter("ignis_tier_restores", "Restores from each tier.", ["tier"], registry=r)
        self.tier_restore_bytes = Counter("ignis_tier_restore_bytes", "Bytes restored from each tier.", ["tier"],
                                          registry=r)
        self.tier_restore_seconds = Counter("ignis_tier_restore_seconds",
                                            "Seconds spent restoring from each tier (bytes / seconds = restore "
                                            "bandwidth).", ["tier"], registry=r)
        self.tier_disk_writes = Counter("ignis_tier_disk_writes", "KV-disk files written.", registry=r)
        self.tier_disk_write_bytes = Counter("ignis_tier_disk_write_bytes", "Bytes of KV-disk files written.",
                                             registry=r)
        self.tier_disk_reads = Counter("ignis_tier_disk_reads", "KV-disk files read back for a restore.", registry=r)
        self.tier_disk_read_bytes = Counter("ignis_tier_disk_read_bytes", "Bytes of KV-disk files read back.",
                                            registry=r)
        self.tier_disk_errors = Counter("ignis_tier_disk_errors",
                                        "KV-disk faults (no space, I/O error, removed or corrupt file).", registry=r)
        self.live_evictions = Counter("ignis_live_evictions",
                                      "Running sequences preempted for a higher-ranked request, by how: moved "
                                      "(to KV-RAM and restored) or recomputed.", ["how"], registry=r)
        for how in ("moved", "recomputed"):
            self.live_evictions.labels(how=how)
        for tier in ("device", "ram", "disk"):
            for m in (self.tier_demotions, self.tier_restores, self.tier_restore_bytes, self.tier_restore_seconds):
                m.labels(tier=tier)
        self.prefill_tokens, self.decode_tokens = self.prefill_tokens_total, self.decode_tokens_total
        self.requests, self.errors = self.requests_total, self.errors_total
        for reason in FINISH_REASONS:          # present at 0 from the start, so rates work from the first scrape
            self.requests.labels(finish_reason=reason)
        for code in ERROR_CODES:
            self.errors.labels(code=code)
        for kind in ("prefix", "checkpoint"):
            self.reuse_captures.labels(kind=kind)
            self.reuse_hits.labels(kind=kind, tier="device")
        for reason in ("no_slot", "duplicate"):
            self.reuse_captures_skipped.labels(reason=reason)

    def set_pool(self, pages: int, used_pages: int, page_bytes: int) -> None:
        """Update the three KV pool gauges at once (pages, used pages, bytes per page)."""
        self.kv_pool_pages.set(pages)
        self.kv_pool_used_pages.set(used_pages)
        self.kv_page_bytes.set(page_bytes)

    def request_finished(self, finish_reason: str) -> None:
        """Count one finished request. Raises ValueError for a finish reason outside protocol.FINISH_REASONS."""
        if finish_reason not in FINISH_REASONS:
            raise ValueError(f"unknown finish_reason {finish_reason!r}")
        self.requests.labels(finish_reason=finish_reason).inc()

    def error_sent(self, code: str) -> None:
        """Count one error reply. Raises ValueError for a code outside protocol.ERROR_CODES."""
        if code not in ERROR_CODES:
            raise ValueError(f"unknown error code {code!r}")
        self.errors.labels(code=code).inc()

    def render(self) -> str:
        """The Prometheus text exposition (format 0.0.4) of this registry."""
        return generate_latest(self.registry).decode("utf-8")
