"""Safe runs: every mistake a user makes in the first week ends in one clear line (exit
code 2, no traceback) with nothing of the run changed.

* Resuming a finished run says it is complete and changes no file; a larger --steps
  extends it and prints ``resumed from step N``.
* A resume with another seed, batch size, model, recipe, optimizer or data set is
  refused naming the setting and both values, and changes no file.
* One run per run folder: a second run into a folder whose lock is held fails naming
  the holder; a lock left by a dead process does not block; a run that fails at
  start-up leaves no half-made folder (but never removes a folder it did not make).
* Damaged or inconsistent data sets are found when opened or when a block is first
  read: a truncated shard file, ids beyond their table (named: file, samples,
  feature), a meta.json whose table is smaller than its ids; ``bagpipe check`` reports
  per shard; ``bagpipe eval`` on a data set with other tables says so; a table larger
  than its ids is fine.
* A reused ``--store-dir`` is refused unless ``--init-from-store`` (recorded in
  config.json); a store directory that cannot be made is one line; the disk store's
  presence flags reach the disk only after the rows' values (a process killed between
  a write and a flush reopens with the old rows).
* Epochs are visible (a notice per new epoch, ``epochs`` in the summary), and the
  multi-hot cache bound holds in every epoch.
* Distributed roles say what they wait for, give up after --rendezvous-timeout in one
  line, and name a taken port.
* A checkpoint cannot run code when loaded (``weights_only``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from bagpipe.data.schema import FeatureSpec
from bagpipe.data.shards import ShardWriter
from bagpipe.distributed.launch import free_port
from bagpipe.filesums import seal
from bagpipe.train.rundir import RunLock

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]

B = 128
COMMON = ("--batch-size", B, "--no-progress", "--threads", 1)


def files_of(run: Path) -> dict[str, str]:
    """Every file of a run folder and the sha256 of its bytes (the lock file aside: it
    names its latest holder)."""
    return {
        str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


def one_line_error(rc: int, err: str, *fragments: str) -> str:
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for f in fragments:
        assert f in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def finished(tiny_data, tmp_path_factory):
    """A 20-step run with its final checkpoint, made once (tests copy it before touching it)."""
    from bagpipe.cli import main

    out = tmp_path_factory.mktemp("finished") / "run"
    assert main(["train", "--data", tiny_data, "--out", str(out), "--steps", "20", *map(str, COMMON)]) == 0
    return out


@pytest.fixture
def run_copy(finished, tmp_path) -> Path:
    dest = tmp_path / "run"
    shutil.copytree(finished, dest)
    return dest


# --------------------------------------------------------------------------- 1, 2: resume


def test_resume_of_a_finished_run_changes_nothing_and_a_longer_one_extends_it(run_cli, tiny_data, run_copy):
    before = files_of(run_copy)
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", run_copy, "--steps", 20, "--resume", *COMMON)
    one_line_error(rc, err, "is complete", "checkpoint is at step 20", "--steps is 20")
    assert files_of(run_copy) == before
    rc, out, err = run_cli("train", "--data", tiny_data, "--out", run_copy, "--steps", 25, "--resume", *COMMON)
    assert rc == 0, err
    assert "resumed from step 20" in out
    s = json.loads((run_copy / "summary.json").read_text())
    assert s["steps"] == 25 and s["steps_this_run"] == 5


@pytest.mark.parametrize(
    "setting,value,shown",
    [
        ("--seed", 7, "seed was 0, now 7"),
        ("--batch-size", 64, "batch_size was 128, now 64"),
        ("--model", "dcn", "model was 'dlrm', now 'dcn'"),
        # the kaggle recipe brings its D (16) and its rate: the recipe, which the user changed, is named
        ("--recipe", "kaggle", "recipe was 'debug', now 'kaggle'"),
        ("--optimizer", "sgd", "optimizer was 'adagrad', now 'sgd'"),
    ],
)
def test_resume_refuses_a_changed_setting(run_cli, tiny_data, run_copy, setting, value, shown):
    before = files_of(run_copy)
    rc, _, err = run_cli(
        "train", "--data", tiny_data, "--out", run_copy, "--steps", 40, "--resume", *COMMON, setting, value
    )
    one_line_error(rc, err, f"cannot resume {run_copy}", shown)
    assert files_of(run_copy) == before


def test_resume_refuses_another_data_set(run_cli, tiny_data, run_copy, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(tiny_data, other)
    labels = other / "train" / "00000" / "labels.npy"
    arr = np.load(labels)
    np.save(labels, np.concatenate([arr[:-B], arr[-B:][::-1]]))  # same shape, other contents...
    meta = json.loads((other / "meta.json").read_text())
    meta["source"]["seed"] = 99  # ...and provenance
    (other / "meta.json").write_text(json.dumps(seal(meta, "meta_crc32")))
    before = files_of(run_copy)
    rc, _, err = run_cli("train", "--data", other, "--out", run_copy, "--steps", 40, "--resume", *COMMON)
    one_line_error(rc, err, "the data set differs", "fingerprint")
    assert files_of(run_copy) == before
    # eval on it: its tables match, so it is evaluated, with a note that it is another data set
    # (it was silent: newcomer round 7)
    rc, _, err = run_cli("eval", "--run", run_copy, "--data", other)
    assert rc == 0 and f"note: {other} is not the data set {run_copy} was trained on" in err, err
    rc, _, err = run_cli("eval", "--run", run_copy, "--data", tiny_data)
    assert rc == 0 and "note:" not in err
    moved = tmp_path / "moved"  # the same data set elsewhere resumes
    shutil.copytree(tiny_data, moved)
    rc, out, err = run_cli("train", "--data", moved, "--out", run_copy, "--steps", 22, "--resume", *COMMON)
    assert rc == 0 and "resumed from step 20" in out, err


# --------------------------------------------------------------------------- 3: one run per folder


def test_a_held_lock_refuses_a_second_run_naming_the_holder(run_cli, tiny_data, tmp_path):
    out = tmp_path / "busy"
    out.mkdir()
    holder = RunLock(out / ".lock")
    holder.acquire()
    try:
        rc, _, err = run_cli("train", "--data", tiny_data, "--out", out, "--steps", 5, *COMMON)
        one_line_error(rc, err, f"{out} is in use by another run", f"pid {os.getpid()}", "choose another --out")
        assert sorted(p.name for p in out.iterdir()) == [".lock"]  # nothing written
    finally:
        holder.release()
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", out, "--steps", 5, *COMMON)
    assert rc == 0, err


def test_a_lock_left_by_a_dead_process_does_not_block(run_cli, tiny_data, tmp_path):
    out = tmp_path / "stale"
    code = f"from bagpipe.train.rundir import RunLock; import os; from pathlib import Path; p = Path({str(out)!r}); p.mkdir(); RunLock(p / '.lock').acquire(); os._exit(9)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 9  # died holding it
    assert json.loads((out / ".lock").read_text())["pid"] != os.getpid()
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", out, "--steps", 5, *COMMON)
    assert rc == 0, err
    assert json.loads((out / ".lock").read_text())["pid"] == os.getpid()


def test_a_run_failing_at_start_up_leaves_no_folder(run_cli, tiny_data, tmp_path):
    out = tmp_path / "new" / "run"
    rc, _, err = run_cli("train", "--data", tmp_path / "no-such-data", "--out", out, "--steps", 5, *COMMON)
    one_line_error(rc, err, "no such dataset directory")
    assert not out.exists()
    kept = tmp_path / "existing"  # a folder the user made stays, whatever happens
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    rc, _, err = run_cli("train", "--data", tmp_path / "no-such-data", "--out", kept, "--steps", 5, *COMMON)
    assert rc == 2 and (kept / "notes.txt").read_text() == "mine"


# --------------------------------------------------------------------------- 4: damaged data


@pytest.fixture
def data_copy(tiny_data, tmp_path) -> Path:
    dest = tmp_path / "data"
    shutil.copytree(tiny_data, dest)
    return dest


def test_a_truncated_shard_file_is_named_when_the_data_set_opens(run_cli, data_copy, tmp_path):
    for name in ("sparse.npy", "labels.npy"):
        f = data_copy / "train" / "00000" / name
        good = f.read_bytes()
        f.write_bytes(good[: len(good) // 2])
        rc, _, err = run_cli("train", "--data", data_copy, "--out", tmp_path / f"r-{name}", "--steps", 5, *COMMON)
        one_line_error(rc, err, str(f), "truncated", "bagpipe check")
        assert not (tmp_path / f"r-{name}").exists()
        f.write_bytes(good)


def test_ids_beyond_their_table_are_named_by_file_samples_and_feature(run_cli, data_copy, tmp_path):
    f = data_copy / "train" / "00000" / "sparse.npy"
    sparse = np.load(f)
    meta = json.loads((data_copy / "meta.json").read_text())
    sparse[5000, 3] = meta["features"][3]["num_rows"] + 11
    np.save(f, sparse)
    del meta["files"], meta["meta_crc32"]  # as if written so (no sums to tell the changed file): the id checks find it
    meta["format_version"] = 1
    (data_copy / "meta.json").write_text(json.dumps(meta))
    rc, _, err = run_cli("train", "--data", data_copy, "--out", tmp_path / "r", "--steps", 200, *COMMON)
    line = one_line_error(rc, err, str(f), "feature", repr(meta["features"][3]["name"]), "outside its table")
    assert "samples 4096..8191" in line  # the block (block size 4096) that holds sample 5000
    rc, out, err = run_cli("check", data_copy, "--no-progress")
    assert rc == 2 and "train/00000: " in out and "outside its table" in out and "eval/00000: ok" in out
    assert "1 of 2 shards have problems" in err


def test_meta_json_smaller_than_the_ids_and_larger_tables(run_cli, data_copy, tmp_path):
    meta_file = data_copy / "meta.json"
    meta = json.loads(meta_file.read_text())
    big = max(range(len(meta["features"])), key=lambda i: meta["features"][i]["num_rows"])
    meta["features"][big]["num_rows"] //= 2
    meta_file.write_text(json.dumps(seal(meta, "meta_crc32")))  # resealed: the tables' own checks
    rc, _, err = run_cli("train", "--data", data_copy, "--out", tmp_path / "small", "--steps", 50, *COMMON)
    one_line_error(rc, err, "outside its table", repr(meta["features"][big]["name"]))
    meta["features"][big]["num_rows"] *= 4  # a table larger than its ids is fine
    meta_file.write_text(json.dumps(seal(meta, "meta_crc32")))
    rc, _, err = run_cli("train", "--data", data_copy, "--out", tmp_path / "large", "--steps", 50, *COMMON)
    assert rc == 0, err


def test_eval_on_a_data_set_with_other_tables_says_so(run_cli, finished, data_copy):
    meta_file = data_copy / "meta.json"
    meta = json.loads(meta_file.read_text())
    meta["features"][2]["num_rows"] += 5
    meta_file.write_text(json.dumps(seal(meta, "meta_crc32")))
    rc, _, err = run_cli("eval", "--run", finished, "--data", data_copy)
    one_line_error(rc, err, "does not match the tables", f"table 2 ({meta['features'][2]['name']})")


def test_check_passes_a_sound_data_set(run_cli, tiny_data):
    rc, out, _ = run_cli("check", tiny_data, "--no-progress")
    assert rc == 0 and "all 2 shards ok" in out


# --------------------------------------------------------------------------- 5: stores


def test_a_reused_store_dir_needs_init_from_store(run_cli, tiny_data, tmp_path):
    store = tmp_path / "store"
    args = ("--data", tiny_data, "--steps", 10, "--mode", "lookahead", "--store", "disk", "--store-dir", store, *COMMON)
    rc, _, err = run_cli("train", "--out", tmp_path / "a", *args)
    assert rc == 0, err
    rc, _, err = run_cli("train", "--out", tmp_path / "b", *args)
    one_line_error(rc, err, f"--store-dir {store} already holds a store", "--init-from-store")
    assert not (tmp_path / "b").exists()
    rc, _, err = run_cli("train", "--out", tmp_path / "c", *args, "--init-from-store")
    assert rc == 0, err
    assert json.loads((tmp_path / "c" / "config.json").read_text())["train"]["cache"]["init_from_store"] is True
    a = json.loads((tmp_path / "a" / "summary.json").read_text())["params_sha256"]
    c = json.loads((tmp_path / "c" / "summary.json").read_text())["params_sha256"]
    assert a != c  # it really started from the trained rows


@pytest.mark.parametrize(
    "files",
    [
        {"rows.f32": b"the user's rows", "present.u8": b"\x01"},  # a store's names, but no store's header
        {"rows.f32": b"", "present.u8": b"", "layout.i64": b"", ".lock": b""},  # a making stopped before its header
        {"notes.txt": b"mine"},  # anything else
        {"header.json": b'{"mine": 1}', "data.txt": b"x"},  # a header.json that is not a DiskStore's
    ],
    ids=["store-names", "unfinished", "other-file", "foreign-header"],
)
def test_a_store_dir_holding_a_users_files_is_refused_and_left_as_it_was(run_cli, tiny_data, tmp_path, files):
    """--store-dir DIR with the user's rows.f32 (no header.json) had it overwritten, rc 0, and
    a symlinked rows.f32 overwrote the file it named (newcomer round 9)."""
    store = tmp_path / "store"
    store.mkdir()
    for name, data in files.items():
        (store / name).write_bytes(data)
    outside = tmp_path / "elsewhere.bin"
    outside.write_bytes(b"do not touch")
    if "rows.f32" in files:
        (store / "rows.f32").unlink()
        (store / "rows.f32").symlink_to(outside)
    before = files_of(store)
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", tmp_path / "r", "--steps", 4, "--mode", "lookahead",
                         "--store", "disk", "--store-dir", store, *COMMON)  # fmt: skip
    one_line_error(rc, err, f"--store-dir {store} holds files that are not a bagpipe store's", "empty or new directory")
    if ".lock" in files:  # named without the lock, and not counted as "1 more"
        assert "(layout.i64, present.u8, rows.f32: a store's names but no header.json" in err and "more" not in err
    assert files_of(store) == before and outside.read_bytes() == b"do not touch"
    assert ".lock" in files or not (store / ".lock").exists()  # nothing written in the user's folder, its lock included
    assert not (tmp_path / "r").exists()


def test_a_store_dir_that_cannot_be_made_is_one_line(run_cli, tiny_data, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    rc, _, err = run_cli(
        "train",
        "--data",
        tiny_data,
        "--out",
        tmp_path / "r",
        "--steps",
        5,
        "--mode",
        "lookahead",
        "--store",
        "disk",
        "--store-dir",
        blocker / "store",
        *COMMON,
    )
    one_line_error(rc, err, f"--store-dir {blocker / 'store'}: cannot create")


def test_presence_flags_reach_the_disk_after_the_rows(tmp_path):
    """A process that writes rows and dies before flushing leaves present.u8 as it was:
    the rows reopen with their old (initial) values, never half-vouched; after a flush
    they reopen with the written values."""
    code = """
