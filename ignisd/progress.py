"""Load progress: a tqdm bar when stderr is a terminal, STATUS= lines under systemd (issue 13). †: imports no torch.

``LoadProgress`` is the ``progress`` callable the loader wraps its tensor loops in (ignisd.model.loader.load_model):
``progress(items, total, desc)`` yields the items unchanged while it reports how far it got. On a terminal it draws
a tqdm bar on stderr (never into the journal or a log file); with a notify socket it sends ``STATUS=loading NAME:
weights 40% (120/300 tensors)`` at most once a second. It may run in a worker thread (the daemon loads off the event
loop); both outputs are thread-safe.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import TextIO, TypeVar

from ignisd.systemd import Notifier

T = TypeVar("T")
STATUS_EVERY_S = 1.0


def no_progress(items: Iterable[T], total: int | None = None, desc: str = "") -> Iterable[T]:
    """The loader's default progress: nothing reported."""
    return items


class LoadProgress:
    """Reports the loader's progress on `name` (the model's name).

    notifier: STATUS= lines (None: none). stream: where the bar goes (default sys.stderr); bar: draw it (default:
    when `stream` is a terminal).
    """

    def __init__(self, name: str, notifier: Notifier | None = None, stream: TextIO | None = None,
                 bar: bool | None = None):
        self.name = name
        self.notifier = notifier
        self.stream = sys.stderr if stream is None else stream
        if bar is None:
            isatty = getattr(self.stream, "isatty", None)
            bar = bool(isatty and isatty())
        self.bar = bar

    def __call__(self, items: Iterable[T], total: int | None = None, desc: str = "weights") -> Iterator[T]:
        bar = None
        if self.bar:
            from tqdm import tqdm
            bar = tqdm(total=total, desc=f"loading {self.name}: {desc}", unit="tensor", file=self.stream,
                       leave=False, dynamic_ncols=True)
        last = 0.0
        try:
            for i, item in enumerate(items, 1):
                yield item
                if bar is not None:
                    bar.update(1)
                now = time.monotonic()
                if self.notifier is not None and now - last >= STATUS_EVERY_S:
                    last = now
                    self.notifier.status(self.status_text(desc, i, total))
        finally:
            if bar is not None:
                bar.close()

    def status_text(self, desc: str, done: int, total: int | None) -> str:
        """The STATUS= line after `done` of `total` items ("loading NAME: weights 40% (120/300 tensors)")."""
        if total:
            return f"loading {self.name}: {desc} {100 * done // total}% ({done}/{total} tensors)"
        return f"loading {self.name}: {desc} ({done} tensors)"
