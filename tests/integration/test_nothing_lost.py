"""Nothing a user owns is ever lost or silently wrong (issue 24): one test per defect kind
a new user found, and the systematic guard on folders.

What this proves:

* **Folders (the guard).** Every command that writes a folder (``synth``,
  ``preprocess``, ``export``, ``train``) leaves foreign files in it untouched: a folder
  holding notes, a sub-folder or a raw log is never written into, ``--overwrite``
  replaces only the files the output's manifest lists (and refuses, naming the first
  other file, when anything else is there or an input lies inside); and when the
  command fails midway (Ctrl-C injected while it writes), the previous contents are
  byte for byte as they were and nothing is left beside them. The same for the commands
  that write one file (``predict``, ``profile``, ``plot``).
* **Silent wrong results.** A store directory in use by another run is refused naming
  the holder (its lock is held while the store is open); a NaN dense value or a label
  other than 0/1 stops ``train`` naming the file and samples; options that do not apply
  to the mode, store, topology or schedule are refused naming the option; a step whose
  loss or gradient is not finite stops training naming the step, and the checkpoints
  before it stay (the run resumes from the last good one).
* **Deleted.** ``predict --out`` equal to ``--input`` (or inside ``--model``) is refused.
* **Tracebacks.** ``eval`` on data of another shape, a damaged export (missing dense file,
  truncated table, broken model.json, vocabulary missing though listed: blamed on the
  export, not the data set) in ``predict`` and ``bagpipe.load``, ``--out`` in a folder
  that does not exist or onto a folder, ``plot --out DIR``: one line each.
* **Hangs and misleading messages.** A role meeting a port held by something that is
  not a bagpipe job gives up after ``--rendezvous-timeout`` (plus a grace of seconds)
  naming it; an unresolvable master host is named as such; a distributed ``--resume``
  the run cannot continue is refused by the launcher with the reason before any role
  starts (a role's own refusal reaching the launcher: ``tests/distributed/test_jobs.py``).
* **Folder state after a refusal.** A start-up refusal (a cache too small for the first
  batch, TensorBoard missing) leaves no run folder; a refused resume leaves config.json,
  metrics.jsonl and every other file as they were.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import json
import os
import shutil
import socket
import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]

B = 64
COMMON = ("--batch-size", B, "--no-progress", "--threads", 1)


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (lock files aside: they name their last holder) and the sha256 of its bytes."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


def one_line(rc: int, err: str, *fragments: str) -> str:
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
    for f in fragments:
        assert f in lines[0], lines[0]
    return lines[0]


def beside(folder: Path) -> list[str]:
    """What bagpipe left next to ``folder`` (staging folders, lock files)."""
    return sorted(p.name for p in folder.parent.glob(f".{folder.name}.*"))


@pytest.fixture(scope="module")
def finished(tiny_data, tmp_path_factory):
    """A 12-step run with its final checkpoint, and its export (tests copy them before touching them)."""
    from bagpipe.cli import main

    root = tmp_path_factory.mktemp("lost")
    run = root / "run"
    assert main(["train", "--data", tiny_data, "--out", str(run), "--steps", "12", *map(str, COMMON)]) == 0
    assert main(["export", "--run", str(run), "--out", str(root / "export")]) == 0
    return run, root / "export"


@pytest.fixture(scope="module")
def raw_criteo(tmp_path_factory) -> Path:
    """A raw Criteo file of 400 lines."""
    rng = np.random.default_rng(3)
    path = tmp_path_factory.mktemp("raw") / "day.tsv"
    lines = [
        "\t".join(
            [str(rng.integers(0, 2))]
            + [str(v) for v in rng.integers(0, 50, 13)]
            + [format(int(v), "x") for v in rng.integers(0, 300, 26)]
        )
        for _ in range(400)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


class Interrupt:
    """Replace ``owner.name`` (``owner`` an object, or a module's dotted path) with a
    wrapper that raises KeyboardInterrupt (Ctrl-C) on its ``at``-th call."""

    def __init__(self, monkeypatch, owner, name: str, at: int = 2):
        if isinstance(owner, str):
            owner = importlib.import_module(owner)
        real = owner[name] if isinstance(owner, dict) else getattr(owner, name)
        self.calls = 0

        def wrapper(*a, **k):
            self.calls += 1
            if self.calls == at:
                raise KeyboardInterrupt
            return real(*a, **k)

        if isinstance(owner, dict):
            monkeypatch.setitem(owner, name, wrapper)
        else:
            monkeypatch.setattr(owner, name, wrapper)


@pytest.fixture(autouse=True)
def role_environment(monkeypatch):
    """``bagpipe serve`` run in this process sets the rendezvous variables: restore them after each test."""
    for var in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "GLOO_SOCKET_IFNAME"):
        monkeypatch.delenv(var, raising=False)


# =========================================================================== the folder guard


def folder_commands(tiny_data, raw: Path, run: Path):
    """name -> (argv writing into OUT, the file that marks a finished output, where to interrupt it)."""
    return {
        "synth": (
            lambda out: ["synth", "--profile", "tiny", "--samples", 4000, "--out", out, "--no-progress"],
            "meta.json",
            ("bagpipe.data.shards", "ShardWriter", "_flush"),
        ),
        "preprocess": (
            lambda out: [
                "preprocess",
                "criteo",
                "--input",
                raw,
                "--out",
                out,
                "--max-rows-per-table",
                50,
                "--rows-per-shard",
                100,
                "--no-progress",
            ],
            "meta.json",
            ("bagpipe.data.shards", "ShardWriter", "_flush"),
        ),
        "export": (
            lambda out: ["export", "--run", run, "--out", out, "--shard-mb", 0.01],
            "model.json",
            ("bagpipe.export.tensorfile", None, "write"),
        ),
    }


@pytest.mark.parametrize("command", ["synth", "preprocess", "export"])
def test_a_whole_output_never_touches_what_is_not_its_own(
    run_cli, tiny_data, raw_criteo, finished, tmp_path, monkeypatch, command
):
    argv, done, where = folder_commands(tiny_data, raw_criteo, finished[0])[command]
    out = tmp_path / "out"
    # 1. a folder of someone else's files is never written into, --overwrite or not
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "sub").mkdir()
    (out / "sub" / "keep.bin").write_bytes(b"\x00\x01")
    mine = snapshot(out)
    for extra in ((), ("--overwrite",)):
        rc, _, err = run_cli(*argv(out), *extra)
        one_line(rc, err, "not empty and holds no")
        assert snapshot(out) == mine and beside(out) == []
    shutil.rmtree(out)
    # 2. a finished output; a second one is refused without --overwrite and replaces it with
    rc, _, err = run_cli(*argv(out))
    assert rc == 0, err
    first = snapshot(out)
    assert done in first and ".bagpipe-files.json" in first
    one_line(*run_cli(*argv(out))[::2], "already holds", "--overwrite")
    assert snapshot(out) == first
    # 3. interrupted midway while replacing it: the previous output is whole, nothing is left beside
    module, cls, name = where
    with monkeypatch.context() as m:
        owner = importlib.import_module(module)
        Interrupt(m, getattr(owner, cls) if cls else owner, name)
        rc, _, err = run_cli(*argv(out), "--overwrite")
    assert rc == 130 and "interrupted" in err
    assert snapshot(out) == first and beside(out) == []
    # 4. a foreign file inside a finished output: --overwrite refuses naming it and changes nothing
    (out / "notes.txt").write_text("mine")
    (out / "runs" / "b").mkdir(parents=True)
    (out / "runs" / "a.txt").write_text("mine")
    (out / "runs" / "b" / "c.txt").write_text("mine")
    before = snapshot(out)
    line = one_line(*run_cli(*argv(out), "--overwrite")[::2], "--overwrite replaces only what bagpipe wrote")
    assert "and notes.txt and runs/ (2 files) are not part of the" in line  # the outermost, counted
    assert snapshot(out) == before
    # 5. only its own files: replaced whole
    (out / "notes.txt").unlink()
    shutil.rmtree(out / "runs")
    rc, _, err = run_cli(*argv(out), "--overwrite")
    assert rc == 0, err
    assert beside(out) == [] and done in snapshot(out)


def test_overwrite_refuses_when_an_input_lies_inside_the_output(run_cli, raw_criteo, tmp_path):
    out = tmp_path / "data"
    rc, _, err = run_cli(
        "preprocess", "criteo", "--input", raw_criteo, "--out", out, "--max-rows-per-table", 50, "--no-progress"
    )
    assert rc == 0, err
    inside = out / "raw.tsv"  # the raw log kept next to its dataset
    shutil.copy(raw_criteo, inside)
    before = snapshot(out)
    one_line(
        *run_cli(
            "preprocess",
            "criteo",
            "--input",
            inside,
            "--out",
            out,
            "--max-rows-per-table",
            50,
            "--overwrite",
            "--no-progress",
        )[::2],
        f"--input {inside} lies inside --out {out}",
    )
    assert snapshot(out) == before


def test_train_leaves_foreign_files_alone_and_a_refused_resume_changes_nothing(
    run_cli, tiny_data, finished, tmp_path, monkeypatch
):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    # a new run into a folder of one's own files is refused before anything is written there
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", out, "--steps", 8, *COMMON)
    assert rc == 2 and "is not empty and is not a bagpipe run folder (it holds notes.txt)" in err, err
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"] and (out / "notes.txt").read_text() == "mine"
    run = tmp_path / "run"
    shutil.copytree(finished[0], run)
    before = snapshot(run)
    # refused at the first step (a cache too small for a batch, with --mode that may change on resume)
    one_line(
        *run_cli(
            "train",
            "--data",
            tiny_data,
            "--out",
            run,
            "--steps",
            20,
            "--resume",
            *COMMON,
            "--mode",
            "lookahead",
            "--cache-rows",
            40,
        )[::2],
        "cannot hold",
    )
    assert snapshot(run) == before  # config.json, metrics.jsonl, checkpoints: as they were


def test_start_up_refusals_leave_no_run_folder(run_cli, tiny_data, tmp_path):
    out = tmp_path / "new"
    one_line(
        *run_cli(
            "train", "--data", tiny_data, "--out", out, "--steps", 5, *COMMON, "--mode", "lookahead", "--cache-rows", 40
        )[::2],
        "cannot hold",
    )
    assert not out.exists()
    if importlib.util.find_spec("tensorboard") is None:
        one_line(
            *run_cli(
                "train", "--data", tiny_data, "--out", out, "--steps", 5, *COMMON, "--tensorboard", tmp_path / "tb"
            )[::2],
            "--tensorboard needs the tensorboard package",
        )
        assert not out.exists()


def test_one_file_outputs_appear_whole_and_never_replace_an_input(
    run_cli, tiny_data, finished, raw_criteo, tmp_path, monkeypatch
):
    run, export = finished
    # predict's output is never its input, nor inside the model
    raw = tmp_path / "raw.tsv"
    shutil.copy(raw_criteo, raw)
    kept = raw.read_bytes()
    for out in (raw, export / "p.txt"):
        one_line(*run_cli("predict", "--model", export, "--input", raw, "--out", out)[::2], "would destroy an input")
    assert raw.read_bytes() == kept and snapshot(export) == snapshot(finished[1])
    # --out in a folder that does not exist, or onto a folder: one line, for each one-file command
    for argv in (
        ["predict", "--model", export, "--input", raw],
        ["profile", "--data", tiny_data, "--hot-budget-mb", 0.01],
        ["plot", run],
    ):
        one_line(*run_cli(*argv, "--out", tmp_path)[::2], "is a directory")
        if argv[0] != "plot":  # plot makes the folder of its PNG
            one_line(*run_cli(*argv, "--out", tmp_path / "nowhere" / "f")[::2], "does not exist")
    # plot writes exactly the file it names, which appears whole; an interrupted plot leaves the old one
    png = tmp_path / "curves"
    rc, out, err = run_cli("plot", run, "--out", png)
    assert rc == 0 and f"wrote {png}\n" == out and png.read_bytes()[:4] == b"\x89PNG", err
    old = png.read_bytes()
    from matplotlib.figure import Figure

    with monkeypatch.context() as m:
        Interrupt(m, Figure, "savefig", at=1)
        rc, _, _ = run_cli("plot", run, "--out", png)
    assert rc == 130 and png.read_bytes() == old and [p.name for p in tmp_path.glob(".curves*")] == []
    # profile's file the same
    hot = tmp_path / "hot.npz"
    assert run_cli("profile", "--data", tiny_data, "--hot-budget-mb", 0.01, "--out", hot, "--no-progress")[0] == 0
    old = hot.read_bytes()
    with monkeypatch.context() as m:
        Interrupt(m, "bagpipe.accel.profile", "atomic_write_bytes", at=1)
        rc, _, _ = run_cli("profile", "--data", tiny_data, "--hot-budget-mb", 0.02, "--out", hot, "--no-progress")
    assert rc == 130 and hot.read_bytes() == old


# =========================================================================== silent wrong results


def test_a_store_directory_in_use_is_refused_naming_its_holder(run_cli, tiny_data, tmp_path):
    from bagpipe.store import open_store
    from bagpipe.store.init import RowInitializer

    store = tmp_path / "store"
    args = ("--data", tiny_data, "--steps", 5, "--mode", "lookahead", "--store", "disk", "--store-dir", store, *COMMON)
    rc, _, err = run_cli("train", "--out", tmp_path / "a", *args)
    assert rc == 0, err
    rows = (store / "rows.f32").read_bytes()
    from bagpipe.data.shards import Dataset

    held = open_store(
        "disk", RowInitializer(Dataset(tiny_data).meta.table_sizes, 8, 0), 1, store, owned=False, reuse=True
    )
    try:  # another run trains on it: a second run may not write the same rows
        one_line(
            *run_cli("train", "--out", tmp_path / "b", *args, "--init-from-store")[::2],
            f"--store-dir {store} is in use by another run",
            f"pid {os.getpid()}",
        )
        assert not (tmp_path / "b").exists() and (store / "rows.f32").read_bytes() == rows
    finally:
        held.close()
    rc, _, err = run_cli("train", "--out", tmp_path / "b", *args, "--init-from-store")  # free again
    assert rc == 0, err


@pytest.mark.parametrize(
    "damage,fragment",
    [
        ("dense", "dense.npy: samples 0..21599: NaN or infinite values (sample 777)"),
        ("labels", "labels.npy: samples 0..21599: labels other than 0 and 1 (sample 5:"),
    ],
)
def test_non_finite_dense_values_and_labels_other_than_0_1_stop_training(
    run_cli, tiny_data, tmp_path, damage, fragment
):
    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    f = data / "train" / "00000" / f"{damage}.npy"
    arr = np.load(f)
    if damage == "dense":
        arr[777, 3] = np.nan
    else:
        arr[5] = 5.0
    np.save(f, arr)
    meta = json.loads((data / "meta.json").read_text())
    del (
        meta["files"],
        meta["meta_crc32"],
    )  # as if written so (no sums to tell the changed file): the value checks find it
    meta["format_version"] = 1
    (data / "meta.json").write_text(json.dumps(meta))
    line = one_line(*run_cli("train", "--data", data, "--out", tmp_path / "r", "--steps", 5, *COMMON)[::2], fragment)
    assert str(f.parent) in line and "bagpipe check" in line and not (tmp_path / "r").exists()


LAYOUT = ("--store-layout", "frequency")


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--mode", "full", "--store", "disk"], "--store does not apply to --mode full"),
        (["--mode", "fae", "--cache-rows", 500], "--cache-rows does not apply to --mode fae"),
        (["--mode", "lru", "--lookahead", 4], "--lookahead does not apply to --mode lru"),
        (["--mode", "lookahead", "--store-dir", "s"], "--store-dir needs --store disk"),
        (["--rendezvous-timeout", 10], "--rendezvous-timeout applies to distributed runs"),
        (
            ["--lr-schedule", "warmup-poly", "--lr-warmup-steps", 2, "--lr-decay-start", 4],
            "give --lr-decay-steps N > 0",
        ),
        (["--lr-min", 0.001], "--lr-min applies to --lr-schedule warmup-poly or step, not constant"),
        (["--mode", "lookahead", "--hot-sample-rate", 0.5], "--hot-sample-rate applies when the hot rows are profiled"),
        (["--mode", "lookahead", "--store-layout", "frequency"], "--store-layout needs --store disk"),
        (["--mode", "full", "--store-layout", "frequency"], "--store-layout does not apply to --mode full"),
        (
            ["--mode", "lookahead", "--store", "disk", *LAYOUT, "--trainers", 2, "--servers", 1],
            "--store-layout applies to a one-process run's disk store (an embedding server's shard keeps the "
            "identity layout)",
        ),
        (
            ["--mode", "lru", "--store", "disk", "--store-dir", "s", "--init-from-store", *LAYOUT],
            "--store-layout applies to a store this run makes: the store of --init-from-store keeps the layout it "
            "was made with",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_options_that_do_not_apply_are_refused_naming_them(run_cli, tiny_data, tmp_path, args, fragment):
    one_line(
        *run_cli("train", "--data", tiny_data, "--out", tmp_path / "r", "--steps", 5, *COMMON, *args)[::2], fragment
    )
    assert not (tmp_path / "r").exists()


def test_a_diverging_step_stops_training_keeping_the_last_good_checkpoint(run_cli, tiny_data, tmp_path, monkeypatch):
    from bagpipe.train.step import STEPS

    real = STEPS["plain"]

    def poisoned(model, opt, rows, inp, times):  # step 7 sees a NaN input, as a bug upstream would hand it
        if inp.step == 6:
            dense = inp.batch.dense.clone()
            dense[0, 0] = float("nan")
            inp = dataclasses.replace(inp, batch=dataclasses.replace(inp.batch, dense=dense))
        return real(model, opt, rows, inp, times)

    run = tmp_path / "run"
    with monkeypatch.context() as m:
        m.setitem(STEPS, "plain", poisoned)
        one_line(
            *run_cli("train", "--data", tiny_data, "--out", run, "--steps", 12, "--checkpoint-every", 5, *COMMON)[::2],
            "training diverged at step 7",
            "stopped without checkpointing it",
        )
    assert (run / "checkpoints" / "LATEST").read_text().strip() == "step-00000005"
    rc, out, err = run_cli("eval", "--run", run, "--data", tiny_data)
    assert rc == 0 and "step 5:" in out, err
    rc, out, err = run_cli(
        "train", "--data", tiny_data, "--out", run, "--steps", 12, "--checkpoint-every", 5, "--resume", *COMMON
    )
    assert rc == 0 and "resumed from step 5" in out, err


# =========================================================================== tracebacks


def test_eval_on_data_of_another_shape_is_one_line(run_cli, finished, tmp_path):
    from bagpipe.data.synthetic import SynthConfig, generate

    other = tmp_path / "avazu"  # other dense features and tables
    generate(SynthConfig(profile="avazu", samples=2000, scale=0.0001), other, progress=False)
    one_line(*run_cli("eval", "--run", finished[0], "--data", other)[::2], "does not match the tables")


@pytest.mark.parametrize(
    "damage,fragment",
    [
        ("dense", "dense.safetensors: missing"),
        ("table", "damaged export file: model.json records"),  # its size (model.json's sums, version 2)
        ("manifest", "model.json:"),
        ("manifest-fields", "damaged export file: its content does not match the CRC-32"),
    ],
)
def test_a_damaged_export_is_one_line_in_predict_and_load(run_cli, finished, raw_criteo, tmp_path, damage, fragment):
    import bagpipe
    from bagpipe.errors import DataError

    export = tmp_path / "export"
    shutil.copytree(finished[1], export)
    if damage == "dense":
        (export / "dense.safetensors").unlink()
    elif damage == "table":
        f = next(export.glob("embeddings-*.safetensors"))
        f.write_bytes(f.read_bytes()[:-100])
    elif damage == "manifest":
        (export / "model.json").write_text('{"format": "bagpipe-export", "version": 1, ')
    else:
        m = json.loads((export / "model.json").read_text())
        del m["tables"][0]["key"]
        (export / "model.json").write_text(json.dumps(m))
    one_line(*run_cli("predict", "--model", export, "--input", raw_criteo, "--out", tmp_path / "p")[::2], fragment)
    with pytest.raises(DataError, match=fragment.replace(".", r"\.")):
        bagpipe.load(export)


def test_a_missing_vocabulary_the_export_lists_is_blamed_on_the_export(tmp_path):
    from bagpipe.errors import DataError
    from bagpipe.export.model import ExportedModel

    model = ExportedModel.__new__(ExportedModel)  # only what mapping() reads
    model.directory, model._mapping = tmp_path, None
    model.manifest = {"preprocessing": {"format": "criteo", "vocab": "vocab"}}
    with pytest.raises(DataError, match="missing, though model.json lists the vocabulary; a damaged export"):
        model.mapping()
    model.manifest = {"preprocessing": {"format": "criteo", "vocab": None}}
    with pytest.raises(DataError, match="its dataset had none"):
        model.mapping()


# =========================================================================== hangs and misleading messages


def test_a_port_held_by_a_stranger_is_given_up_on_within_the_time_out(run_cli, monkeypatch):
    from bagpipe.distributed.rendezvous import RENDEZVOUS_GRACE_S

    monkeypatch.setenv("BAGPIPE_JOB_SECRET", "a secret for this test job only")  # a role needs the job's secret

    with socket.socket() as s:  # accepts connections and never answers: not a bagpipe job
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        t0 = time.monotonic()
        rc, _, err = run_cli(
            "serve", "--rank", 1, "--trainers", 1, "--servers", 1, "--master-port", port, "--rendezvous-timeout", 1
        )
        took = time.monotonic() - t0
    one_line(rc, err, "nothing answered as a bagpipe job", f"127.0.0.1:{port}", "within 1 s")
    assert took < 1 + RENDEZVOUS_GRACE_S + 5  # the time-out, the grace, a probe of the port


def test_an_unresolvable_master_host_is_named(run_cli, monkeypatch):
    monkeypatch.setenv("BAGPIPE_JOB_SECRET", "a secret for this test job only")
    one_line(
        *run_cli(
            "serve",
            "--rank",
            "1",
            "--trainers",
            "1",
            "--servers",
            "1",
            "--master-addr",
            "no-such-host.invalid",
            "--rendezvous-timeout",
            2,
        )[::2],
        "cannot resolve the master host 'no-such-host.invalid'",
    )


def test_a_distributed_resume_the_run_cannot_continue_is_refused_with_its_reason(
    run_cli, tiny_data, finished, tmp_path
):
    run = tmp_path / "run"
    shutil.copytree(finished[0], run)
    before = snapshot(run)
    dist = ("--mode", "lookahead", "--trainers", 1, "--servers", 1, "--resume", "--no-progress", "--threads", 1)
    one_line(
        *run_cli("train", "--data", tiny_data, "--out", run, "--steps", 20, "--batch-size", 32, *dist)[::2],
        "batch_size was 64, now 32",
    )
    one_line(
        *run_cli("train", "--data", tiny_data, "--out", run, "--steps", 12, "--batch-size", B, *dist)[::2],
        "is complete",
    )
    assert snapshot(run) == before and not (run / "logs").exists()  # no role was started
