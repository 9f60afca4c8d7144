"""sd_notify against a datagram socket standing in for systemd's NOTIFY_SOCKET, LISTEN_FDS parsing and matching by
name (ignisd/systemd.py), and the round loop's heartbeat on a fake clock (ignisd/health.py)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ignisd.health import DEFAULT_STALL_S, Heartbeat
from ignisd.systemd import InheritedSocket, Notifier, match_sockets

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def notify_sock(tmp_path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(str(tmp_path / "notify"))
    s.settimeout(2)
    yield s, str(tmp_path / "notify")
    s.close()


def recv_all(s: socket.socket) -> list[str]:
    out = []
    s.settimeout(0.05)
    try:
        while True:
            out.append(s.recv(4096).decode())
    except (TimeoutError, BlockingIOError):
        pass
    return out


def test_notifier_sends_each_message_as_one_datagram(notify_sock):
    s, path = notify_sock
    env = {"NOTIFY_SOCKET": path}
    n = Notifier(env)
    assert env == {} and n.enabled and n.watchdog_timeout_s is None
    assert n.status("loading tiny: weights 40%")
    assert n.ready("serving tiny: idle")
    assert not n.watchdog()                          # no WATCHDOG_USEC: no ping
    assert n.reloading() and n.stopping("bye")
    assert recv_all(s) == ["STATUS=loading tiny: weights 40%", "READY=1\nSTATUS=serving tiny: idle", "RELOADING=1",
                           "STOPPING=1\nSTATUS=bye"]
    n.close()


def test_notifier_without_a_socket_does_nothing_and_a_gone_socket_never_raises(tmp_path):
    n = Notifier({})
    assert not n.enabled and not n.ready() and not n.status("x") and not n.watchdog()
    gone = Notifier({"NOTIFY_SOCKET": str(tmp_path / "nobody"), "WATCHDOG_USEC": "1000000"})
    assert gone.enabled and gone.watchdog_timeout_s == 1.0
    assert not gone.ready() and not gone.watchdog()


def test_watchdog_is_on_only_for_this_pid(notify_sock):
    s, path = notify_sock
    mine = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "500000", "WATCHDOG_PID": str(os.getpid())})
    other = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "500000", "WATCHDOG_PID": str(os.getpid() + 1)})
    bad = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "soon"})
    assert mine.watchdog_usec == 500000 and other.watchdog_usec is None and bad.watchdog_usec is None
    assert mine.watchdog() and not other.watchdog()
    assert recv_all(s) == ["WATCHDOG=1"]


def test_abstract_namespace_address():
    name = f"ignis-test-{os.getpid()}"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind("\0" + name)
    s.settimeout(2)
    try:
        assert Notifier({"NOTIFY_SOCKET": "@" + name}).ready()
        assert s.recv(100) == b"READY=1"
    finally:
        s.close()


def _listener(family=socket.AF_UNIX, tmp: Path | None = None, name="x") -> socket.socket:
    s = socket.socket(family, socket.SOCK_STREAM)
    s.bind(str(tmp / name) if family == socket.AF_UNIX else ("127.0.0.1", 0))
    s.listen()
    return s


def test_match_sockets_by_name(tmp_path):
    u1, u2, tcp = _listener(tmp=tmp_path, name="a"), _listener(tmp=tmp_path, name="b"), _listener(socket.AF_INET)
    try:
        chosen, rest = match_sockets([InheritedSocket("http", tcp), InheritedSocket("ndjson", u1),
                                      InheritedSocket("stray", u2)])
        assert chosen == {"http": tcp, "ndjson": u1} and [r.name for r in rest] == ["stray"]
        # one unix socket under the socket unit's default name is the NDJSON one; a lone TCP socket is not
        assert match_sockets([InheritedSocket("ignisd.socket", u2)]) == ({"ndjson": u2}, [])
        chosen, rest = match_sockets([InheritedSocket("unknown", tcp)])
        assert chosen == {} and len(rest) == 1
        # two of one name: the first is taken
        chosen, rest = match_sockets([InheritedSocket("ndjson", u1), InheritedSocket("ndjson", u2)])
        assert chosen == {"ndjson": u1} and rest[0].sock is u2
        assert InheritedSocket("ndjson", u1).describe() == str(tmp_path / "a")
        assert InheritedSocket("http", tcp).describe().startswith("127.0.0.1:")
    finally:
        for s in (u1, u2, tcp):
            s.close()


LISTEN_CHILD = """
import os, sys, json
from ignisd.systemd import inherited_sockets
os.environ["LISTEN_PID"] = str(os.getpid()) if sys.argv[1] == "mine" else "1"
socks = inherited_sockets()
print(json.dumps({"socks": [[s.name, s.describe(), os.get_inheritable(s.sock.fileno())] for s in socks],
                  "env": sorted(k for k in os.environ if k.startswith("LISTEN_"))}))
