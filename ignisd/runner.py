"""RoundPlan → tensors → model → sampler → per-item results (DESIGN §2).

Runs in the engine's single worker thread. The plan is a value (``ignisd/plan.py``): sequence ids, positions, token
ids, page ids and slots, never a scheduler object. The runner owns the per-request sampling generators (so a
request's seeded draws never depend on other requests); its transfer step runs the plan's tier moves (device pages
and images into the KV-RAM arena, or out as bytes for a KV-disk file) and restores before the passes, and captures
after the pass holding their item.
"""
from __future__ import annotations

import time
import warnings

import torch

from ignisd.cache import transfer
from ignisd.cache.disk_format import PAYLOAD_ALIGN
from ignisd.model.batch import ForwardBatch, SeqChunk
from ignisd.plan import MOVE_TO_RAM, MOVE_TO_STAGE, ItemResult, PlanItem, RestoreOp, RoundPlan, RoundResult, TierMove
from ignisd.sampling import adjust_logits, make_generator, sample_row, token_logprobs
from ignisd.vocab import DEVICE, RAM


def _page_aligned(nbytes: int) -> torch.Tensor:
    """An uninitialised uint8 host tensor of `nbytes` whose data starts on a 4096-byte boundary: the bytes of a
    "to_bytes" move go to a KV-disk file, and O_DIRECT writes aligned whole blocks straight from them instead of
    through a bounce buffer (cache/disk_io.py)."""
    buf = torch.empty(nbytes + PAYLOAD_ALIGN, dtype=torch.uint8)
    off = -buf.data_ptr() % PAYLOAD_ALIGN
    return buf[off:off + nbytes]


def _passes(items: list[PlanItem]) -> list[list[int]]:
    """Split item indices into forward passes holding at most one chunk of any sequence, in order, so a later
    chunk of a sequence runs after the pass that wrote the K/V it attends to."""
    passes: list[list[int]] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(items):
        k = seen.get(item.seq_id, -1) + 1
        seen[item.seq_id] = k
        while len(passes) <= k:
            passes.append([])
        passes[k].append(i)
    return passes


