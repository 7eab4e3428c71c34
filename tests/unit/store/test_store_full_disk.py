"""A disk store whose file system fills up mid-run fails in one line, never with SIGBUS.

The store's files are sparse and rows go in through a shared memory map, where a write
into a hole on a full file system kills the process (SIGBUS, exit 135, no message). On a
real full file system (a small tmpfs, ``small_disk``; skipped without root) this proves:
writing rows never written before raises :class:`~bagpipe.store.disk.StoreFullError`
naming ``rows.f32`` (their blocks are allocated before the map is written); the rows
written before are kept -- they read back bit for bit after a flush, and after the store
is reopened -- and a full present.u8 is the same one line naming that file. The store
runs in a child process, so a regression is a failed test, not a dead test session.
Also: the preflight bound of the store's blocks (``store_bytes``) is never more than its
whole files and grows with the writes.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from bagpipe.train.space import store_bytes

pytestmark = pytest.mark.unit

CHILD = r"""
import sys
import numpy as np
from bagpipe.store.disk import DiskStore, StoreFullError
from bagpipe.store.init import RowInitializer

path = sys.argv[1]
init = RowInitializer([200_000], 8, seed=3)
rng = np.random.default_rng(0)
store = DiskStore(init, 1, path, threads=1)
kept = {}
try:
    for k in range(10_000):  # rows 120 apart: a page each
        rows = np.array([k * 120 * 2, k * 120 * 2 + 120], dtype=np.int64)
        w = rng.standard_normal((2, 8)).astype(np.float32)
        store.write(rows, w, np.ones((2, 1), np.float32))
        kept.update(zip(rows.tolist(), w))
        if k % 4 == 3:
            store.flush()
except StoreFullError as e:
    print("ERROR", e)
got, _ = store.read(np.array(sorted(kept), dtype=np.int64))
store.close()
again = DiskStore(init, 1, path, create=False, threads=1)
got2, _ = again.read(np.array(sorted(kept), dtype=np.int64))
want = np.stack([kept[r] for r in sorted(kept)])
stored = again.written_rows().tolist()
again.close()
print("KEPT", len(kept), bool(np.array_equal(got, want)), len(stored))
"""


def test_a_store_that_fills_its_disk_says_so_in_one_line_and_keeps_its_rows(tmp_path, small_disk):
    where = small_disk(tmp_path / "disk", "96k")
    proc = subprocess.run([sys.executable, "-c", CHILD, str(where / "st")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])  # -7: SIGBUS
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("ERROR cannot write the disk store's "), lines
    assert lines[0].endswith(
        " (No space left on device): free space on its disk or give another --store-dir; "
        "the rows already stored and the run's checkpoints are intact"
    ), lines
    assert any(f"{where / 'st'}/{name}" in lines[0] for name in ("rows.f32", "present.u8")), lines
    kept, equal, stored = lines[1].split()[1:]
    # every row written before the failure reads back; those flushed are stored for good
    assert int(kept) > 0 and equal == "True" and 0 < int(stored) <= int(kept), lines


def test_the_preflight_bound_of_a_store_is_its_writes_pages_at_most_its_files():
    page = 4096
    whole = store_bytes(1000, 36, 10**9)
    assert whole == -(-36_000 // page) * page + page + page  # rows.f32 + present.u8 + header
    assert store_bytes(10**9, 36, 100) == 100 * 2 * page + 100 * page + page  # 2 pages a row at most
    assert store_bytes(10**9, 36, 100) < store_bytes(10**9, 36, 200)
