"""systemd integration without libsystemd: sd_notify(3) and sd_listen_fds(3) in a few lines (DESIGN §3). †: no torch.

* ``Notifier`` sends notification datagrams (``READY=1``, ``STATUS=…``, ``WATCHDOG=1``, ``STOPPING=1``,
  ``RELOADING=1``) to the socket named by ``$NOTIFY_SOCKET`` (a path, or ``@name`` in the abstract namespace). Without
  it every call is a no-op, so the daemon calls it unconditionally. The watchdog is on when ``$WATCHDOG_USEC`` is set
  (and ``$WATCHDOG_PID``, when set, is this process); systemd then expects ``WATCHDOG=1`` at least that often.
* ``inherited_sockets`` takes the listening sockets systemd passed (``$LISTEN_FDS`` descriptors from fd 3, for this
  process when ``$LISTEN_PID`` matches), each with its name from ``$LISTEN_FDNAMES`` (``FileDescriptorName=`` in the
  socket unit). ``match_sockets`` assigns them to the daemon's listeners by name: ``ndjson`` (the Unix socket of the
  NDJSON protocol) and ``http`` (the HTTP fronts). A lone Unix socket without a recognised name (the default name is
  the socket unit's, ``ignisd.socket``) is the NDJSON one.

The environment variables are removed once read (as ``sd_listen_fds(unset_environment=1)`` does), so a child process
never takes them for its own.
"""
from __future__ import annotations

import os
import socket
from collections.abc import MutableMapping
from dataclasses import dataclass

SD_LISTEN_FDS_START = 3
LISTENER_NAMES = ("ndjson", "http")


class Notifier:
    """Writes sd_notify datagrams; every method returns whether a datagram was sent (False without $NOTIFY_SOCKET
    or when the send failed: notification is best effort and never raises).

    env: the environment to read (default os.environ); NOTIFY_SOCKET, WATCHDOG_USEC and WATCHDOG_PID are removed from
    it. watchdog_usec: the watchdog timeout in microseconds (None: off).
    """

    def __init__(self, env: MutableMapping[str, str] | None = None):
        env = os.environ if env is None else env
        addr = env.pop("NOTIFY_SOCKET", "") or None
        usec, pid = env.pop("WATCHDOG_USEC", ""), env.pop("WATCHDOG_PID", "")
        self.address = ("\0" + addr[1:]) if addr and addr.startswith("@") else addr
        self.watchdog_usec: int | None = None
        try:
            if usec and int(usec) > 0 and (not pid or int(pid) == os.getpid()):
                self.watchdog_usec = int(usec)
        except ValueError:
            pass
        self._sock: socket.socket | None = None

    @property
    def enabled(self) -> bool:
        """Whether a notify socket is configured."""
        return self.address is not None

    @property
    def watchdog_timeout_s(self) -> float | None:
        """systemd's watchdog timeout (WatchdogSec=) in seconds, or None when the watchdog is off."""
        return self.watchdog_usec / 1e6 if self.watchdog_usec else None

    def send(self, *assignments: str) -> bool:
        """Send one datagram of ``KEY=value`` lines (e.g. ``send("READY=1", "STATUS=serving")``)."""
        if self.address is None or not assignments:
            return False
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto("\n".join(assignments).encode(), self.address)
            return True
        except OSError:
            return False

    def ready(self, status: str | None = None) -> bool:
        """The service is up (Type=notify start finished); optionally with a STATUS= line."""
        return self.send("READY=1", *([f"STATUS={status}"] if status else []))

    def status(self, text: str) -> bool:
        """A one-line status shown by `systemctl status`."""
        return self.send(f"STATUS={text}")

    def watchdog(self) -> bool:
        """A watchdog keep-alive (only sent when the watchdog is on)."""
        return self.watchdog_usec is not None and self.send("WATCHDOG=1")

    def stopping(self, status: str | None = None) -> bool:
        """The service began its shutdown."""
        return self.send("STOPPING=1", *([f"STATUS={status}"] if status else []))

    def reloading(self, status: str | None = None) -> bool:
        """The service is reloading its configuration (send ready() when done)."""
        return self.send("RELOADING=1", *([f"STATUS={status}"] if status else []))

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


@dataclass
class InheritedSocket:
    """A listening socket passed by systemd: its name (``LISTEN_FDNAMES``, "unknown" when unnamed) and the socket."""

    name: str
    sock: socket.socket

    @property
    def is_unix(self) -> bool:
        return self.sock.family == socket.AF_UNIX

    def describe(self) -> str:
        """The address it listens on, for a log line ("/run/ignis/ignisd.sock", "127.0.0.1:8080")."""
        try:
            addr = self.sock.getsockname()
        except OSError:
            return "?"
        if isinstance(addr, tuple):
            return f"{addr[0]}:{addr[1]}"
        return addr.decode(errors="replace") if isinstance(addr, bytes) else str(addr)


def inherited_sockets(env: MutableMapping[str, str] | None = None) -> list[InheritedSocket]:
    """The sockets systemd passed to this process, in fd order; [] when none (LISTEN_PID unset or another
    process's). Each descriptor is made close-on-exec. LISTEN_PID, LISTEN_FDS and LISTEN_FDNAMES are removed from
    `env`. Raises ValueError when LISTEN_FDS is malformed or a descriptor is not a socket."""
    env = os.environ if env is None else env
    pid, count, names = env.pop("LISTEN_PID", ""), env.pop("LISTEN_FDS", ""), env.pop("LISTEN_FDNAMES", "")
    if not pid or not count:
        return []
    try:
        if int(pid) != os.getpid():
            return []
        n = int(count)
    except ValueError:
        raise ValueError(f"LISTEN_PID={pid!r} / LISTEN_FDS={count!r} are not numbers") from None
    if n < 0:
        raise ValueError(f"LISTEN_FDS={count!r} is negative")
    labels = names.split(":") if names else []
    out = []
    for i in range(n):
        fd = SD_LISTEN_FDS_START + i
        try:
            os.set_inheritable(fd, False)
            sock = socket.socket(fileno=fd)     # family and type are read from the descriptor
        except OSError as e:
            raise ValueError(f"LISTEN_FDS: descriptor {fd} is not a socket ({e.strerror})") from None
        out.append(InheritedSocket(labels[i] if i < len(labels) and labels[i] else "unknown", sock))
    return out


def match_sockets(socks: list[InheritedSocket]) -> tuple[dict[str, socket.socket], list[InheritedSocket]]:
    """Assign inherited sockets to listeners by name: {"ndjson" | "http": socket}, and the sockets no
    listener takes (the caller logs and closes them). One socket with a name outside LISTENER_NAMES (e.g. the
    socket unit's default) is the NDJSON socket when it is a Unix socket; with several, only named ones are
    taken. Two sockets of one name: the first is taken."""
    chosen: dict[str, socket.socket] = {}
    rest: list[InheritedSocket] = []
    for s in socks:
        if s.name in LISTENER_NAMES and s.name not in chosen:
            chosen[s.name] = s.sock
        else:
            rest.append(s)
    if len(socks) == 1 and rest and rest[0].is_unix and "ndjson" not in chosen:
        chosen["ndjson"] = rest.pop().sock
    return chosen, rest