class Runner:
    """Executes round plans on one model and one KV pool.

    model: the decoder (forward(batch, kv, states)). kv: the KV store the pool's page ids index. states: the state
    store the live state slots index, or None when the model and the KV format keep no per-sequence state.
    retained_states: {"device": ..., "host": ...} state stores holding the images of retained states (the retained
    slots index them).
    """

    def __init__(self, model, kv, states=None, retained_states: dict | None = None, arena=None):
        self.model = model
        self.kv = kv
        self.threads = torch.get_num_threads()
        self.states = states
        self.retained_states = retained_states or {}
        self.arena = arena
        self.page_tokens = kv.page_tokens
        self._gens: dict[str, torch.Generator] = {}
        self._staging: dict[str, torch.Tensor] = {}    # live sequence -> its bytes for KV-disk, filled a window a round

    def init_thread(self) -> None:
        """Run once in the forward worker thread: give it the process's torch thread count (server.threads).

        OpenMP keeps the thread count per OS thread, so a worker started with OMP_NUM_THREADS=1 in the environment
        would otherwise run every forward on one core whatever torch.set_num_threads() said in the main thread."""
        torch.set_num_threads(self.threads)

    def forget(self, rid: str) -> None:
        """Drop the sampling generator of a finished request (and the staging buffer of one that ended while it was
        being moved to KV-disk)."""
        self._gens.pop(rid, None)
        self._staging.pop(rid, None)

    def _slot_store(self, slot_tier: str):
        return self.states if slot_tier == "live" else self.retained_states[slot_tier]

    def _move(self, mv: TierMove, snapshots: dict[str, bytes]) -> None:
        """Copy one state's bytes out of its tier (pages layout, then its image): into the arena, into bytes, or into
        a window of a staging buffer (whose last window hands over the whole buffer as bytes)."""
        stage = mv.op == MOVE_TO_STAGE
        pbytes = transfer.pages_nbytes(self.kv, len(mv.pages)) if mv.pages or stage else mv.nbytes
        ibytes = self._slot_store(mv.image_slot[0]).slot_bytes if mv.image_slot is not None else 0
        if mv.op == MOVE_TO_RAM:
            dst = self.arena.view(mv.dst_offset, pbytes + ibytes)
        elif stage:
            buf = self._staging.get(mv.state_id)
            if buf is None:
                buf = self._staging[mv.state_id] = _page_aligned(mv.nbytes)
            dst = buf[mv.dst_offset:mv.dst_offset + pbytes + ibytes]
        else:
            dst = _page_aligned(pbytes + ibytes)
        if mv.pages:
            transfer.read_pages(self.kv, list(mv.pages), dst)
        elif mv.nbytes and not stage:
            dst[:pbytes].copy_(self.arena.view(mv.src_offset, pbytes))
        if mv.image_slot is not None:
            transfer.read_image(self._slot_store(mv.image_slot[0]), mv.image_slot[1], dst[pbytes:])
        if stage:
            if mv.dst_offset + pbytes + ibytes == mv.nbytes:     # its last window: the bytes are complete
                snapshots[mv.state_id] = memoryview(self._staging.pop(mv.state_id).numpy())
        elif mv.op != MOVE_TO_RAM:
            snapshots[mv.state_id] = memoryview(dst.numpy())    # no copy: the view keeps the buffer alive

    def _restore(self, rs: RestoreOp) -> None:
        """Resume a sequence before any pass: its pages (shared in place with a device state, or written from the
        arena or a KV-disk payload) and its image into its live slot."""
        if rs.tier == DEVICE:
            if rs.src_page is not None:
                self.kv.copy_pages([rs.src_page], [rs.dst_page])
            src = None
        elif rs.tier == RAM:
            n = transfer.pages_nbytes(self.kv, len(rs.dst_pages))
            extra = self.states.slot_bytes if rs.image_after_pages and self.states is not None else 0
            src = self.arena.view(rs.src_offset, n + extra)
            transfer.write_pages(self.kv, list(rs.dst_pages), src)
        else:
            with warnings.catch_warnings():        # the payload is only read
                warnings.simplefilter("ignore", UserWarning)
                src = torch.frombuffer(rs.payload, dtype=torch.uint8)
            transfer.write_pages(self.kv, list(rs.dst_pages), src)
        if self.states is None or rs.dst_slot is None:
            return
        if rs.slot is not None:
            self.states.restore(rs.dst_slot, self.retained_states[rs.slot_tier].image(rs.slot))
        elif rs.image_after_pages:
            ib = self.states.slot_bytes
            transfer.write_image(self.states, rs.dst_slot, src[src.numel() - ib:])

    @torch.inference_mode()
    def execute(self, plan: RoundPlan) -> RoundResult:
        """Run `plan`: its tier moves, its restores, then every item; returns one ItemResult per item in plan order
        and the bytes of its "to_bytes" moves."""
        results: list[ItemResult | None] = [None] * len(plan.items)
        snapshots: dict[str, bytes] = {}
        for mv in plan.moves:             # the transfer step: before anything writes the pages and slots it frees
            self._move(mv, snapshots)
        restored: dict[str, tuple[int, float]] = {}
        for rs in plan.restores:          # resume: pages and image, before any pass
            t0 = time.perf_counter()
            self._restore(rs)
            n, sec = restored.get(rs.tier, (0, 0.0))
            moved = transfer.pages_nbytes(self.kv, len(rs.dst_pages)) if rs.tier != DEVICE else self.kv.page_bytes
            restored[rs.tier] = (n + moved, sec + time.perf_counter() - t0)
        for idx in _passes(plan.items):
            items = [plan.items[i] for i in idx]
            if self.states is None:
                chunks = [SeqChunk(token_ids=list(it.token_ids), start=it.start, page_ids=list(it.page_ids),
                                   logits=it.logits) for it in items]
                logits = self.model.forward(ForwardBatch.build(chunks, self.page_tokens), self.kv)
            else:
                for it in items:
                    if it.start == 0:      # a sequence's first chunk starts from zero recurrent and conv state
                        self.states.zero(it.slot)
                chunks = [SeqChunk(token_ids=list(it.token_ids), start=it.start, page_ids=list(it.page_ids),
                                   logits=it.logits, state_slot=it.slot) for it in items]
                logits = self.model.forward(ForwardBatch.build(chunks, self.page_tokens), self.kv, self.states)
            row = 0
            for i, it in zip(idx, items):
                n = {"last": 1, "all": len(it.token_ids), "none": 0}[it.logits]
                results[i] = self._item_result(it, logits[row:row + n])
                row += n
            for cap in (c for it in items for c in it.captures):   # captures at the end of this pass's chunks
                if cap.copy_page is not None:
                    self.kv.copy_pages([cap.src_page], [cap.copy_page])
                if cap.slot is not None and self.states is not None:
                    self.retained_states[cap.slot_tier].restore(cap.slot, self.states.image(cap.src_slot))
        return RoundResult(results, snapshots, restored)  # type: ignore[arg-type]

    def _item_result(self, it: PlanItem, rows: torch.Tensor) -> ItemResult:
        res = ItemResult()
        if it.logits == "all" and it.prompt_logprobs is not None and it.targets:
            targets = list(it.targets)
            lp, tops, ranks = token_logprobs(rows[:len(targets)], torch.tensor(targets), it.prompt_logprobs)
            res.prompt_logprobs = [
                {"token": t, "logprob": lpv, "rank": r, "top": [[a, b] for a, b in top]}
                for t, lpv, r, top in zip(targets, lp, ranks, tops)]
        if it.sample:
            last = rows[-1]
            sp = it.sampling
            gen = self._gens.get(it.seq_id)
            if gen is None:
                gen = self._gens[it.seq_id] = make_generator(sp.seed)
            tok = it.force if it.force is not None else sample_row(adjust_logits(last, sp, it.generated), sp, gen)
            res.token_id = tok
            if sp.logprobs:
                lp, tops, _ = token_logprobs(last.view(1, -1), torch.tensor([tok]), sp.top_logprobs)
                res.logprob, res.top = lp[0], tops[0]
        return res