import os, sys, numpy as np
from bagpipe.store.disk import DiskStore
from bagpipe.store.init import RowInitializer
s = DiskStore(RowInitializer([100, 50], 4, 0), 1, sys.argv[1])
rows = np.array([3, 70, 120])
s.write(rows, np.full((3, 4), 7.0, np.float32), np.ones((3, 1), np.float32))
if sys.argv[2] == "flush":
    s.flush()
present = open(os.path.join(sys.argv[1], "present.u8"), "rb").read()
print(sum(present))
os._exit(0)  # no close, no flush: as if killed
"""
    from bagpipe.store.disk import DiskStore
    from bagpipe.store.init import RowInitializer

    init = RowInitializer([100, 50], 4, 0)
    for how, flagged in (("crash", 0), ("flush", 3)):
        path = tmp_path / how
        r = subprocess.run([sys.executable, "-c", code, str(path), how], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert int(r.stdout) == flagged  # present.u8 on disk right after the writes
        with DiskStore(init, 1, path) as s:
            w, st = s.read(np.array([3, 70, 120]))
        if how == "crash":
            np.testing.assert_array_equal(w, init.rows(np.array([3, 70, 120])))
            assert not st.any()
        else:
            assert (w == 7.0).all() and (st == 1.0).all()


# --------------------------------------------------------------------------- 6: epochs


def test_epochs_are_announced_and_counted(run_cli, tiny_data, tmp_path):
    per_epoch = 21_600 // B  # the tiny data set's train split
    rc, out, err = run_cli("train", "--data", tiny_data, "--out", tmp_path / "r", "--steps", per_epoch + 10, *COMMON)
    assert rc == 0, err
    assert f"epoch 2 begins at step {per_epoch + 1}" in out
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["epochs"] == pytest.approx((per_epoch + 10) / per_epoch)


def write_multihot(out: Path) -> None:
    """One multi-hot feature whose bag lengths grow along the file, so that a reshuffle
    can gather the longest bags in one batch that the first epoch never had together."""
    n = 4096
    rng = np.random.default_rng(0)
    lengths = 1 + np.arange(n) // 256  # 1 .. 16
    w = ShardWriter(out, ["d0"], [FeatureSpec("cat", 50), FeatureSpec("seq", 300, multi_hot=True)], rows_per_shard=1024)
    w.append(
        "train",
        rng.integers(0, 2, n).astype(np.float32),
        rng.random((n, 1)),
        rng.integers(0, 50, (n, 1)),
        multihot={"seq": (rng.integers(0, 300, int(lengths.sum())), lengths)},
    )
    w.close()


def test_the_multihot_cache_bound_holds_in_every_epoch(tmp_path, run_cli):
    from bagpipe.data.shards import Dataset
    from bagpipe.data.stream import BatchStream
    from bagpipe.oracle.sizing import lookups_per_batch

    data = tmp_path / "mh"
    write_multihot(data)
    ds = Dataset(data)
    stream = BatchStream(ds, "train", 64, seed=0, block_size=40)  # batches straddle blocks
    bound = lookups_per_batch(ds.meta, stream, 1)
    seen = [int(stream.batch(k).rows.shape[0]) for k in range(stream.batches_per_epoch * 4)]
    first_epoch = max(seen[: stream.batches_per_epoch])
    assert bound == 64 * (1 + 16)  # the 64 longest samples: one one-hot id + 16 ids each
    assert first_epoch < max(seen) <= bound  # a bound read off the first epoch would not hold
    # nocache stages exactly `bound` rows: four epochs train without a capacity error
    rc, _, err = run_cli(
        "train",
        "--data",
        data,
        "--out",
        tmp_path / "r",
        "--batch-size",
        64,
        "--block-size",
        40,
        "--steps",
        stream.batches_per_epoch * 4,
        "--mode",
        "nocache",
        "--no-progress",
        "--threads",
        1,
    )
    assert rc == 0, err


def test_a_too_small_cache_names_a_size_enough_for_the_whole_run(run_cli, tiny_data, tmp_path):
    rc, _, err = run_cli(
        "train",
        "--data",
        tiny_data,
        "--out",
        tmp_path / "small",
        "--steps",
        30,
        "--mode",
        "lookahead",
        "--cache-rows",
        50,
        *COMMON,
    )
    line = one_line_error(rc, err, "cannot hold step 1's", "cache rows are enough for any batch of this run")
    # the batch's unique rows are a floor ("needs at least"), the run's bound a size that is enough
    unique = int(line.split("step 1's ")[1].split(" ")[0].replace(",", ""))
    assert f"; it needs at least {unique:,} (" in line, line
    enough = int(line.split(" (")[1].split(" ")[0].replace(",", ""))
    assert enough >= unique, line
    rc, _, err = run_cli(
        "train",
        "--data",
        tiny_data,
        "--out",
        tmp_path / "enough",
        "--steps",
        300,
        "--mode",
        "lookahead",
        "--cache-rows",
        enough,
        *COMMON,
    )
    assert rc == 0, err


# --------------------------------------------------------------------------- 7: waiting roles


def test_a_server_says_what_it_waits_for_and_gives_up_in_one_line(tmp_path):
    port = free_port()
    t0 = time.monotonic()
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "bagpipe.cli",
            "serve",
            "--rank",
            "1",
            "--trainers",
            "1",
            "--servers",
            "1",
            "--master-port",
            str(port),
            "--rendezvous-timeout",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, BAGPIPE_JOB_SECRET="a secret for this test job only"),
    )
    assert time.monotonic() - t0 < 30
    assert f"waiting for the job's other processes at 127.0.0.1:{port} (up to 3 s)" in r.stdout
    one_line_error(
        r.returncode, r.stderr, "did not all arrive", f"127.0.0.1:{port}", "within 3 s", "--rendezvous-timeout"
    )


def test_a_taken_port_is_one_line(tiny_data, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        env = dict(
            os.environ,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK="0",
            WORLD_SIZE="3",
            BAGPIPE_JOB_SECRET="a secret for this test job only",
        )
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "bagpipe.cli",
                "worker",
                "--data",
                tiny_data,
                "--out",
                str(tmp_path / "j"),
                "--mode",
                "lookahead",
                "--trainers",
                "1",
                "--servers",
                "1",
                "--rendezvous-timeout",
                "5",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
    assert r.returncode == 2
    assert f"port {port} on 127.0.0.1 is taken" in r.stderr.strip().splitlines()[-1]
    assert "Traceback" not in r.stderr


# --------------------------------------------------------------------------- 8: trust


class _Payload:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def test_a_checkpoint_cannot_run_code(run_cli, run_copy, tiny_data, tmp_path, monkeypatch):
    import torch

    monkeypatch.chdir(tmp_path)
    ckpt = run_copy / "checkpoints" / (run_copy / "checkpoints" / "LATEST").read_text().strip()
    dense = torch.load(ckpt / "dense.pt", weights_only=True)
    dense["extra"] = _Payload()
    torch.save(dense, ckpt / "dense.pt")
    rc, _, err = run_cli("eval", "--run", run_copy, "--data", tiny_data)
    one_line_error(rc, err, "dense.pt: damaged checkpoint file")  # the manifest's checksum refuses it first
    # whoever can write dense.pt can write the manifest too: with its checksum made to match,
    # loading the file still runs none of its code (weights only)
    manifest = json.loads((ckpt / "MANIFEST.json").read_text())
    data = (ckpt / "dense.pt").read_bytes()
    manifest["dense_sum"] = {"bytes": len(data), "crc32": f"{zlib.crc32(data):08x}"}
    (ckpt / "MANIFEST.json").write_text(json.dumps(seal(manifest, "manifest_crc32")))
    rc, _, err = run_cli("eval", "--run", run_copy, "--data", tiny_data)
    one_line_error(rc, err, "dense.pt: unreadable")
    assert not (tmp_path / "PWNED").exists()
