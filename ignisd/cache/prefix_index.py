"""The content index of retained states (DESIGN §4.4). †: imports no torch.

A state is found by what it holds, never by a session id: a prompt reuses the longest retained state whose tokens
(image identities included) are a prefix of it. The index is a trie over **chained page hashes**: the hash of page i
is ``blake2b(hash of page i-1, its 64 token ids, the (start, end, digest) of every image whose span touches it)``,
so one hash names the whole prefix up to the end of that page and the trie is a dict keyed by it. Each state hangs
at the node of its last full page and keeps its **tail** (the tokens of its partial last page), compared exactly.

Images are token ranges [start, end) with the SHA-256 (hex) of their bytes; placeholder ids never identify an image.
A match never ends inside an image of the prompt. Hashes are stable across processes (no Python ``hash``).
"""
from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass

from ignisd.vocab import PAGE_TOKENS

_ROOT = b""
_PERSON = b"ignis-page-v1"

ImageSpan = tuple[int, int, str]     # token positions [start, end) and the image's SHA-256 hex digest


@dataclass(frozen=True)
class Match:
    """State ``state_id`` is a prefix of the prompt; reusing it restores ``matched_tokens`` tokens (its length)."""

    state_id: Hashable
    matched_tokens: int


@dataclass(frozen=True)
class Candidate:
    """The state sharing the longest common prefix with a prompt without being a prefix of it.

    common_tokens: tokens (with image identities) shared from the start = the position of the first divergence
    (``ignis.reuse.diverged_at.token``). state_tokens: the state's length.
    """

    state_id: Hashable
    common_tokens: int
    state_tokens: int


def _digest_bytes(digest: str) -> bytes:
    try:
        return bytes.fromhex(digest)
    except ValueError:
        return digest.encode("utf-8")


def normalize_spans(image_spans: Iterable[Sequence], n_tokens: int | None = None) -> tuple[ImageSpan, ...]:
    """Image spans as sorted (start, end, digest) tuples. Raises ValueError for an empty span, a negative start, an
    end past ``n_tokens`` or overlapping spans."""
    spans = tuple(sorted((int(s), int(e), str(d)) for s, e, d in image_spans))
    prev_end = 0
    for s, e, _ in spans:
        if s < 0 or e <= s or (n_tokens is not None and e > n_tokens) or s < prev_end:
            raise ValueError(f"bad image span [{s}, {e}) (tokens: {n_tokens}, previous end {prev_end})")
        prev_end = e
    return spans


def _touching(spans: Sequence[ImageSpan], lo: int, hi: int) -> tuple[ImageSpan, ...]:
    return tuple(sp for sp in spans if sp[0] < hi and sp[1] > lo)


def page_hash(parent: bytes, page: Sequence[int], images: Sequence[ImageSpan] = ()) -> bytes:
    """The chained hash of one full page: parent hash, its token ids, the images touching it."""
    h = hashlib.blake2b(digest_size=32, person=_PERSON)
    h.update(parent)
    h.update(struct.pack(f"<I{len(page)}I", len(page), *page))
    h.update(struct.pack("<I", len(images)))
    for s, e, d in images:
        raw = _digest_bytes(d)
        h.update(struct.pack("<qqI", s, e, len(raw)))
        h.update(raw)
    return h.digest()


def page_hashes(tokens: Sequence[int], image_spans: Sequence[ImageSpan] = (), page_tokens: int = PAGE_TOKENS,
                limit: int | None = None) -> list[bytes]:
    """Chained hashes of the full pages of ``tokens`` (at most ``limit`` of them). image_spans: normalized."""
    full = len(tokens) // page_tokens
    if limit is not None:
        full = min(full, limit)
    out, parent = [], _ROOT
    for i in range(full):
        lo, hi = i * page_tokens, (i + 1) * page_tokens
        parent = page_hash(parent, tokens[lo:hi], _touching(image_spans, lo, hi))
        out.append(parent)
    return out


class _Node:
    __slots__ = ("depth", "ends", "sub")

    def __init__(self, depth: int):
        self.depth = depth
        self.ends: set[Hashable] = set()     # states whose last full page is this node
        self.sub: set[Hashable] = set()      # states at this node or below


@dataclass(frozen=True)
class _Entry:
    tokens: tuple[int, ...]
    spans: tuple[ImageSpan, ...]
    path: tuple[bytes, ...]                  # chained hashes of its full pages
    seq: int                                 # insertion order: the later of two otherwise equal states wins


