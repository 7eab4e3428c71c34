"""Writers never put a temporary file and a rename under /dev or /proc (as root that
replaced /dev/null and /dev/stdout with regular files: newcomer round 8), and this
process's own stdout/stderr is written through its open stream."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from bagpipe.files import atomic_file, atomic_write_bytes, is_standard_stream, written_directly

pytestmark = pytest.mark.unit


def test_dev_null_stays_a_device_whichever_writer_writes_it():
    atomic_write_bytes("/dev/null", b"gone\n")
    with atomic_file("/dev/null", "wb") as f:
        f.write(b"gone\n")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert not any(p.name.startswith(".null.tmp-") for p in Path("/dev").iterdir())


def test_standard_streams_are_written_through_their_open_stream(capfd):
    assert is_standard_stream("/dev/stdout") and is_standard_stream("/dev/fd/2")
    assert is_standard_stream("/proc/self/fd/1") and not is_standard_stream("/dev/null")
    atomic_write_bytes("/dev/stdout", b"out\n")
    with atomic_file("/dev/stderr") as f:
        f.write("err\n")
    out, err = capfd.readouterr()
    assert out == "out\n" and err == "err\n"
    assert os.path.islink("/dev/stdout") or not os.path.isfile("/dev/stdout")


def test_an_ordinary_path_is_not_written_directly(tmp_path):
    assert written_directly(tmp_path / "x.json", "w") is None
