"""prepare_socket: only a stale socket is removed; anything else at the path or in its way is a StartupError
(exit 2) naming the path and what is there, and is left untouched; a live listener is refused (exit 1)."""
from __future__ import annotations

import os
import socket

import pytest

from ignisd.preflight import StartupError
from ignisd.unix_socket import prepare_socket, socket_gid


def _refused(path, *needles, exit_code=2):
    with pytest.raises(StartupError) as e:
        prepare_socket(str(path))
    assert e.value.exit_code == exit_code
    for n in needles:
        assert n in str(e.value), str(e.value)


def test_missing_directories_are_made(tmp_path):
    p = tmp_path / "a" / "b" / "ignisd.sock"
    prepare_socket(str(p))
    assert p.parent.is_dir() and not p.exists()


def test_regular_file_is_refused_and_kept(tmp_path):
    f = tmp_path / "f"
    f.write_text("x\n")
    _refused(f, str(f), "a regular file (2 bytes)", "not a socket")
    assert f.read_text() == "x\n"


def test_directory_is_refused(tmp_path):
    _refused(tmp_path, str(tmp_path), "a directory")
    assert tmp_path.is_dir()


def test_parent_that_is_a_file_is_refused(tmp_path):
    parent = tmp_path / "p"
    parent.write_text("")
    _refused(parent / "ignisd.sock", f"{parent} is a regular file", "not a directory")
    _refused(parent / "deeper" / "ignisd.sock", f"{parent} is a regular file")
    assert parent.is_file()


def test_fifo_and_symlink_are_refused(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    _refused(fifo, "a named pipe")
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere")
    _refused(link, "a symbolic link")
    assert link.is_symlink()


def test_unwritable_directory_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    _refused(tmp_path / "s.sock", str(tmp_path), "not writable")


def test_stale_socket_is_removed(tmp_path):
    p = tmp_path / "s.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(p))
    s.close()
    prepare_socket(str(p))
    assert not p.exists()


def test_live_socket_is_refused_with_exit_1(tmp_path):
    p = tmp_path / "s.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(p))
    s.listen(1)
    try:
        _refused(p, "already serving", str(p), exit_code=1)
    finally:
        s.close()
    assert p.is_socket()


def test_socket_group():
    assert socket_gid(None) is None and socket_gid("root") == 0
    with pytest.raises(StartupError) as e:
        socket_gid("no-such-group-xyz")
    assert e.value.exit_code == 2 and "server.socket_group" in str(e.value)
