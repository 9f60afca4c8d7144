"""RoundPlan → tensors → model → sampler → per-item results (DESIGN §2).

Runs in the engine's single worker thread. The plan is a value (``ignisd/plan.py``): sequence ids, positions, token
ids, page ids and slots, never a scheduler object. The runner owns the per-request sampling generators (so a
request's seeded draws never depend on other requests); its transfer step runs the plan's tier moves (none until
KV-RAM and KV-disk exist) and restores before the passes, and captures after the pass holding their item.
"""
from __future__ import annotations

import torch

from ignisd.model.batch import ForwardBatch, SeqChunk
from ignisd.plan import ItemResult, PlanItem, RoundPlan
from ignisd.sampling import make_generator, sample_row, token_logprobs


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

    def __init__(self, model, kv, states=None, retained_states: dict | None = None):
        self.model = model
        self.kv = kv
        self.threads = torch.get_num_threads()
        self.states = states
        self.retained_states = retained_states or {}
        self.page_tokens = kv.page_tokens
        self._gens: dict[str, torch.Generator] = {}

    def init_thread(self) -> None:
        """Run once in the forward worker thread: give it the process's torch thread count (server.threads).

        OpenMP keeps the thread count per OS thread, so a worker started with OMP_NUM_THREADS=1 in the environment
        would otherwise run every forward on one core whatever torch.set_num_threads() said in the main thread."""
        torch.set_num_threads(self.threads)

    def forget(self, rid: str) -> None:
        """Drop the sampling generator of a finished request."""
        self._gens.pop(rid, None)

    @torch.inference_mode()
    def execute(self, plan: RoundPlan) -> list[ItemResult]:
        """Run every item of `plan`; returns one ItemResult per item, in plan order."""
        results: list[ItemResult | None] = [None] * len(plan.items)
        if plan.moves:
            raise NotImplementedError("tier moves: only the device tier exists in this build")
        for rs in plan.restores:          # resume: partial last page (copy-on-write) and the image, before any pass
            if rs.src_page is not None:
                self.kv.copy_pages([rs.src_page], [rs.dst_page])
            if rs.slot is not None and self.states is not None:
                self.states.restore(rs.dst_slot, self.retained_states[rs.slot_tier].image(rs.slot))
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
            for it in items:               # captures at the end of this pass's chunks
                cap = it.capture
                if cap is None:
                    continue
                if cap.copy_page is not None:
                    self.kv.copy_pages([cap.src_page], [cap.copy_page])
                if cap.slot is not None and self.states is not None:
                    self.retained_states[cap.slot_tier].restore(cap.slot, self.states.image(cap.src_slot))
        return results  # type: ignore[return-value]

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
            tok = sample_row(last, sp, gen)
            res.token_id = tok
            if sp.logprobs:
                lp, tops, _ = token_logprobs(last.view(1, -1), torch.tensor([tok]), sp.top_logprobs)
                res.logprob, res.top = lp[0], tops[0]
        return res
