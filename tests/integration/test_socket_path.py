"""`--socket` naming something that is not a socket: the start stops with exit 2 and one line naming the path and what
is there, and the path is left as it was (only a stale socket is ever removed). The socket is checked before the
model loads, so these starts name a model that does not exist: a start that got past the check fails there instead
(exit 1)."""
import os
import socket
import subprocess
import sys

import pytest


def _serve(sock_path, timeout=60):
    return subprocess.run([sys.executable, "-m", "ignisd", "serve", "--socket", str(sock_path),
                           "--model", "/nonexistent/model.gguf"], check=False, capture_output=True, text=True,
                          timeout=timeout)


def _refused(r, *needles):
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    for n in needles:
        assert n in r.stderr, (n, r.stderr)


def test_regular_file_is_kept(tmp_path):
    f = tmp_path / "f"
    f.write_text("x\n")
    r = _serve(f)
    _refused(r, str(f), "regular file", "not a socket")
    assert f.read_text() == "x\n"


def test_directory_at_the_path(tmp_path):
    d = tmp_path / "sockdir"
    d.mkdir()
    (d / "keep").write_text("k")
    r = _serve(d)
    _refused(r, str(d), "directory")
    assert (d / "keep").read_text() == "k"


def test_parent_is_a_regular_file(tmp_path):
    parent = tmp_path / "notadir"
    parent.write_text("p")
    r = _serve(parent / "sub" / "ignisd.sock")
    _refused(r, str(parent / "sub" / "ignisd.sock"), str(parent), "regular file", "not a directory")
    assert parent.read_text() == "p"


def test_symlink_is_not_followed(tmp_path):
    target = tmp_path / "target"
    target.write_text("t")
    link = tmp_path / "link.sock"
    link.symlink_to(target)
    r = _serve(link)
    _refused(r, str(link), "symbolic link")
    assert link.is_symlink() and target.read_text() == "t"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into any directory")
def test_unwritable_directory(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    try:
        r = _serve(d / "ignisd.sock")
    finally:
        d.chmod(0o700)
    _refused(r, str(d), "not writable")


def test_stale_socket_is_removed_before_the_model_loads(tmp_path):
    """The check still clears a socket nobody listens on; the start then goes on to the (missing) model."""
    p = tmp_path / "stale.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(p))
    s.close()
    r = _serve(p)
    assert r.returncode == 1 and "model.path /nonexistent/model.gguf" in r.stderr, r.stderr
    assert not p.exists()


def test_live_socket_is_refused_and_kept(tmp_path):
    p = tmp_path / "live.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(p))
    s.listen(1)
    try:
        r = _serve(p)
    finally:
        s.close()
    assert r.returncode == 1 and "already serving" in r.stderr and str(p) in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert p.is_socket()
