"""Composition root: load the model, size the KV pool, start engine + server, handle signals, sd_notify (DESIGN §2-§3).
"""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from pathlib import Path

import torch

from ignisd.cache.kv_format import get_kv_format
from ignisd.cache.kv_store import KVStore
from ignisd.cache.manager import CacheManager
from ignisd.cache.page_pool import PagePool
from ignisd.cache.retained import RetainedStore
from ignisd.cache.retained_state import Stamp
from ignisd.cache.state_slots import StateSlots
from ignisd.cache.state_store import StateStore
from ignisd.config import Config
from ignisd.edge import Edge
from ignisd.cache import transfer
from ignisd.engine import Engine
from ignisd.fronts.ndjson import NdjsonFront
from ignisd.log import get_logger
from ignisd.metrics import Metrics
from ignisd.model.loader import load_model, open_model
from ignisd.preflight import (StartupError, check_arena, check_formats, choose_kv_format, context_tokens,
                              mem_available_bytes, plan_pool_pages, read_api_key)
from ignisd.runner import Runner
from ignisd.scheduler import Scheduler
from ignisd.server import Server
from ignisd.text.chat_template import ChatTemplate
from ignisd.tier_setup import build_tiers, index_disk, measure_prefill
from ignisd.text.tokenizer import Tokenizer
from ignisd.unix_socket import prepare_socket, socket_gid
from ignisd.vocab import PAGE_TOKENS

log = get_logger("model")
# how each architecture's chat output is split into reasoning / tool calls (ignisd.text.output_parser)
OUTPUT_FAMILIES = {"qwen3_5": "qwen3_5", "qwen3_next": "qwen3"}


def sd_notify(state: str) -> None:
    """Send `state` (e.g. "READY=1") to systemd's notify socket when $NOTIFY_SOCKET is set (sd_notify(3))."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        try:
            s.connect(addr)
            s.sendall(state.encode())
        except OSError:
            pass


class Daemon:
    """The whole process: model, pool, engine, server. Build with `Daemon(cfg)`, run with `await daemon.run()`."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        # everything that can be refused without the weights is refused before they load (exit 2, key named)
        prepare_socket(cfg.server.socket)
        self.socket_gid = socket_gid(cfg.server.socket_group)
        api_key = read_api_key(cfg.server.api_key_file)
        check_formats(cfg)
        where = cfg.model.path or "the built-in model"
        try:
            source = open_model(cfg.model.path)
        except (OSError, ValueError, KeyError) as e:
            raise StartupError(f"model.path {where}: cannot load: {e}") from None
        spec = source.spec
        self.kv_format, kv_why = choose_kv_format(cfg, spec.head_dim)
        fmt = get_kv_format(self.kv_format, cfg.kv.exact_window, cfg.kv.exact_sinks)
        context = context_tokens(cfg, spec.context_tokens)
        mem = mem_available_bytes()
        pages = plan_pool_pages(cfg, fmt.bytes_per_token(spec), context, mem)
        check_arena(cfg, mem)
        t0 = time.monotonic()
        torch.set_num_threads(cfg.effective_threads())
        try:
            self.loaded = load_model(source)
        except Exception as e:  # any failure reading the weights (safetensors, gguf, shapes) is a load failure
            raise StartupError(f"model.path {where}: cannot load: {type(e).__name__}: {e}") from None
        spec = self.loaded.spec
        src = self.loaded.source
        if self.loaded.kind == "gguf":       # the loader's parse of the file: read the vocabulary from it once
            self.tokenizer = Tokenizer.from_gguf(src, reader=self.loaded.gguf_reader)
            self.loaded.gguf_reader = None   # let its memory map go
        else:
            self.tokenizer = Tokenizer.from_dir(src)
        tk = self.tokenizer
        self.template = ChatTemplate(tk.chat_template, tk.bos_token, tk.eos_token) if tk.chat_template else None
        self.context = context
        self.kv = KVStore(fmt, spec, pages, page_tokens=PAGE_TOKENS)
        state_buffers = spec.state_buffers() + fmt.seq_state_buffers(spec)
        self.metrics = Metrics()
        pool = PagePool(pages, PAGE_TOKENS)
        self.states, slots, state_bytes = None, None, 0
        if state_buffers:   # the model's (GDN recurrent + conv) and the format's per-sequence state: a slot per lane
            self.states = StateStore(state_buffers, cfg.server.lanes)
            slots = StateSlots(cfg.server.lanes)
            state_bytes = self.states.slot_bytes
        retained, retained_states, retained_bytes = None, {}, 0
        rc = cfg.reuse
        if rc.prompt:   # retained slots reserved at load (DESIGN §4.4); on this CPU both pools are host memory
            dev_n = rc.device_slots if state_buffers else 0
            host_n = rc.host_slots_per_lane * cfg.server.lanes if state_buffers else 0
            if state_buffers:
                retained_states = {"device": StateStore(state_buffers, dev_n),
                                   "host": StateStore(state_buffers, host_n)}
                retained_bytes = sum(st.nbytes for st in retained_states.values())
            retained = RetainedStore(Stamp(spec.structural_hash(), fmt.stamp), page_tokens=PAGE_TOKENS,
                                     device_slots=StateSlots(dev_n), host_slots=StateSlots(host_n),
                                     needs_slot=bool(state_buffers), interactive_ttl=rc.retained_interactive_ttl,
                                     kv_format=fmt)
        runner = Runner(self.loaded.model, self.kv, self.states, retained_states)
        try:
            self.tier_setup = build_tiers(cfg, self.kv.page_bytes, fmt.bytes_per_token(spec),
                                          transfer.image_layout(self.states) if self.states is not None else (),
                                          measure_prefill(runner, self.kv, self.states))
        except OSError as e:
            raise StartupError(f"kv.disk_dir {cfg.kv.disk_dir!r}: {e}", exit_code=2) from None
        runner.arena = self.tier_setup.arena
        cache = CacheManager(pool, self.kv.page_bytes, slots=slots, state_bytes=state_bytes, retained=retained,
                             tiers=self.tier_setup.tiers, kv_format=fmt)
        disk_found = index_disk(self.tier_setup, retained)
        self.scheduler = Scheduler(cache, lanes=cfg.server.lanes, context_tokens=context,
                                   prefill_chunk=cfg.server.prefill_chunk,
                                   round_prefill_tokens=cfg.server.round_prefill_tokens,
                                   max_queue=cfg.server.max_queue, metrics=self.metrics,
                                   evict_window_pages=cfg.reuse.evict_window_pages)
        self.engine = Engine(self.scheduler, runner, self.metrics, disk=self.tier_setup.disk)
        self.metrics.set_pool(pages, 0, self.kv.page_bytes)
        model_info = {"name": spec.name, "arch": spec.arch, "kv_format": self.kv_format,
                      "context_tokens": context, "page_tokens": PAGE_TOKENS, "page_bytes": self.kv.page_bytes,
                      "state_bytes": state_bytes}
        self.edge = Edge(self.engine, tk, self.template, model_info=model_info, context_tokens=context,
                         default_max_tokens=cfg.server.default_max_tokens,
                         developer_policy=cfg.server.developer_message_policy, metrics=self.metrics,
                         output_family=OUTPUT_FAMILIES.get(spec.arch, "none"))
        self.server = Server(NdjsonFront(self.edge), max_line_bytes=cfg.server.max_line_bytes,
                             max_inflight=cfg.server.max_inflight_per_connection, api_key=api_key,
                             metrics=self.metrics)
        log.info("vram_plan", model=spec.name, model_bytes=self.loaded.weight_bytes, kv_format=self.kv_format,
                 kv_format_why=kv_why, kv_stamp=fmt.stamp, page_bytes=self.kv.page_bytes, kv_pool_pages=pages,
                 kv_pool_tokens=pages * PAGE_TOKENS,
                 kv_pool_bytes=self.kv.nbytes, state_bytes=state_bytes,
                 live_state_bytes=self.states.nbytes if self.states is not None else 0,
                 retained_slot_bytes=retained_bytes, reuse_prompt=rc.prompt, **self.tier_setup.info,
                 kv_disk_found=disk_found.get("usable", 0),
                 context_tokens=context, lanes=cfg.server.lanes,
                 load_ms=f"{(time.monotonic() - t0) * 1e3:.0f}")

    async def run(self) -> None:
        """Serve until SIGTERM/SIGINT; then stop accepting, give running requests server.shutdown_grace_s to
        finish (a second signal ends the wait), cancel what is left (each ends with a `done` reply, finish_reason
        cancelled), and remove the socket."""
        loop = asyncio.get_running_loop()
        stop, hurry = asyncio.Event(), asyncio.Event()

        def on_signal() -> None:
            (hurry if stop.is_set() else stop).set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal)
        path = self.cfg.server.socket
        prepare_socket(path)
        engine_task = asyncio.create_task(self.engine.run())
        await self.server.start(path)
        os.chmod(path, self.cfg.server.socket_mode)
        if self.socket_gid is not None:
            os.chown(path, -1, self.socket_gid)
        get_logger("srv").info("listening", socket=path, pid=os.getpid())
        sd_notify("READY=1")
        await stop.wait()
        sd_notify("STOPPING=1")
        srv_log = get_logger("srv")
        srv_log.info("stopping", running=len(self.scheduler.running), waiting=len(self.scheduler.waiting),
                     grace_s=self.cfg.server.shutdown_grace_s)
        self.server.stop_listening()
        deadline = loop.time() + self.cfg.server.shutdown_grace_s
        while not self.scheduler.idle() and loop.time() < deadline and not hurry.is_set():
            await asyncio.sleep(0.05)
        if not self.scheduler.idle():
            srv_log.warning("shutdown_cancel", requests=self.engine.cancel_all())
            deadline = loop.time() + 5
            while not self.scheduler.idle() and loop.time() < deadline:
                await asyncio.sleep(0.02)
        await self.server.close()
        self.engine.stop()
        await engine_task
        if not hurry.is_set():       # KV-disk on: retained states outlive the process (within the grace left)
            await self.engine.flush_to_disk(max(deadline, loop.time() + 1.0))
        Path(path).unlink(missing_ok=True)
        srv_log.info("stopped")