"""


@pytest.mark.parametrize("whose", ["mine", "another"])
def test_inherited_sockets_from_fd_3_with_names(tmp_path, whose):
    import json
    a, b = _listener(tmp=tmp_path, name="a"), _listener(socket.AF_INET)

    def place():
        os.dup2(a.fileno(), 3)
        os.dup2(b.fileno(), 4)

    env = dict(os.environ, LISTEN_FDS="2", LISTEN_FDNAMES="ndjson:http")
    try:
        r = subprocess.run([sys.executable, "-c", LISTEN_CHILD, whose], capture_output=True, text=True, env=env,
                           preexec_fn=place, pass_fds=(3, 4), cwd=ROOT, timeout=60)
    finally:
        a.close()
        b.close()
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["env"] == []                        # removed either way: a child never takes them for its own
    if whose == "another":
        assert out["socks"] == []
    else:
        (n1, addr1, inh1), (n2, addr2, inh2) = out["socks"]
        assert (n1, addr1, n2) == ("ndjson", str(tmp_path / "a"), "http") and addr2.startswith("127.0.0.1:")
        assert not inh1 and not inh2                # close-on-exec from now on


# ------------------------------------------------------------------ heartbeat

class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_heartbeat_pings_at_most_every_half_timeout_and_reports_a_stall(notify_sock):
    s, path = notify_sock
    clock = Clock()
    hb = Heartbeat(Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000"}), clock=clock)
    assert (hb.interval_s, hb.stall_after_s, hb.idle_wait_s) == (1.0, 1.0, 1.0)
    for _ in range(5):                 # rounds 0.1 s apart: one ping, then none until an interval passed
        hb.beat()
        clock.t += 0.1
    assert hb.pings == 1 and hb.beats == 5
    clock.t += 0.6
    hb.beat()
    assert hb.pings == 2
    assert recv_all(s) == ["WATCHDOG=1", "WATCHDOG=1"]
    assert hb.stalled(busy=True) is None
    clock.t += 1.5                     # no beat for 1.5 s: stalled while work waits, not when idle
    reason = hb.stalled(busy=True)
    assert reason.startswith("engine_stalled: no round finished for 1.5 s") and "threshold 1 s" in reason
    assert hb.stalled(busy=False) is None
    hb.keepalive()                     # loading / unloaded: the watchdog is fed, the stall clock restarts
    assert hb.stalled(busy=True) is None and hb.pings == 3 and recv_all(s) == ["WATCHDOG=1"]


def test_heartbeat_without_watchdog():
    clock = Clock()
    hb = Heartbeat(None, clock=clock)
    assert hb.stall_after_s == DEFAULT_STALL_S and hb.idle_wait_s == 1.0
    hb.beat()
    clock.t += DEFAULT_STALL_S + 1
    assert hb.pings == 0 and hb.stalled(True) is not None
    assert Heartbeat(None, stall_after_s=5, clock=clock).stall_after_s == 5
