"""ForwardBatch: the tensors of one model forward that mixes prefill chunks and decode tokens of several sequences.

Tokens of all sequences are concatenated in SeqChunk order into T rows; the linear layers run on all T rows at
once, attention runs per sequence over that sequence's KV slots (read_slots).
Slot of position p of a sequence = page_ids[p // page_tokens] * page_tokens + p % page_tokens.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from ignis_kernels.attention import PagedKV
    from ignisd.model.attention import AttentionPlan
    from ignisd.model.gdn import GDNPlan, SlotStates

LOGITS_MODES = ("last", "all", "none")


@dataclass
class SeqChunk:
    """One sequence's part of a forward call.

    token_ids: the new tokens (a prefill chunk, or 1 token for decode).
    start: tokens of this sequence already in the KV cache (= position of token_ids[0]).
    page_ids: KV pool pages of the sequence covering positions [0, start + len(token_ids)) (more is allowed).
    logits: "last" (logits of the last new token) | "all" (every new token, for prompt_logprobs) | "none".
    state_slot: the sequence's live state slot (a slot of the state store) on a hybrid model, whose GDN layers read
        the recurrent + conv state there and write the state after this chunk back; None on an all-attention model.
        The forward never zeroes a slot: the caller zeroes it before a sequence's first chunk (start == 0).
    """

    token_ids: list[int]
    start: int
    page_ids: list[int]
    logits: str = "last"
    state_slot: int | None = None


@dataclass
class ForwardBatch:
    """Flattened inputs of Decoder.forward.

    input_ids: LongTensor [T] token ids of every chunk, concatenated in chunk order.
    positions: LongTensor [T] absolute position of each token in its sequence.
    slot_mapping: LongTensor [T] KV pool slot (page * page_tokens + offset) each token's K/V is written to.
    seq_lens: per chunk, its number of new tokens (rows of T). context_lens: per chunk, start + seq_len.
    starts: per chunk, its start (= context_len - seq_len).
    read_slots: per chunk, LongTensor [context_len]: the slots of positions 0 .. context_len-1 (attention reads).
    page_tables: per chunk, LongTensor [ceil(context_len / page_tokens)]: its pages in position order.
    logits_index: LongTensor [N] rows of T whose logits forward() returns, in chunk order.
    logits_owner: per chunk (first row in the returned logits, count, index within token_ids of the first
        token with logits): "last" -> (r, 1, n-1), "all" -> (r, n, 0), "none" -> (r, 0, n).
        Logits row for token_ids[j] predict the token at position start + j + 1.
    page_tokens: tokens per KV page.
    state_slots: per chunk, its SeqChunk.state_slot (None entries on an all-attention model).
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    seq_lens: list[int]
    context_lens: list[int]
    starts: list[int]
    read_slots: list[torch.Tensor]
    page_tables: list[torch.Tensor]
    logits_index: torch.Tensor
    logits_owner: list[tuple[int, int, int]]
    page_tokens: int
    state_slots: list[int | None] | None = None

    @property
    def num_tokens(self) -> int:
        """T, the number of new tokens in the batch."""
        return int(self.input_ids.shape[0])

    @classmethod
    def build(cls, chunks: list[SeqChunk], page_tokens: int) -> "ForwardBatch":
        """Flatten `chunks` into one ForwardBatch.

        Raises ValueError on an empty batch or chunk, a negative start, too few page_ids for start+len(token_ids),
        an unknown logits mode, or one state slot given to two chunks.
        """
        if not chunks:
            raise ValueError("ForwardBatch.build: no chunks")
        ids: list[int] = []
        positions, slot_mapping, read_slots, page_tables, logits_rows = [], [], [], [], []
        seq_lens, context_lens, starts, owners = [], [], [], []
        offs = torch.arange(page_tokens, dtype=torch.long)
        row = 0
        n_logits = 0
        for i, c in enumerate(chunks):
            n = len(c.token_ids)
            if n == 0:
                raise ValueError(f"chunk {i}: no tokens")
            if c.start < 0:
                raise ValueError(f"chunk {i}: negative start {c.start}")
            ctx = c.start + n
            need_pages = -(-ctx // page_tokens)
            if len(c.page_ids) < need_pages:
                raise ValueError(f"chunk {i}: {len(c.page_ids)} pages for {ctx} tokens ({need_pages} needed)")
            if c.logits not in LOGITS_MODES:
                raise ValueError(f"chunk {i}: logits must be one of {LOGITS_MODES}, got {c.logits!r}")
            pages = torch.tensor(c.page_ids[:need_pages], dtype=torch.long)
            slots = (pages[:, None] * page_tokens + offs[None, :]).reshape(-1)[:ctx]
            ids.extend(c.token_ids)
            positions.append(torch.arange(c.start, ctx, dtype=torch.long))
            slot_mapping.append(slots[c.start:])
            read_slots.append(slots)
            page_tables.append(pages)
            seq_lens.append(n)
            context_lens.append(ctx)
            starts.append(c.start)
            if c.logits == "last":
                logits_rows.append(torch.tensor([row + n - 1], dtype=torch.long))
                owners.append((n_logits, 1, n - 1))
                n_logits += 1
            elif c.logits == "all":
                logits_rows.append(torch.arange(row, row + n, dtype=torch.long))
                owners.append((n_logits, n, 0))
                n_logits += n
            else:
                owners.append((n_logits, 0, n))
            row += n
        slots = [c.state_slot for c in chunks]
        held = [x for x in slots if x is not None]
        if len(set(held)) != len(held):
            raise ValueError(f"state slots {held}: a slot appears in two chunks of one batch")
        return cls(
            input_ids=torch.tensor(ids, dtype=torch.long),
            positions=torch.cat(positions),
            slot_mapping=torch.cat(slot_mapping),
            seq_lens=seq_lens, context_lens=context_lens, starts=starts, read_slots=read_slots,
            page_tables=page_tables,
            logits_index=torch.cat(logits_rows) if logits_rows else torch.zeros(0, dtype=torch.long),
            logits_owner=owners, page_tokens=page_tokens, state_slots=slots,
        )


def matmul_rows(rows: int, batch_invariant: bool) -> int:
    """Row count to run the matmuls with: with ``batch_invariant`` a batch of fewer than 16 rows is padded to 16.
    MKL's sgemm rounds a row differently by the call's row count: one kernel for 1-3 rows and another from 4 on (an
    AVX2 Xeon), or 1, 2-15 and 16 on (an AVX-512/AMX Xeon, measured at one thread up to 600 rows); from 16 rows both
    give a row the same bits whatever the batch, so a row's result does not depend on its batch-mates."""
    if batch_invariant and rows < 16:
        return 16
    return rows


def embed_rows(batch: ForwardBatch, embed, batch_invariant: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The embedded input rows of `batch` and their positions, padded to matmul_rows: (x fp32 [T', H], positions
    LongTensor [T']). embed: the token table (lm_head.DenseTable / QuantTable: ``rows(ids)``). Padding rows are
    token 0 at position 0; the layers write no K/V or state for them."""
    ids, positions = batch.input_ids, batch.positions
    t = batch.num_tokens
    pad = matmul_rows(t, batch_invariant) - t
    if pad:
        ids = F.pad(ids, (0, pad))
        positions = F.pad(positions, (0, pad))
    return embed.rows(ids), positions


def batch_logits(x: torch.Tensor, batch: ForwardBatch, final_norm, lm_head,
                 batch_invariant: bool) -> torch.Tensor:
    """float32 logits [N, vocab] of the rows batch.logits_index of the last hidden states x [T', H]:
    ``lm_head.logits(final_norm(rows))`` (lm_head: the token table, lm_head.DenseTable / QuantTable, shape
    [vocab, H]), the selected rows padded to matmul_rows. N may be 0."""
    n = batch.logits_index.numel()
    if n == 0:
        return torch.zeros(0, lm_head.shape[0], dtype=torch.float32, device=x.device)
    if n != x.shape[0]:
        rows = batch.logits_index
        pad = matmul_rows(n, batch_invariant) - n
        if pad:
            rows = F.pad(rows, (0, pad))
        x = x.index_select(0, rows)
    return lm_head.logits(final_norm(x))[:n]


@dataclass
class ForwardContext:
    """What every mixer of one forward reads besides its hidden states; built once per forward by the decoder.

    batch: the ForwardBatch. cos, sin: fp32 [T', 1, rotary_dim] rotary tables of the rows' positions (sin signed
    for rotate-half, layers.Rotary; T' >= T rows,
    padding included). attn: the AttentionPlan. gdn: the GDNPlan, None on a model without GDN layers.
    kv: the KV store (PagedKV protocol). states: the per-slot state store (GDN layers read its "recurrent" and
    "conv" buffers; attention layers its "kv_window" / "kv_sinks" under a format with an exact window), None when
    neither the model nor the format keeps per-sequence state.
    """

    batch: ForwardBatch
    cos: torch.Tensor
    sin: torch.Tensor
    attn: "AttentionPlan"
    gdn: "GDNPlan | None"
    kv: "PagedKV"
    states: "SlotStates | None"
