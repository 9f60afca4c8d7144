"""Fixtures of the unit tests: ``io_mode``, each way KV-disk files are read and written (cache/disk_io.py)."""
from __future__ import annotations

import os

import pytest

from ignisd.cache import disk_direct


@pytest.fixture(params=["direct", "buffered"])
def io_mode(request, monkeypatch, tmp_path) -> str:
    """Each KV-disk I/O mode: "direct" (O_DIRECT; skipped, saying why, where tmp_path's filesystem refuses it) and
    "buffered" (IGNIS_KV_DISK_DIRECT=0: through the page cache)."""
    if request.param == "buffered":
        monkeypatch.setenv(disk_direct.DIRECT_ENV, "0")
    else:
        monkeypatch.delenv(disk_direct.DIRECT_ENV, raising=False)
        probe = tmp_path / ".direct-probe"
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            disk_direct.set_direct(fd)
        except OSError as e:
            pytest.skip(f"the filesystem of {tmp_path} refuses O_DIRECT ({e.strerror})")
        finally:
            os.close(fd)
            probe.unlink()
    return request.param
