"""Incremental detokenization for streamed replies.

Two hold-backs make a streamed piece safe to send:

* UTF-8: a byte-level BPE token can carry part of a character. Each step decodes a short window of ids twice —
  ``ids[prefix:read]`` (text already emitted) and ``ids[prefix:]`` — and emits the difference only when the
  longer text does not end in U+FFFD (an incomplete character). This is the algorithm of Hugging Face
  text-generation-inference (``Model.decode_token``) and vLLM's ``detokenize_incrementally``; decoding the
  window with its left context keeps decoders that strip a leading space (Metaspace) right.
* Stop strings: text that could be the start of a stop string is held until it is either completed (then the
  text is cut exactly where the stop string starts, and ``stopped`` is set) or ruled out.

No torch here.
"""

from __future__ import annotations

_REPLACEMENT = "\ufffd"


class StreamDecoder:
    """Turns generated token ids into text pieces, one ``push`` per token.

    Args:
        tokenizer: an ``ignisd.text.tokenizer.Tokenizer`` (anything with ``decode(ids, skip_special_tokens)``).
        stop: stop strings (empty strings are ignored). The reply ends before the first one that appears.
        skip_special_tokens: leave special tokens' text (``<|im_end|>``) out of the emitted text.
    Attributes:
        stopped: a stop string was seen; later pushes return "".
        stop_string: the stop string that ended the text (None until one did).
        text: everything emitted so far (the concatenation of the returned pieces).
    """

    def __init__(self, tokenizer, stop: list[str] | None = None, skip_special_tokens: bool = True):
        self._tokenizer = tokenizer
        self._stop = [s for s in (stop or []) if s]
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # window start: ids before it are decoded and final
        self._read = 0  # ids[_prefix:_read] are decoded into text already taken
        self._pending = ""  # decoded text not emitted yet (a possible stop-string start)
        self.stopped = False
        self.stop_string: str | None = None
        self.text = ""

    @property
    def decoded_chars(self) -> int:
        """Characters decoded so far: ``text`` plus what is held back for a stop string (not an incomplete UTF-8
        tail). Read before a ``push``, it is where that token's text starts in ``text`` (a token that completes no
        character starts where the character it begins does)."""
        return len(self.text) + len(self._pending)

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip)

    def _take_new_text(self, final: bool) -> str:
        """Newly completed text of the ids pushed so far (with ``final``: also an incomplete tail)."""
        window = self._ids[self._prefix:]
        before = self._decode(self._ids[self._prefix:self._read])
        after = self._decode(window)
        if len(after) <= len(before) or (after.endswith(_REPLACEMENT) and not final):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return after[len(before):]

    def _emit(self, final: bool) -> str:
        """Move what is safe from ``_pending`` into ``text`` and return it."""
        pending = self._pending
        cut, hit = min(((i, s) for s in self._stop if (i := pending.find(s)) >= 0), default=(-1, None))
        if cut >= 0:
            piece, self._pending, self.stopped, self.stop_string = pending[:cut], "", True, hit
        elif final:
            piece, self._pending = pending, ""
        else:
            hold = 0
            for s in self._stop:  # longest suffix of pending that is a proper prefix of a stop string
                for n in range(min(len(s) - 1, len(pending)), hold, -1):
                    if pending.endswith(s[:n]):
                        hold = n
                        break
            piece, self._pending = pending[:len(pending) - hold], pending[len(pending) - hold:]
        self.text += piece
        return piece

    def push(self, token_id: int) -> str:
        """Add one generated token; return the text that is now safe to send ("" while held back or after
        ``stopped``)."""
        if self.stopped:
            return ""
        self._ids.append(int(token_id))
        self._pending += self._take_new_text(final=False)
        return self._emit(final=False) if self._pending else ""

    def flush(self) -> str:
        """At the end of generation: the held-back text (an incomplete final character decodes as U+FFFD, as in
        ``tokenizer.decode``), cut at a stop string if one completes."""
        if self.stopped:
            return ""
        self._pending += self._take_new_text(final=True)
        return self._emit(final=True)
