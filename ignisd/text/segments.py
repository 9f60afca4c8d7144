"""Cut points of a rendered prompt (DESIGN §4.3). †: imports no torch.

Two steps, each a pure function on strings and ints (the traversal plan built on them is ``ignisd/traversal.py``):

* ``message_spans(template, messages, text)`` (``text/spans.py``): where each message lies in the rendered
  text, by prefix renders and, where the template looks ahead, probe renders.
* ``cut_points(text, ids, offsets, spans)``: the **publish point** (end of the system + tools block rounded down
  to a whole page; 0 when shorter than a page) and the **opener** (first token of the final generation opener).
  A cut at character c maps to the token that starts exactly at c; none: the cut is skipped (``cut_unaligned``).
  A cut inside an image span moves back to the image's start.

All positions are token indices; character positions are Python ``str`` indices of the rendered text.
"""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Sequence

from ignisd.text.spans import Spans
from ignisd.vocab import PAGE_TOKENS

SYSTEM_ROLES = ("system", "developer")

# Why a cut was not placed (``CutPoints.publish_why`` / ``opener_why``); ``CutPoints.reason`` maps them to wire.
WHY_BELOW_PAGE = "below_page"          # the system + tools block is shorter than one page
WHY_UNALIGNED = "cut_unaligned"        # no token starts at the cut character
WHY_NO_SPAN = "no_span"                # the boundary could not be located in the rendered text
WHY_NO_BLOCK = "no_block"              # no messages (nothing to publish)
WHY_NO_OPENER = "no_opener"            # the text ends without a generation opener


@dataclass(frozen=True)
class CutPoints:
    """The two cut points of a prompt (token positions) and why a cut is missing.

    publish: multiple of page_tokens; 0 = no retained prefix. opener: token position of the first token of the
    final generation opener, or None. publish_char / opener_char: the character cuts before token mapping (None when
    not located). publish_why / opener_why: None when placed, else one of the WHY_* strings.
    """

    publish: int
    opener: int | None
    publish_char: int | None = None
    opener_char: int | None = None
    publish_why: str | None = None
    opener_why: str | None = None

    @property
    def reason(self) -> str | None:
        """The ``ignis.reuse.reason`` literal that explains a missing cut: ``cut_unaligned`` (a cut that could not
        be mapped to a token or located), else ``below_page`` (block shorter than a page), else None."""
        whys = (self.publish_why, self.opener_why)
        if WHY_UNALIGNED in whys or WHY_NO_SPAN in whys:
            return "cut_unaligned"
        if WHY_BELOW_PAGE in whys:
            return "below_page"
        return None

    def wire(self) -> dict:
        """The ``tokenize`` op's ``cut_points``: ``{"publish", "opener"}``."""
        return {"publish": self.publish, "opener": self.opener}


# ---------------------------------------------------------------- cut points

def token_at(offsets: Sequence[Sequence[int]], char: int) -> int | None:
    """Index of the token that starts exactly at character ``char`` (the first one, when a character is split over
    several byte-level tokens), ``len(offsets)`` when ``char`` is at or past the end of the last token, else None."""
    starts = [o[0] for o in offsets]
    i = bisect_left(starts, char)
    if i < len(starts) and starts[i] == char:
        return i
    if not offsets or char >= offsets[-1][1]:
        return len(offsets) if i == len(starts) else None
    return None


def _out_of_images(pos: int, image_spans: Sequence[Sequence]) -> int:
    """``pos`` moved back to the start of any image span [s, e) with s < pos < e (repeated until none holds it)."""
    moved = True
    while moved:
        moved = False
        for s, e, *_ in image_spans:
            if s < pos < e:
                pos, moved = s, True
    return pos


def cut_points(text: str, ids: Sequence[int], offsets: Sequence[Sequence[int]], spans: Spans, *,
               page_tokens: int = PAGE_TOKENS, image_spans: Sequence[Sequence] = ()) -> CutPoints:
    """Publish point and opener of a prompt (DESIGN §4.3).

    text, ids, offsets: the rendered prompt and its tokenization (``Tokenizer.encode_with_offsets``). spans: from
    ``message_spans`` on the same text. image_spans: [(start, end, digest)] token ranges of images.

    The system + tools block ends at the end of the first message when it is a system message (or a developer
    message kept as such; tools the template renders inside it included), else at the start of the first message
    (the template's own preamble: a tools block or a default system prompt). Its token position is rounded down to a
    whole page.
    """
    if len(ids) != len(offsets):
        raise ValueError(f"{len(ids)} ids but {len(offsets)} offsets")
    if offsets and offsets[-1][1] > len(text):
        raise ValueError("offsets run past the end of the text")
    n_msgs = len(spans.roles)
    publish, publish_char, publish_why = 0, None, None
    if n_msgs == 0:
        publish_why = WHY_NO_BLOCK
    else:
        publish_char = spans.bounds[1] if spans.roles[0] in SYSTEM_ROLES else spans.bounds[0]
        if publish_char is None:
            publish_why = WHY_NO_SPAN
        else:
            t = token_at(offsets, publish_char)
            if t is None:
                publish_why = WHY_UNALIGNED
            else:
                t = _out_of_images(t, image_spans)
                p = t - t % page_tokens
                while _out_of_images(p, image_spans) != p:
                    q = _out_of_images(p, image_spans)
                    p = q - q % page_tokens
                publish = p
                if publish == 0:
                    publish_why = WHY_BELOW_PAGE
    opener, opener_char, opener_why = None, spans.generation_start, None
    if opener_char is None:
        opener_why = WHY_NO_OPENER if (n_msgs and spans.bounds[n_msgs] is not None) or not n_msgs else WHY_NO_SPAN
    else:
        t = token_at(offsets, opener_char)
        if t is None or t >= len(ids):
            opener_why = WHY_UNALIGNED
        else:
            opener = _out_of_images(t, image_spans)
    return CutPoints(publish, opener, publish_char, opener_char, publish_why, opener_why)
