"""Load progress (ignisd/progress.py): a tqdm bar only on a terminal, STATUS= lines to the notify socket."""
from __future__ import annotations

import io
import socket

from ignisd import progress as PR
from ignisd.systemd import Notifier


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_a_bar_on_a_terminal_and_nothing_elsewhere():
    tty, pipe = Tty(), io.StringIO()
    assert list(PR.LoadProgress("tiny", stream=tty)(range(5), 5)) == [0, 1, 2, 3, 4]
    assert "loading tiny: weights" in tty.getvalue() and "/5 [" in tty.getvalue()
    assert list(PR.LoadProgress("tiny", stream=pipe)(range(5), 5)) == list(range(5))
    assert pipe.getvalue() == ""                    # a journal or log file gets no bar


def test_status_lines_under_systemd(tmp_path, monkeypatch):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(str(tmp_path / "n"))
    s.settimeout(1)
    monkeypatch.setattr(PR, "STATUS_EVERY_S", 0.0)
    p = PR.LoadProgress("tiny", notifier=Notifier({"NOTIFY_SOCKET": str(tmp_path / "n")}), stream=io.StringIO())
    assert list(p(["a", "b", "c", "d"], 4)) == ["a", "b", "c", "d"]
    got = [s.recv(200).decode() for _ in range(4)]
    s.close()
    assert got == ["STATUS=loading tiny: weights 25% (1/4 tensors)", "STATUS=loading tiny: weights 50% (2/4 tensors)",
                   "STATUS=loading tiny: weights 75% (3/4 tensors)", "STATUS=loading tiny: weights 100% (4/4 tensors)"]
    assert p.status_text("weights", 3, None) == "loading tiny: weights (3 tensors)"
    assert list(PR.no_progress([1, 2])) == [1, 2]
