"""The daemon's socket path: make its directory, clear a stale socket, refuse anything else (DESIGN §6 server.socket).

Only a socket that refuses connections (a crashed daemon's) is removed. Whatever else the path names — a regular
file, a directory, a symbolic link, a pipe — and a directory that cannot be made or written is a start error naming
the path and what is there, and the path is left as it was. †: imports no torch.
"""
from __future__ import annotations

import errno
import os
import socket
import stat

from ignisd.preflight import StartupError

# what `stat.S_IFMT` of a non-socket path is called in an error message
_KINDS = ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link"),
          (stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def describe(st: os.stat_result) -> str:
    """What a path's lstat says is there, in words ("a regular file (2 bytes)", "a directory", ...)."""
    for test, name in _KINDS:
        if test(st.st_mode):
            return f"{name} ({st.st_size} bytes)" if name == "a regular file" else name
    return f"a file of type {stat.S_IFMT(st.st_mode):#o}"


def _refused(path: str, what: str) -> StartupError:
    """The start error (exit 2) for socket path `path`: `what` says what is wrong there."""
    return StartupError(f"server.socket {path}: {what}", exit_code=2)


def _prepare_dir(path: str) -> None:
    """Make the socket's directory (and its parents); raise StartupError (exit 2) when a component is not a
    directory, cannot be made, or the directory is not writable."""
    parent = os.path.dirname(os.path.abspath(path))
    probe = parent
    while True:   # the deepest existing ancestor must be a directory
        try:
            st = os.stat(probe)
        except (FileNotFoundError, NotADirectoryError):
            probe = os.path.dirname(probe)
            continue
        except OSError as e:
            raise _refused(path, f"cannot look at {probe}: {e.strerror}") from None
        if not stat.S_ISDIR(st.st_mode):
            raise _refused(path, f"{probe} is {describe(st)}, not a directory; pass a --socket path in a directory")
        break
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as e:
        raise _refused(path, f"cannot make the directory {parent}: {e.strerror}") from None
    if not os.access(parent, os.W_OK | os.X_OK):
        raise _refused(path, f"the directory {parent} is not writable by this user")


def prepare_socket(path: str) -> None:
    """Make `path` ready to bind: its directory exists and is writable, and nothing is at `path` (a stale socket,
    which no daemon answers on, is removed). Raises StartupError: exit_code 1 when a live daemon answers at
    `path`, 2 for anything else that is there or in the way (left untouched)."""
    _prepare_dir(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise _refused(path, f"cannot look at it: {e.strerror}") from None
    if not stat.S_ISSOCK(st.st_mode):
        raise _refused(path, f"{describe(st)} is there, not a socket; it was left as it is: remove it or pass "
                             f"another --socket")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
        except OSError as e:
            if e.errno not in (errno.ECONNREFUSED, errno.ENOENT):
                raise _refused(path, f"a socket is there that cannot be probed ({e.strerror}); it was left as "
                                     f"it is") from None
        else:
            raise StartupError(f"another ignisd is already serving on {path}; stop it or pass --socket")
    try:
        os.unlink(path)   # a stale socket: nobody listens on it
    except FileNotFoundError:
        pass
    except OSError as e:
        raise _refused(path, f"cannot remove the stale socket: {e.strerror}") from None


def socket_gid(group: str | None) -> int | None:
    """The gid of server.socket_group (None when unset). Raises StartupError (exit 2) for an unknown group."""
    if not group:
        return None
    import grp
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise StartupError(f"server.socket_group {group!r}: no such group", exit_code=2) from None


def bind_socket(path: str, mode: int, gid: int | None) -> socket.socket:
    """A listening Unix socket at `path` (prepared by prepare_socket) with permission bits `mode` and group `gid`
    (None: the process's) set before it listens, so no connection is accepted under looser permissions. Raises
    StartupError (exit 2) when it cannot be bound or its mode and group cannot be set."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind(path)
        set_socket_access(path, mode, gid)
        s.listen(socket.SOMAXCONN)
    except OSError as e:
        s.close()
        raise _refused(path, f"cannot listen: {e.strerror}") from None
    return s


def set_socket_access(path: str, mode: int, gid: int | None) -> None:
    """chmod `path` to `mode` and chown it to group `gid` (None: leave the group). Raises OSError."""
    os.chmod(path, mode)
    if gid is not None:
        os.chown(path, -1, gid)