class PrefixIndex:
    """Content index over retained states' tokens and image identities.

    State ids are any hashable (the retained store uses strings). The index holds a copy of each state's tokens.
    """

    def __init__(self, page_tokens: int = PAGE_TOKENS):
        self.page_tokens = page_tokens
        self._nodes: dict[bytes, _Node] = {_ROOT: _Node(0)}
        self._entries: dict[Hashable, _Entry] = {}
        self._seq = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, state_id: Hashable) -> bool:
        return state_id in self._entries

    def ids(self) -> list[Hashable]:
        """Every indexed state id."""
        return list(self._entries)

    def tokens(self, state_id: Hashable) -> tuple[int, ...]:
        """The tokens ``state_id`` was inserted with. Raises KeyError."""
        return self._entries[state_id].tokens

    def image_spans(self, state_id: Hashable) -> tuple[ImageSpan, ...]:
        """The (normalized) image spans ``state_id`` was inserted with. Raises KeyError."""
        return self._entries[state_id].spans

    def insert(self, state_id: Hashable, tokens: Sequence[int], image_spans: Iterable[Sequence] = ()) -> None:
        """Index a state holding ``tokens`` with images ``[(start, end, sha256_hex)]``. Raises ValueError when
        ``state_id`` is already indexed or a span is malformed."""
        if state_id in self._entries:
            raise ValueError(f"state {state_id!r} is already indexed")
        tokens = tuple(int(t) for t in tokens)
        spans = normalize_spans(image_spans, len(tokens))
        path = tuple(page_hashes(tokens, spans, self.page_tokens))
        self._seq += 1
        self._entries[state_id] = _Entry(tokens, spans, path, self._seq)
        self._nodes[_ROOT].sub.add(state_id)
        for depth, h in enumerate(path, 1):
            node = self._nodes.get(h)
            if node is None:
                node = self._nodes[h] = _Node(depth)
            node.sub.add(state_id)
        self._nodes[path[-1] if path else _ROOT].ends.add(state_id)

    def remove(self, state_id: Hashable) -> bool:
        """Drop ``state_id`` from the index; False when it was not indexed."""
        entry = self._entries.pop(state_id, None)
        if entry is None:
            return False
        self._nodes[entry.path[-1] if entry.path else _ROOT].ends.discard(state_id)
        self._nodes[_ROOT].sub.discard(state_id)
        for h in entry.path:
            node = self._nodes[h]
            node.sub.discard(state_id)
            if not node.sub:
                del self._nodes[h]
        return True

    # ---------------------------------------------------------------- queries
    def _walk(self, prompt: Sequence[int], spans: tuple[ImageSpan, ...]) -> list[bytes]:
        """The prompt's chained page hashes as far as the trie has them: [root, page 1, …, deepest]."""
        p = self.page_tokens
        path, parent = [_ROOT], _ROOT
        for i in range(len(prompt) // p):
            lo, hi = i * p, (i + 1) * p
            h = page_hash(parent, prompt[lo:hi], _touching(spans, lo, hi))
            if h not in self._nodes:
                break
            path.append(h)
            parent = h
        return path

    def _is_match(self, entry: _Entry, depth: int, prompt: Sequence[int], spans: tuple[ImageSpan, ...]) -> bool:
        m = len(entry.tokens)
        if m > len(prompt):
            return False
        lo = depth * self.page_tokens
        if tuple(prompt[lo:m]) != entry.tokens[lo:]:
            return False
        if any(s < m < e for s, e, _ in spans):
            return False                               # would end inside an image of the prompt
        return _touching(spans, lo, m) == _touching(entry.spans, lo, m)

    def matches(self, prompt: Sequence[int], image_spans: Iterable[Sequence] = (),
                limit: int | None = None) -> list[Match]:
        """Every indexed state whose tokens and images are a prefix of the prompt, at most ``limit`` tokens long
        (e.g. ``len(prompt) - 1`` so a token is left to prefill), longest first."""
        spans = normalize_spans(image_spans)
        out = []
        for depth, h in enumerate(self._walk(prompt, spans)):
            for sid in self._nodes[h].ends:
                entry = self._entries[sid]
                if (limit is None or len(entry.tokens) <= limit) and self._is_match(entry, depth, prompt, spans):
                    out.append(Match(sid, len(entry.tokens)))
        out.sort(key=lambda m: (-m.matched_tokens, -self._entries[m.state_id].seq))
        return out

    def lookup(self, prompt: Sequence[int], image_spans: Iterable[Sequence] = (), limit: int | None = None,
               key: Callable[[Hashable], object] | None = None,
               accept: Callable[[Hashable], bool] | None = None) -> Match | None:
        """The longest state that is a prefix of the prompt (see ``matches``), or None. Among equally long ones the
        largest ``key(state_id)`` wins, then the one inserted last. accept: a filter (e.g. unpinned, right stamp)."""
        found = [m for m in self.matches(prompt, image_spans, limit) if accept is None or accept(m.state_id)]
        if not found:
            return None
        best = found[0].matched_tokens
        tied = [m for m in found if m.matched_tokens == best]
        seq = self._entries
        return max(tied, key=(lambda m: (key(m.state_id), seq[m.state_id].seq)) if key else
                   (lambda m: seq[m.state_id].seq))

    def common_prefix(self, state_id: Hashable, prompt: Sequence[int], image_spans: Iterable[Sequence] = ()) -> int:
        """Tokens the state shares with the prompt from the start, an image shared only when it is the same image
        over the same span (the first divergence position)."""
        return self._common(self._entries[state_id], tuple(prompt), normalize_spans(image_spans))

    def _common(self, entry: _Entry, prompt: Sequence[int], spans: tuple[ImageSpan, ...], start: int = 0,
                stop: int | None = None) -> int:
        """The first divergence of tokens and images, searched in [start, stop) (tokens before ``start`` are known
        equal: their page hashes matched; the divergence is known to lie before ``stop``)."""
        a, b = entry.tokens, prompt
        n = min(len(a), len(b)) if stop is None else min(len(a), len(b), stop)
        i = start
        if tuple(a[start:n]) == tuple(b[start:n]):
            i = n
        else:
            lo, hi = start, n            # equal over [start, lo), not over [start, hi); slices compare in C
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if tuple(a[start:mid]) == tuple(b[start:mid]):
                    lo = mid
                else:
                    hi = mid
            i = lo
        for s, _end, _digest in sorted(set(spans) ^ set(entry.spans)):    # images present on one side only
            if s < i:
                i = s
            break
        return i

    def best_candidate(self, prompt: Sequence[int], image_spans: Iterable[Sequence] = (),
                       key: Callable[[Hashable], object] | None = None,
                       accept: Callable[[Hashable], bool] | None = None) -> Candidate | None:
        """Among the states that are *not* a prefix of the prompt, the one sharing the longest common prefix with it
        (ties: largest ``key``, then inserted last), with the position of the first divergence; None when every
        state is a prefix (or there are none). A state longer than the prompt that starts with the whole prompt
        diverges at ``len(prompt)``.

        Cost: the walk over the prompt's page hashes, then at most one page of tokens compared per state under the
        deepest shared node (a state first met at depth d shares d pages by hash and diverges in page d + 1)."""
        spans = normalize_spans(image_spans)
        prompt = tuple(prompt)
        path = self._walk(prompt, spans)
        p = self.page_tokens
        best: Candidate | None = None
        best_key = None
        seen: set = set()
        # Deepest node first: its subtree shares the most; stop once a level cannot beat the best found so far.
        for depth in range(len(path) - 1, -1, -1):
            floor = depth * p
            if best is not None and best.common_tokens >= floor + p:
                break
            for sid in self._nodes[path[depth]].sub:
                if sid in seen or (accept is not None and not accept(sid)):
                    continue
                seen.add(sid)
                entry = self._entries[sid]
                common = self._common(entry, prompt, spans, floor, floor + p)
                if common == len(entry.tokens):
                    continue             # a prefix of the prompt: a match, not a candidate
                k = (key(sid), entry.seq) if key else entry.seq
                if best is None or common > best.common_tokens or (common == best.common_tokens and k > best_key):
                    best, best_key = Candidate(sid, common, len(entry.tokens)), k
        return best

    def check_integrity(self) -> None:
        """Prove every node's subtree set matches the entries' paths. Raises AssertionError."""
        want: dict[bytes, set] = {_ROOT: set(self._entries)}
        ends: dict[bytes, set] = {}
        for sid, e in self._entries.items():
            for h in e.path:
                want.setdefault(h, set()).add(sid)
            ends.setdefault(e.path[-1] if e.path else _ROOT, set()).add(sid)
        got = {h: n.sub for h, n in self._nodes.items()}
        if got != want:
            raise AssertionError("prefix index: node subtrees do not match the states' paths")
        for h, n in self._nodes.items():
            if n.ends != ends.get(h, set()):
                raise AssertionError("prefix index: node ends do not match the states' last pages")
