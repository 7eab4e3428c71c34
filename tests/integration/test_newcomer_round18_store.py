"""The eighteenth newcomer round's findings about disk stores, their row layout and
``--tensorboard``, each refused in one line (the user's store as it was) or now accepted.

* DATA LOSS: ``--resume --store-dir X`` overwrote the rows of whatever store X held (another
  run's, a user's): a resume takes only the store its run kept, an empty folder or none.
* A ``layout.i64`` damaged into a negative or repeated row was a traceback (the rows were
  built before the CRC was checked); header damage named the wrong thing ("without its
  layout" for a missing crc32, "expected -8 bytes", a version-2 header with a layout
  blamed on rows.f32); a truncated header.json said the folder "holds no store" and told a
  resume about ``--init-from-store``.
* ``store_layout`` could not change on a resume (the layout does not change the model).
* A stopped run that made its store in ``--store-dir`` said "remove it (rm -r RUN)", and the
  rerun was refused for the store left there: the line names the store too.
* ``bagpipe plan`` took ``--store-dir`` values train refuses at once.
* ``--tensorboard`` inside a user's disk store was taken (the store then could not be
  opened), a folder with another run's event files merged the two runs' curves, and a
  dangling link was called "a file".
"""

from __future__ import annotations

import hashlib
import json
import zlib
from pathlib import Path

import numpy as np
import pytest
from runs import one_line

pytestmark = pytest.mark.integration

RUN = ("--batch-size", 64, "--no-progress", "--mode", "lookahead", "--store", "disk")


