"""One loaded model with everything sized from it: KV pool, state slots, retained store, scheduler, engine, edge.

``preflight(cfg)`` makes every check that needs no weights (DESIGN §6: a refused value stops the start naming the
key, exit 2) and reads the model's metadata; ``ModelStack(plan, metrics, progress)`` then reads the weights and
builds the rest (seconds to minutes: the daemon runs it in a worker thread). ``warmup()`` runs one round on the
engine before the daemon reports ready; ``close()`` lets the memory go. The daemon builds one at start and a new
one after an idle unload or a reload (ignisd.lifecycle.ModelHost); the Metrics object outlives them.
"""
from __future__ import annotations

import ctypes
import gc
import time
from dataclasses import dataclass

import torch

from ignis_kernels.attention import decode_kernel
from ignis_kernels.kvq import encode_kernel, window_kernel
from ignis_kernels.linear import weight_kernel
from ignis_kernels.norm import norm_kernel
from ignisd.buffers import total_bytes
from ignisd.cache.kv_format import get_kv_format
from ignisd.cache.kv_store import KVStore
from ignisd.cache import transfer
from ignisd.cache.manager import CacheManager
from ignisd.cache.page_pool import PagePool
from ignisd.cache.retained import RetainedStore
from ignisd.cache.retained_state import Stamp
from ignisd.cache.state_slots import StateSlots
from ignisd.cache.state_store import StateStore
from ignisd.config import Config
from ignisd.edge import Edge
from ignisd.engine import Engine
from ignisd.log import get_logger
from ignisd.model.loader import ModelSource, load_model, open_model
from ignisd.model.layers import rope_stable_dims
from ignisd.preflight import (StartupError, check_arena, check_disk_dir, check_exact_window, check_formats,
                              check_state_memory, choose_kv_format, context_tokens, state_slot_counts,
                              mem_available_bytes, plan_pool_pages, read_api_key)
from ignisd.request import DoneEvent, ErrorEvent, Request, SamplingParams
from ignisd.runner import Runner
from ignisd.scheduler import Scheduler
from ignisd.text.chat_template import ChatTemplate
from ignisd.text.tokenizer import Tokenizer
from ignisd.tier_setup import build_tiers, index_disk, measure_prefill
from ignisd.vocab import PAGE_TOKENS

log = get_logger("model")
# how each architecture's chat output is split into reasoning / tool calls (ignisd.text.output_parser)
OUTPUT_FAMILIES = {"qwen3_5": "qwen3_5", "qwen3_next": "qwen3"}
WARMUP_TOKENS = 4     # prompt tokens of the warm-up request (one prefill round, then one decode round)


@dataclass
class LoadPlan:
    """What preflight found: the configuration, the API key, the KV format, the model's metadata (source), the
    context cap (tokens), the KV pool's size (pages) and why that KV format (preflight.choose_kv_format)."""

    cfg: Config
    api_key: str | None
    kv_format: str
    source: ModelSource
    context: int
    pages: int
    kv_why: str = "model.kv_format"

    def kv_format_obj(self):
        """The KVFormat with kv.exact_window / kv.exact_sinks applied (cache.kv_format.get_kv_format)."""
        return get_kv_format(self.kv_format, self.cfg.kv.exact_window, self.cfg.kv.exact_sinks)

    def model_info(self) -> dict:
        """The `status.model` fields known before the weights load (page and state bytes are 0 until then)."""
        spec = self.source.spec
        return {"name": spec.name, "arch": spec.arch, "kv_format": self.kv_format, "context_tokens": self.context,
                "page_tokens": PAGE_TOKENS, "page_bytes": 0, "state_bytes": 0,
                "prefill_tokens_per_s": 0.0}


def preflight(cfg: Config) -> LoadPlan:
    """Every check that needs no weights, then the model's metadata. Raises StartupError: exit 2 naming the key
    (api key file, formats, context, pool size), exit 1 when nothing loadable is at model.path."""
    api_key = read_api_key(cfg.server.api_key_file)
    check_formats(cfg)
    where = cfg.model.path or "the built-in model"
    try:
        source = open_model(cfg.model.path)
    except (OSError, ValueError, KeyError) as e:
        raise StartupError(f"model.path {where}: cannot load: {e}") from None
    kv_format, kv_why = choose_kv_format(cfg, source.spec.head_dim)      # the default needs the head_dim
    fmt = get_kv_format(kv_format, cfg.kv.exact_window, cfg.kv.exact_sinks)
    context = context_tokens(cfg, source.spec.context_tokens)
    check_exact_window(cfg, kv_format, context)
    mem = mem_available_bytes()
    pages = plan_pool_pages(cfg, fmt.bytes_per_token(source.spec), context, mem)
    check_state_memory(cfg, total_bytes(source.spec.state_buffers() + fmt.seq_state_buffers(source.spec)),
                       pages * fmt.page_bytes(source.spec, PAGE_TOKENS), mem)
    check_arena(cfg, mem)
    check_disk_dir(cfg)
    return LoadPlan(cfg, api_key, kv_format, source, context, pages, kv_why)


