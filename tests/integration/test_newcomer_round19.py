"""The nineteenth newcomer round's findings, each now refused in one line with the user's
files as they were (or said where the cause is).

* DATA LOSS: RUN/store as a symbolic link: a resume emptied the folder it points to (the
  run's own store is emptied at start) -- refused, the link never followed.
* DATA LOSS: the checkpoints' pruning removed any ``step-*`` folder, a user's
  ``step-00000010.bak`` copy too, and named it to ``--resume-from``: only the names a
  checkpoint takes (``step-`` and 8 or more digits) are a checkpoint's.
* An output inside a disk store (``train --out``, ``synth --out``) was taken, after which the
  store could not be opened: a store's folder is a whole output, like a data set; the store
  itself as ``--store-dir`` stays what it is.
* ``--resume --store-layout frequency`` on a run whose ``--store-dir`` store is in the
  identity layout was ignored while config.json said frequency: refused.
* A store of NaN rows started from (``--init-from-store``) said only "training diverged ...
  lower --lr": the line names the store.
* RUN/store a file: the message named ``--store-dir``, which was not given.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from runs import one_line

pytestmark = pytest.mark.integration

DISK = ("--batch-size", 64, "--no-progress", "--mode", "lookahead", "--store", "disk")


def checkpointed(run_cli, data, out, steps: int, *extra) -> None:
    """A run of this round: ``steps`` steps of batch 64, a checkpoint every 5; it must succeed."""
    rc, _, err = run_cli("train", "--data", data, "--batch-size", 64, "--no-progress", "--steps", steps,
                         "--checkpoint-every", 5, "--out", out, *extra)  # fmt: skip
    assert rc == 0, err


def test_the_runs_own_store_is_never_emptied_through_a_link(run_cli, tiny_data, tmp_path):
    run = tmp_path / "run"
    rc, _, err = run_cli("train", "--data", tiny_data, *DISK, "--steps", 10, "--checkpoint-every", 5, "--out", run)
    assert rc == 0, err
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep\n")
    import shutil

    shutil.rmtree(run / "store")
    (run / "store").symlink_to(mine)
    rc, _, err = run_cli("train", "--data", tiny_data, *DISK, "--steps", 20, "--out", run, "--resume")
    assert one_line(rc, err) == (
        f"{run / 'store'} is a symbolic link (to {mine}): the run's own store folder is emptied when a run starts, "
        "so it is not followed; remove the link (or give the folder as --store-dir)"
    )
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"] and (mine / "notes.txt").read_text() == "keep\n"
    (run / "store").unlink()
    (run / "store").write_text("a file of mine\n")
    rc, _, err = run_cli("train", "--data", tiny_data, *DISK, "--steps", 20, "--out", run, "--resume")
    assert one_line(rc, err).startswith(f"the run's store folder {run / 'store'}: cannot create the store's directory")
    assert (run / "store").read_text() == "a file of mine\n"


def test_a_users_copy_beside_the_checkpoints_is_not_a_checkpoint(run_cli, tiny_data, tmp_path):
    import shutil

    from bagpipe.checkpoint.folder import CheckpointFolder

    run = tmp_path / "run"
    checkpointed(run_cli, tiny_data, run, 10)
    backup = run / "checkpoints" / "step-00000005.bak"
    shutil.copytree(run / "checkpoints" / "step-00000010", backup)
    (run / "checkpoints" / ".tmp-notes").mkdir()  # a hidden folder of the user's, not a staging folder
    checkpointed(run_cli, tiny_data, run, 40, "--resume")  # six more checkpoints written, the older ones pruned
    assert backup.is_dir() and (backup / "MANIFEST.json").is_file() and (run / "checkpoints" / ".tmp-notes").is_dir()
    assert "step-00000005.bak" not in CheckpointFolder(run).complete()


def test_an_output_inside_a_disk_store_is_refused(run_cli, tiny_data, tmp_path):
    store = tmp_path / "st"
    rc, _, err = run_cli(
        "train", "--data", tiny_data, *DISK, "--steps", 5, "--store-dir", store, "--out", tmp_path / "a"
    )
    assert rc == 0, err
    before = sorted(p.name for p in store.iterdir())
    rc, _, err = run_cli(
        "train", "--data", tiny_data, "--batch-size", 64, "--no-progress", "--steps", 2, "--out", store / "run"
    )
    assert one_line(rc, err) == (
        f"--out {store / 'run'} lies inside the disk store {store}: the run's files would be mixed with the disk "
        "store's, and the store could not be opened again; choose a --out outside it"
    )
    rc, _, err = run_cli("synth", "--profile", "tiny", "--samples", 500, "--out", store / "data", "--no-progress")
    assert one_line(rc, err, "synth").startswith(f"--out {store / 'data'} lies inside the disk store {store}")
    assert sorted(p.name for p in store.iterdir()) == before
    # the store itself as --store-dir is what it is for
    rc, _, err = run_cli(
        "train",
        "--data",
        tiny_data,
        *DISK,
        "--steps",
        5,
        "--store-dir",
        store,
        "--init-from-store",
        "--out",
        tmp_path / "b",
    )
    assert rc == 0, err


@pytest.mark.parametrize("made, asked", [("identity", "frequency"), ("frequency", "identity")])
def test_a_resume_asking_for_another_layout_than_its_stores_is_refused(run_cli, tiny_data, tmp_path, made, asked):
    run, store = tmp_path / "run", tmp_path / "st"
    argv = ("train", "--data", tiny_data, *DISK, "--store-dir", store, "--out", run, "--checkpoint-every", 5)
    rc, _, err = run_cli(*argv, "--steps", 10, "--store-layout", made)
    assert rc == 0, err
    rc, _, err = run_cli(*argv, "--steps", 20, "--resume", "--store-layout", asked)
    assert one_line(rc, err) == (
        f"--store-layout {asked}: the store in {store} keeps the layout it was made with ({made}), and a resume "
        f"reuses it; give an empty --store-dir to make one in the {asked} layout, or leave --store-layout out"
    )
    assert json.loads((run / "summary.json").read_text())["steps"] == 10


def test_a_store_of_nan_rows_started_from_is_named(run_cli, tiny_data, tmp_path):
    from bagpipe.data.schema import DatasetMeta
    from bagpipe.store.disk import DiskStore
    from bagpipe.store.init import RowInitializer

    store = tmp_path / "st"
    meta = DatasetMeta.load(tiny_data)
    init = RowInitializer(meta.table_sizes, 8, 0)
    with DiskStore(init, 1, store) as s:
        rows = np.arange(init.num_rows, dtype=np.int64)
        s.write(rows, np.full((len(rows), 8), np.nan, np.float32), np.zeros((len(rows), 1), np.float32))
    rc, _, err = run_cli(
        "train",
        "--data",
        tiny_data,
        *DISK,
        "--steps",
        5,
        "--store-dir",
        store,
        "--init-from-store",
        "--out",
        tmp_path / "r",
    )
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc != 0 and "Traceback" not in err, err
    assert lines[-1].startswith("bagpipe train: error: training diverged at step 1") and lines[-1].endswith(
        f"; the run started from the rows of {store} (--init-from-store): a NaN or infinite value there makes the "
        "first step that uses it diverge"
    ), lines[-1]


def test_predict_takes_one_input(run_cli, tmp_path):
    rc, _, err = run_cli(
        "predict", "--model", tmp_path / "m", "--input", tmp_path / "a.tsv", "--input", tmp_path / "b.tsv"
    )
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and lines[-1].startswith(
        f"bagpipe predict: error: --input given twice ({tmp_path / 'a.tsv'} and {tmp_path / 'b.tsv'}): predict scores "
        "one input; run it once per file, or join them into one stream: cat A B | bagpipe predict ... --input -"
    ), err


def test_a_lost_latest_is_said_with_the_checkpoints_there(run_cli, tiny_data, tmp_path):
    run = tmp_path / "run"
    checkpointed(run_cli, tiny_data, run, 10)
    (run / "checkpoints" / "LATEST").unlink()
    rc, _, err = run_cli("export", "--run", run, "--out", tmp_path / "e")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    latest = run / "checkpoints" / "LATEST"
    assert rc == 2 and lines == [
        f"bagpipe export: error: {latest} is missing, yet 2 complete checkpoint(s) are there (the newest "
        f"step-00000010): restore it with `echo step-00000010 > {latest}`"
    ], err
    assert not (tmp_path / "e").exists()


def test_no_output_inside_another_runs_checkpoints(run_cli, tiny_data, tmp_path):
    """Newcomer round 20 (data loss): train --out, --summary-json, profile --out and predict
    --out inside runA/checkpoints/step-N/ were written there, and runA's next pruning removed
    them with the step folder. A run's checkpoint folder is a whole output now."""
    a = tmp_path / "a"
    checkpointed(run_cli, tiny_data, a, 10)
    step = a / "checkpoints" / "step-00000005"
    for argv, flag, target in (
        (
            ("train", "--data", tiny_data, "--batch-size", 64, "--no-progress", "--steps", 2, "--out"),
            "--out",
            step / "run",
        ),
        (
            (
                "train",
                "--data",
                tiny_data,
                "--batch-size",
                64,
                "--no-progress",
                "--steps",
                2,
                "--out",
                tmp_path / "b",
                "--summary-json",
            ),
            "--summary-json",
            step / "s.json",
        ),
        (
            ("profile", "--data", tiny_data, "--hot-budget-mb", 0.05, "--no-progress", "--out"),
            "--out",
            step / "hot.npz",
        ),
    ):
        rc, _, err = run_cli(*argv, target)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
        assert f"{flag} {target} lies inside the checkpoint {step}" in lines[0], lines[0]
        assert not target.exists()