def digest(folder: Path) -> dict:
    """The store's files (its lock file holds the last opener's pid: not the store's data)."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name != ".lock"
    }


@pytest.fixture
def stores(run_cli, tiny_data, tmp_path):
    """A frequency-layout store of a finished run (tmp/st/A) and a run with checkpoints (tmp/M)."""
    rc, _, err = run_cli(
        "train", "--data", tiny_data, *RUN, "--steps", 10, "--store-dir", tmp_path / "st" / "A",
        "--store-layout", "frequency", "--out", tmp_path / "A",
    )  # fmt: skip
    assert rc == 0, err
    rc, _, err = run_cli(
        "train", "--data", tiny_data, *RUN, "--steps", 10, "--checkpoint-every", 5, "--out", tmp_path / "M"
    )
    assert rc == 0, err
    return tmp_path / "st" / "A"


def test_a_resume_does_not_take_another_runs_store(run_cli, tiny_data, tmp_path, stores):
    before = digest(stores)
    rc, _, err = run_cli(
        "train", "--data", tiny_data, *RUN, "--steps", 20, "--store-dir", stores, "--out", tmp_path / "M", "--resume"
    )
    assert one_line(rc, err) == (
        f"--store-dir {stores} already holds a store, not the one {tmp_path / 'M'} kept its rows in "
        f"({tmp_path / 'M' / 'store'}): a resume overwrites a store's rows with the checkpoint's; give an empty "
        "directory, the run's own store, or leave --store-dir out"
    )
    assert digest(stores) == before
    # plan says the same before anything
    rc, _, err = run_cli(
        "plan", "--data", tiny_data, *RUN, "--steps", 20, "--store-dir", stores, "--out", tmp_path / "M", "--resume"
    )
    assert one_line(rc, err, "plan").startswith(f"--store-dir {stores} already holds a store, not the one")
    # an empty --store-dir: the resume makes its store there (not "--init-from-store: holds no store")
    rc, _, err = run_cli(
        "train",
        "--data",
        tiny_data,
        *RUN,
        "--steps",
        20,
        "--store-dir",
        tmp_path / "new",
        "--out",
        tmp_path / "M",
        "--resume",
    )
    assert rc == 0, err
    # the store layout may change on a resume (the model does not): here to full, no store at all
    rc, _, err = run_cli(
        "train",
        "--data",
        tiny_data,
        "--batch-size",
        64,
        "--no-progress",
        "--steps",
        30,
        "--out",
        tmp_path / "A",
        "--resume",
    )
    assert rc == 0, err


def rewrite(path: Path, edit) -> None:
    h = json.loads((path / "header.json").read_text())
    edit(h)
    (path / "header.json").write_text(json.dumps(h))


@pytest.mark.parametrize(
    "damage, said",
    [
        (
            lambda h: h["layout"].pop("crc32"),
            "header.json: layout.crc32 is None, not 8 hex digits: the header is damaged",
        ),
        (
            lambda h: h["layout"].update(packed_rows="x"),
            "header.json: layout.packed_rows is 'x', not a count of rows in [1, num_rows]: the header is damaged",
        ),
        (
            lambda h: h["layout"].update(packed_rows=-1),
            "header.json: layout.packed_rows is -1, not a count of rows in [1, num_rows]: the header is damaged",
        ),
        (
            lambda h: h.update(version=2),
            "header.json: a version-2 DiskStore header with a layout: the header is damaged",
        ),
    ],
    ids=["no-crc", "count-text", "count-negative", "version-2"],
)
def test_a_damaged_header_names_what_is_wrong(run_cli, tiny_data, tmp_path, stores, damage, said):
    rewrite(stores, damage)
    before = digest(stores)
    argv = (
        "--data",
        tiny_data,
        *RUN,
        "--steps",
        5,
        "--store-dir",
        stores,
        "--init-from-store",
        "--out",
        tmp_path / "B",
    )
    rc, _, err = run_cli("train", *argv)
    assert one_line(rc, err) == f"{stores / said}"
    rc, _, err = run_cli("plan", *argv)
    assert one_line(rc, err, "plan") == f"{stores / said}"
    assert digest(stores) == before


def test_a_layout_damaged_into_bad_rows_is_one_line(run_cli, tiny_data, tmp_path, stores):
    f = stores / "layout.i64"
    rows = np.fromfile(f, dtype="<i8")
    for bad, why in ((np.concatenate([rows[1:2], rows[1:]]), "packed rows must be unique"), (-rows, "is negative")):
        raw = bad.astype("<i8").tobytes()
        f.write_bytes(raw)  # with a CRC in the header that matches: only the rows are wrong
        crc = f"{zlib.crc32(raw) & 0xFFFFFFFF:08x}"
        rewrite(stores, lambda h, crc=crc: h["layout"].update(crc32=crc))
        rc, _, err = run_cli(
            "train",
            "--data",
            tiny_data,
            *RUN,
            "--steps",
            5,
            "--store-dir",
            stores,
            "--init-from-store",
            "--out",
            tmp_path / "B",
        )
        line = one_line(rc, err)
        assert line.startswith(f"{f}: ") and why in line and line.endswith("the file is damaged"), line
    f.write_bytes(rows[::-1].astype("<i8").tobytes())  # bytes changed, the header's CRC not
    rc, _, err = run_cli(
        "train",
        "--data",
        tiny_data,
        *RUN,
        "--steps",
        5,
        "--store-dir",
        stores,
        "--init-from-store",
        "--out",
        tmp_path / "B",
    )
    assert "its CRC-32 is" in one_line(rc, err)


def test_a_truncated_header_is_named(run_cli, tiny_data, tmp_path, stores):
    (stores / "header.json").write_text((stores / "header.json").read_text()[:40])
    for extra in (("--init-from-store",), ()):
        rc, _, err = run_cli(
            "train", "--data", tiny_data, *RUN, "--steps", 5, "--store-dir", stores, *extra, "--out", tmp_path / "B"
        )
        line = one_line(rc, err)
        assert (
            line.startswith(f"{stores / 'header.json'}: the store's header is damaged (")
            and "--init-from-store" not in line
        )


def test_a_stopped_run_names_the_store_it_made(tmp_path):
    from bagpipe.checkpoint.folder import where_to_continue
    from bagpipe.store.disk import DiskStore
    from bagpipe.store.init import RowInitializer

    run, store = tmp_path / "run", tmp_path / "st"
    run.mkdir()
    DiskStore(RowInitializer([10, 5], 4, 0), 1, store).close()
    for started_from, said in ((False, f" and the store it made (rm -r {store})"), (True, "")):
        cache = {"store_dir": str(store), "init_from_store": started_from}
        (run / "config.json").write_text(json.dumps({"train": {"cache": cache}}))
        assert where_to_continue(str(run)) == (
            f"{run} has no checkpoint: to start over, remove it (rm -r {run}){said} and run the command again, or "
            "give another --out"
        )


def test_plan_refuses_the_store_dirs_train_refuses(run_cli, tiny_data, tmp_path, stores):
    user = tmp_path / "user"
    user.mkdir()
    (user / "notes.txt").write_text("mine\n")
    plan = ("plan", "--data", tiny_data, *RUN, "--steps", 5, "--out", tmp_path / "P")
    for extra, said in (
        (("--store-dir", stores), f"--store-dir {stores} already holds a store"),
        (("--store-dir", user), f"--store-dir {user} holds files that are not a bagpipe store's (notes.txt)"),
        (
            ("--store-dir", tmp_path / "none", "--init-from-store"),
            f"--init-from-store: {tmp_path / 'none'} holds no store to start from",
        ),
    ):
        rc, _, err = run_cli(*plan, *extra)
        assert one_line(rc, err, "plan").startswith(said)


def test_tensorboard_refuses_a_store_another_runs_events_and_a_dangling_link(run_cli, tiny_data, tmp_path, stores):
    out = tmp_path / "T"
    base = ("train", "--data", tiny_data, "--batch-size", 64, "--no-progress", "--steps", 2, "--out", out)
    rc, _, err = run_cli(*base, "--tensorboard", stores / "tb")
    assert one_line(rc, err) == (
        f"--tensorboard {stores / 'tb'} lies inside the disk store {stores}: the event files would be mixed with "
        "the disk store's, and the store could not be opened again; choose a --tensorboard outside it"
    )
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "events.out.tfevents.1.host.1.0").write_bytes(b"")  # another run's
    rc, _, err = run_cli(*base, "--tensorboard", logs)
    assert one_line(rc, err) == (
        f"--tensorboard {logs} already holds the event files of another run (events.out.tfevents.1.host.1.0): "
        "TensorBoard shows one folder's event files as one run, so the curves of both would be drawn as one; give "
        f"each run a folder of its own (e.g. --tensorboard {logs / 'T'})"
    )
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    rc, _, err = run_cli(*base, "--tensorboard", tmp_path / "link")
    assert one_line(rc, err) == (
        f"--tensorboard {tmp_path / 'link'}: {tmp_path / 'link'} is a symbolic link to {tmp_path / 'nowhere'}, which "
        f"does not exist; create that folder or give another --tensorboard (e.g. --tensorboard {out / 'tb'})"
    )
    assert not out.exists() and not (stores / "tb").exists()