class ModelStack:
    """The model of `plan` loaded with its pools, scheduler, engine and edge. Attributes: loaded
    (ignisd.model.loader.LoadedModel), tokenizer, template, kv, states, scheduler, engine, edge, model_info.

    metrics: ignisd.metrics.Metrics or None. progress: the loader's progress callable (ignisd.progress).
    Raises StartupError (exit 1) when the weights cannot be read, (exit 2, naming vram.kv_pool_bytes) when the KV
    pool cannot be allocated.
    """

    def __init__(self, plan: LoadPlan, metrics=None, progress=None):
        cfg, src = plan.cfg, plan.source
        self.kv_format, self.context = plan.kv_format, plan.context
        fmt = plan.kv_format_obj()
        where = cfg.model.path or "the built-in model"
        t0 = time.monotonic()
        torch.set_num_threads(cfg.effective_threads())
        try:
            self.loaded = load_model(src, progress=progress, weight_format=cfg.model.weight_format)
        except Exception as e:  # any failure reading the weights (safetensors, gguf, shapes) is a load failure
            raise StartupError(f"model.path {where}: cannot load: {type(e).__name__}: {e}") from None
        spec = self.loaded.spec
        if self.loaded.kind == "gguf":       # the loader's parse of the file: read the vocabulary from it once
            self.tokenizer = Tokenizer.from_gguf(self.loaded.source, reader=self.loaded.gguf_reader)
            self.loaded.gguf_reader = None   # let its memory map go
            src.gguf_reader = None
        else:
            self.tokenizer = Tokenizer.from_dir(self.loaded.source)
        tk = self.tokenizer
        self.template = ChatTemplate(tk.chat_template, tk.bos_token, tk.eos_token) if tk.chat_template else None
        pages = plan.pages
        stable = rope_stable_dims(spec)
        try:
            self.kv = KVStore(fmt, spec, pages, page_tokens=PAGE_TOKENS, center_dims=stable,
                              page_center_dims=1 - stable)
        except (RuntimeError, MemoryError) as e:   # the allocator's refusal (preflight checked MemAvailable)
            raise StartupError(f"vram.kv_pool_bytes: the KV pool of {pages} pages could not be allocated "
                               f"({type(e).__name__}: {str(e).splitlines()[0][:200]}); lower it", exit_code=2) from None
        state_buffers = spec.state_buffers() + fmt.seq_state_buffers(spec)
        pool = PagePool(pages, PAGE_TOKENS)
        self.states, slots, state_bytes = None, None, 0
        lanes, dev_n, host_n = state_slot_counts(cfg)
        if not state_buffers:   # nothing to keep beside the pages: no retained slots either
            dev_n = host_n = 0
        if state_buffers:   # the model's (GDN recurrent + conv) and the format's per-sequence state: a slot per lane
            self.states = StateStore(state_buffers, lanes)
            slots = StateSlots(lanes)
            state_bytes = self.states.slot_bytes
        retained, retained_states, retained_bytes = None, {}, 0
        rc = cfg.reuse
        if rc.prompt:   # retained slots reserved at load (DESIGN §4.4); on this CPU both pools are host memory
            if state_buffers:
                retained_states = {"device": StateStore(state_buffers, dev_n),
                                   "host": StateStore(state_buffers, host_n)}
                retained_bytes = sum(st.nbytes for st in retained_states.values())
            retained = RetainedStore(Stamp(spec.structural_hash(), fmt.stamp), page_tokens=PAGE_TOKENS,
                                     device_slots=StateSlots(dev_n), host_slots=StateSlots(host_n),
                                     needs_slot=bool(state_buffers), interactive_ttl=rc.retained_interactive_ttl,
                                     kv_format=fmt)
        runner = Runner(self.loaded.model, self.kv, self.states, retained_states)
        prefill_rate = measure_prefill(runner, self.kv, self.states)
        try:
            self.tier_setup = build_tiers(cfg, self.kv.page_bytes, fmt.bytes_per_token(spec),
                                          transfer.image_layout(self.states) if self.states is not None else (),
                                          prefill_rate)
        except OSError as e:
            raise StartupError(f"kv.disk_dir {cfg.kv.disk_dir!r}: {e}", exit_code=2) from None
        runner.arena = self.tier_setup.arena
        cache = CacheManager(pool, self.kv.page_bytes, slots=slots, state_bytes=state_bytes, retained=retained,
                             tiers=self.tier_setup.tiers, kv_format=fmt)
        disk_found = index_disk(self.tier_setup, retained)
        if metrics is not None and disk_found.get("corrupt"):      # deleted at the scan: disk faults too
            metrics.tier_disk_errors.inc(disk_found["corrupt"])
        self.scheduler = Scheduler(cache, lanes=lanes, context_tokens=self.context,
                                   prefill_chunk=cfg.server.prefill_chunk,
                                   round_prefill_tokens=cfg.server.round_prefill_tokens,
                                   max_queue=cfg.server.max_queue, metrics=metrics,
                                   evict_window_pages=cfg.reuse.evict_window_pages)
        self.metrics = metrics
        self.engine = Engine(self.scheduler, runner, metrics, disk=self.tier_setup.disk)
        if metrics is not None:
            metrics.set_pool(pages, 0, self.kv.page_bytes)
        self.model_info = {"name": spec.name, "arch": spec.arch, "kv_format": self.kv_format,
                           "context_tokens": self.context, "page_tokens": PAGE_TOKENS,
                           "page_bytes": self.kv.page_bytes, "state_bytes": state_bytes,
                           "prefill_tokens_per_s": round(prefill_rate, 1)}   # measured at load (one page)
        self.edge = Edge(self.engine, tk, self.template, model_info=self.model_info, context_tokens=self.context,
                         default_max_tokens=cfg.server.default_max_tokens,
                         developer_policy=cfg.server.developer_message_policy, metrics=metrics,
                         output_family=OUTPUT_FAMILIES.get(spec.arch, "none"),
                         canonicalize_tools=cfg.server.canonicalize_tools,
                         pool_tokens=cache.pool.total * cache.page_tokens)
        log.info("vram_plan", model=spec.name, model_bytes=self.loaded.weight_bytes,
                 weight_format=cfg.model.weight_format,
                 **({"weight_kernel": weight_kernel()} if self.loaded.kind == "gguf" and
                    cfg.model.weight_format == "native" else {}),
                 norm_kernel=norm_kernel(), decode_step=self.loaded.model.decode_step(self.kv_format),
                 kv_format=self.kv_format,
                 kv_format_why=plan.kv_why, kv_decode_kernel=decode_kernel(fmt.tag, self.kv.device),
                 **({"kv_encode_kernel": encode_kernel(self.kv.device),
                     "kv_window_kernel": window_kernel(self.kv.device)} if fmt.tag == "hq-e8-2b" else {}),
                 kv_stamp=fmt.stamp, page_bytes=self.kv.page_bytes, kv_pool_pages=pages,
                 kv_pool_tokens=pages * PAGE_TOKENS,
                 kv_pool_bytes=self.kv.nbytes, state_bytes=state_bytes,
                 live_state_bytes=self.states.nbytes if self.states is not None else 0,
                 retained_slot_bytes=retained_bytes, reuse_prompt=rc.prompt, **self.tier_setup.info,
                 kv_disk_found=disk_found.get("usable", 0), context_tokens=self.context, lanes=lanes,
                 load_ms=f"{(time.monotonic() - t0) * 1e3:.0f}")

    async def warmup(self) -> None:
        """Run one request of WARMUP_TOKENS prompt tokens and 2 generated through the running engine (a prefill
        round and a decode round: first-use costs such as kernel compilation are paid before READY=1). It is not
        counted in the metrics and leaves nothing retained. Raises StartupError when the round fails."""
        engine, sched = self.engine, self.scheduler
        engine.metrics = sched.metrics = None
        try:
            ids = list(range(1, WARMUP_TOKENS + 1))
            q = engine.submit(Request("ignis-warmup", ids, SamplingParams(max_tokens=2, temperature=0.0),
                                      cache_prompt=False))
            t0 = time.monotonic()
            while True:
                ev = await q.get()
                if isinstance(ev, ErrorEvent):
                    raise StartupError(f"warm-up round failed: {ev.code}: {ev.message}")
                if isinstance(ev, DoneEvent):
                    break
            log.info("warmup", tokens=WARMUP_TOKENS + ev.generated_tokens,
                     ms=f"{(time.monotonic() - t0) * 1e3:.0f}")
        finally:
            engine.metrics = sched.metrics = self.metrics
            engine.update_gauges()       # the gauges in step again; nothing was retained (cache_prompt false),
            #                             and what KV-disk holds from before a restart must stay

    def close(self) -> None:
        """Drop the model, its pools and the engine's worker, and give the freed memory back to the system."""
        disk = getattr(self, "tier_setup", None) and self.tier_setup.disk
        if disk is not None:
            disk.close()                  # its directory lock: the next load opens the store again
        for name in ("edge", "engine", "scheduler", "kv", "states", "loaded", "template", "tier_setup"):
            setattr(self, name, None)
        gc.collect()
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass
