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
from ignisd.cache.retained import RetainedStore, Stamp
from ignisd.cache.state_slots import StateSlots
from ignisd.cache.state_store import StateStore
from ignisd.config import Config
from ignisd.edge import Edge
from ignisd.engine import Engine
from ignisd.fronts.ndjson import NdjsonFront
from ignisd.log import get_logger
from ignisd.metrics import Metrics
from ignisd.model.loader import load_model
from ignisd.runner import Runner
from ignisd.scheduler import Scheduler
from ignisd.server import Server
from ignisd.text.chat_template import ChatTemplate
from ignisd.text.tokenizer import Tokenizer
from ignisd.unix_socket import SocketPathError, prepare_socket, socket_gid
from ignisd.vocab import PAGE_TOKENS

log = get_logger("model")
# how each architecture's chat output is split into reasoning / tool calls (ignisd.text.output_parser)
OUTPUT_FAMILIES = {"qwen3_5": "qwen3_5", "qwen3_next": "qwen3"}


class StartupError(Exception):
    """The daemon cannot start; the message says why and what to change.

    exit_code: 2 when a configuration value is refused (as for ConfigError), 1 for anything else.
    """

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


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


def _mem_available_bytes() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


def choose_kv_format(cfg: Config, spec) -> str:
    """model.kv_format, or the default of DESIGN §6 (fp32 on the CPU). Raises StartupError for hq-e8-2b (not yet)."""
    fmt = cfg.model.kv_format or "fp32"
    if fmt == "hq-e8-2b":
        raise StartupError("model.kv_format = 'hq-e8-2b' is not available in this build; allowed: fp32, bf16",
                           exit_code=2)
    get_kv_format(fmt)
    return fmt


def plan_pool_pages(cfg: Config, spec, fmt: str, context: int) -> int:
    """KV pool pages from vram.kv_pool_bytes (bytes, or tokens with `tok`), else lanes × context tokens capped at
    half of MemAvailable. Raises StartupError when the budget holds less than one page."""
    token_bytes = get_kv_format(fmt).bytes_per_token(spec)
    page_bytes = token_bytes * PAGE_TOKENS
    size = cfg.vram.kv_pool_bytes
    if size is None:
        want = cfg.server.lanes * context * token_bytes
        budget = min(want, _mem_available_bytes() // 2)
        pages = budget // page_bytes
    elif size.tokens is not None:
        pages = -(-size.tokens // PAGE_TOKENS)
    else:
        pages = size.bytes // page_bytes
    if pages < 1:
        raise StartupError(f"vram.kv_pool_bytes holds no whole page (a page is {page_bytes} bytes = "
                           f"{PAGE_TOKENS} tokens); raise it")
    return int(pages)


class Daemon:
    """The whole process: model, pool, engine, server. Build with `Daemon(cfg)`, run with `await daemon.run()`."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        try:  # refuse before the slow model load
            prepare_socket(cfg.server.socket)
            self.socket_gid = socket_gid(cfg.server.socket_group)
        except SocketPathError as e:
            raise StartupError(str(e), exit_code=e.exit_code) from None
        if cfg.model.kv_format == "hq-e8-2b":
            choose_kv_format(cfg, None)  # refused before the slow model load
        t0 = time.monotonic()
        torch.set_num_threads(cfg.effective_threads())
        try:
            self.loaded = load_model(cfg.model.path)
        except (OSError, ValueError, KeyError) as e:
            where = cfg.model.path or "the built-in model"
            raise StartupError(f"model.path {where}: cannot load: {e}") from None
        spec = self.loaded.spec
        src = self.loaded.source
        if self.loaded.kind == "gguf":       # the loader's parse of the file: read the vocabulary from it once
            self.tokenizer = Tokenizer.from_gguf(src, reader=self.loaded.gguf_reader)
            self.loaded.gguf_reader = None   # let its memory map go
        else:
            self.tokenizer = Tokenizer.from_dir(src)
        tk = self.tokenizer
        self.template = ChatTemplate(tk.chat_template, tk.bos_token, tk.eos_token) if tk.chat_template else None
        self.kv_format = choose_kv_format(cfg, spec)
        context = spec.context_tokens
        if cfg.model.context_tokens is not None:
            if cfg.model.context_tokens > spec.context_tokens:
                raise StartupError(f"model.context_tokens = {cfg.model.context_tokens} exceeds the model's context "
                                   f"of {spec.context_tokens} tokens")
            context = cfg.model.context_tokens
        self.context = context
        pages = plan_pool_pages(cfg, spec, self.kv_format, context)
        fmt = get_kv_format(self.kv_format)
        self.kv = KVStore(fmt, spec, pages, page_tokens=PAGE_TOKENS)
        state_buffers = spec.state_buffers() + fmt.seq_state_buffers(spec)
        self.metrics = Metrics()
        pool = PagePool(pages, PAGE_TOKENS)
        self.states, slots, state_bytes = None, None, 0
        if spec.is_hybrid:  # one live state slot per lane: recurrent + conv state of every GDN layer
            self.states = StateStore(state_buffers, cfg.server.lanes)
            slots = StateSlots(cfg.server.lanes)
            state_bytes = self.states.slot_bytes
        retained, retained_states, retained_bytes = None, {}, 0
        rc = cfg.reuse
        if rc.prompt:   # retained slots reserved at load (DESIGN §4.4); on this CPU both pools are host memory
            dev_n = rc.device_slots if spec.is_hybrid else 0
            host_n = rc.host_slots_per_lane * cfg.server.lanes if spec.is_hybrid else 0
            if spec.is_hybrid:
                retained_states = {"device": StateStore(state_buffers, dev_n),
                                   "host": StateStore(state_buffers, host_n)}
                retained_bytes = sum(st.nbytes for st in retained_states.values())
            retained = RetainedStore(Stamp(spec.structural_hash(), self.kv_format), page_tokens=PAGE_TOKENS,
                                     device_slots=StateSlots(dev_n), host_slots=StateSlots(host_n),
                                     needs_slot=spec.is_hybrid, interactive_ttl=rc.retained_interactive_ttl)
        cache = CacheManager(pool, self.kv.page_bytes, slots=slots, state_bytes=state_bytes, retained=retained)
        self.scheduler = Scheduler(cache, lanes=cfg.server.lanes, context_tokens=context,
                                   prefill_chunk=cfg.server.prefill_chunk,
                                   round_prefill_tokens=cfg.server.round_prefill_tokens,
                                   max_queue=cfg.server.max_queue, metrics=self.metrics)
        self.engine = Engine(self.scheduler, Runner(self.loaded.model, self.kv, self.states, retained_states),
                             self.metrics)
        self.metrics.kv_pool_pages.set(pages)
        self.metrics.kv_page_bytes.set(self.kv.page_bytes)
        model_info = {"name": spec.name, "arch": spec.arch, "kv_format": self.kv_format,
                      "context_tokens": context, "page_tokens": PAGE_TOKENS, "page_bytes": self.kv.page_bytes,
                      "state_bytes": state_bytes}
        api_key = None
        if cfg.server.api_key_file:
            try:
                api_key = Path(cfg.server.api_key_file).read_text().strip()
            except OSError as e:
                raise StartupError(f"server.api_key_file {cfg.server.api_key_file!r}: {e.strerror}") from None
            if not api_key:
                raise StartupError(f"server.api_key_file {cfg.server.api_key_file!r} is empty")
        self.edge = Edge(self.engine, tk, self.template, model_info=model_info, context_tokens=context,
                         default_max_tokens=cfg.server.default_max_tokens,
                         developer_policy=cfg.server.developer_message_policy, metrics=self.metrics,
                         output_family=OUTPUT_FAMILIES.get(spec.arch, "none"))
        self.server = Server(NdjsonFront(self.edge), max_line_bytes=cfg.server.max_line_bytes,
                             max_inflight=cfg.server.max_inflight_per_connection, api_key=api_key,
                             metrics=self.metrics)
        log.info("vram_plan", model=spec.name, model_bytes=self.loaded.weight_bytes, kv_format=self.kv_format,
                 page_bytes=self.kv.page_bytes, kv_pool_pages=pages, kv_pool_tokens=pages * PAGE_TOKENS,
                 kv_pool_bytes=self.kv.nbytes, state_bytes=state_bytes,
                 live_state_bytes=self.states.nbytes if self.states is not None else 0,
                 retained_slot_bytes=retained_bytes, reuse_prompt=rc.prompt,
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
        try:
            prepare_socket(path)
        except SocketPathError as e:
            raise StartupError(str(e), exit_code=e.exit_code) from None
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
        Path(path).unlink(missing_ok=True)
        srv_log.info("stopped")
