"""Passkey retrieval through ignis's own paged forward and KV store (tools/bench_kvformat.py --passkey; issue 10).

A trial: a 5-digit key in a needle sentence placed at a depth of a filler text of n tokens, then a question; the key
counts as retrieved when, teacher-forced, the greedy argmax at every answer position is the answer token (the
space token and the five digit tokens of " 12345"), i.e. exactly when greedy decoding would write the key.

Cost: the text before the needle is the same in every trial of a (format, n, depth), so it is prefilled once and
each trial forks it: the prompt's pages are reused in place (a trial only writes positions after the fork, and
attention never reads a position past its own, so the previous trial's later pages are never read) and the state
slot (hq-e8-2b's exact window and sinks) is restored from its image at the fork. A trial then prefills only the
needle, the rest of the filler and the question (in chunks of CHUNK tokens, logits of the last token), plus the
answer tokens but the last (logits of each). The window rule is positional, so every key is read exactly as in one
fresh prefill of the whole prompt (up to the float rounding of other chunk boundaries).
"""
from __future__ import annotations

import random

import torch

from ignisd.model.batch import ForwardBatch, SeqChunk
from kvformat_eval import make_store

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
HEAD = ("There is an important pass key hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz "
        "you about it.\n")
QUESTION = "\nWhat is the pass key? The pass key is"


CHUNK = 512
"""Prefill chunk (tokens) of the prefix and of each trial's suffix: as the daemon prefills, and what keeps an
hq-e8-2b chunk's masked compressed block (its own pages that leave the window) small."""


def _forward(model, kv, st, ids: list[int], start: int, logits: str) -> torch.Tensor:
    """Prefill ids at positions start.. in one chunk (slot 0 when st) -> the forward's logits."""
    pages = list(range(kv.num_pages))
    batch = ForwardBatch.build([SeqChunk(ids, start, pages, logits, 0 if st is not None else None)], kv.page_tokens)
    return model.forward(batch, kv, st)


def _prefill(model, kv, st, ids: list[int], chunk: int = CHUNK) -> None:
    """Prefill ids from position 0 in chunks of `chunk`, no logits."""
    if st is not None:
        st.zero(0)
    for s in range(0, len(ids), chunk):
        _forward(model, kv, st, ids[s:s + chunk], s, "none")


class Layout:
    """The token layout of one (n, depth): head + filler[:cut] (shared) | needle(key) + filler[cut:] + question
    (per trial) | answer. Raises ValueError when n leaves no room for filler."""

    def __init__(self, tk, n: int, depth: float) -> None:
        self.tk = tk
        filler, self.head, self.question = tk.encode(FILLER), tk.encode(HEAD), tk.encode(QUESTION)
        body = n - len(self.head) - len(self.needle(10000)) - len(self.question)
        if body < 1:
            raise ValueError(f"passkey: {n} tokens leave no room for filler")
        self.fill = (filler * (body // len(filler) + 1))[:body]
        self.cut = int(body * depth)
        self.prefix = self.head + self.fill[:self.cut]

    def needle(self, key: int) -> list[int]:
        return self.tk.encode(f" The pass key is {key}. Remember it. {key} is the pass key. ")

    def trial(self, key: int) -> tuple[list[int], list[int]]:
        """(suffix after the shared prefix up to the question's end, answer tokens)."""
        full = self.tk.encode(QUESTION + f" {key}")
        if full[:len(self.question)] != self.question:
            raise ValueError("passkey: the answer does not tokenize apart from the question")
        return self.needle(key) + self.fill[self.cut:] + self.question, full[len(self.question):]


@torch.inference_mode()
def fork_prefix(model, spec, fmt: str, lay: Layout, exact_window: int = 128, exact_sinks: int = 1):
    """(kv, states, image): a store in `fmt` holding lay.prefix, and the state slot's image at the fork point."""
    kv, st = make_store(spec, fmt, len(lay.prefix) + len(lay.fill) + 64, exact_window, exact_sinks)
    _prefill(model, kv, st, lay.prefix)
    return kv, st, (st.image(0) if st is not None else None)


@torch.inference_mode()
def trial_logits(model, fork, lay: Layout, key: int) -> tuple[torch.Tensor, list[int]]:
    """One forked trial: (logits [len(answer), vocab] predicting each answer token, the answer tokens)."""
    kv, st, image = fork
    if st is not None:
        st.restore(0, image)
    suffix, answer = lay.trial(key)
    pos = len(lay.prefix)
    cut = (len(suffix) - 1) // CHUNK * CHUNK                 # chunks of CHUNK, the last one (with the question) apart
    for s in range(0, cut, CHUNK):
        _forward(model, kv, st, suffix[s:s + CHUNK], pos + s, "none")
    first = _forward(model, kv, st, suffix[cut:], pos + cut, "last")[-1:]
    rest = _forward(model, kv, st, answer[:-1], pos + len(suffix), "all")
    return torch.cat((first, rest)), answer


def answer_margin(logits: torch.Tensor, answer: list[int]) -> float:
    """The trial's retrieval margin: min over answer positions of (logit of the answer token − the largest other
    logit), in logits. logits [len(answer), vocab] as trial_logits returns them. Positive when greedy decoding writes
    the key (ties aside); its spread over trials shows how close a format's hits are to misses, which a count of 20
    does not."""
    a = torch.tensor(answer)
    target = logits.gather(1, a[:, None])[:, 0]
    other = logits.scatter(1, a[:, None], float("-inf")).amax(-1)
    return float((target - other).min())


def passkey_trials(model, spec, tk, fmt: str, n: int, depth: float, keys: list[int], exact_window: int = 128,
                   exact_sinks: int = 1) -> list[tuple[bool, float]]:
    """(retrieved, answer_margin) of each of `keys` in format `fmt` (a kvformat_eval.make_store variant) from an
    n-token prompt with the needle at `depth` (0..1 of the filler); retrieved: the greedy argmax is every answer
    token."""
    lay = Layout(tk, n, depth)
    fork = fork_prefix(model, spec, fmt, lay, exact_window, exact_sinks)
    out = []
    for key in keys:
        logits, answer = trial_logits(model, fork, lay, key)
        out.append((logits.argmax(-1).tolist() == answer, answer_margin(logits, answer)))
    return out


def passkey_counts(model, spec, tk, fmt: str, n: int, depth: float, keys: list[int], exact_window: int = 128,
                   exact_sinks: int = 1) -> int:
    """How many of `keys` are retrieved (passkey_trials)."""
    return sum(hit for hit, _ in passkey_trials(model, spec, tk, fmt, n, depth, keys, exact_window, exact_sinks))


def trial_keys(trials: int, seed: int = 0) -> list[int]:
    """`trials` 5-digit keys from a fixed seed (the same keys for every format)."""
    rng = random.Random(seed)
    return [rng.randint(10000, 99999) for _ in range(trials)]
