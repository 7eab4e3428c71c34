"""The second newcomer round (issue 32's acceptance): what a new user tried that still went
wrong, each now one line (exit 2, no traceback) with nothing of the user's changed.

* ``bagpipe train --out`` (or ``--store-dir``) that is the data set, lies inside it, or
  holds another data set is refused before anything is written: the run's config,
  metrics and checkpoints used to land among the shards (and ``preprocess --overwrite``
  of the data set would then delete the run);
* ``--cache-rows`` larger than every row of the tables is refused by ``train`` and
  ``plan`` with the same words: slots beyond every row were allocated with their
  optimizer state (``--cache-rows 100000000`` on the tiny data set took 6 GiB);
* ``bagpipe plot --out`` at an existing file that is not a PNG (a run's summary.json) is
  refused and the file kept -- it used to be replaced by the picture; ``--out`` under a
  file, or where nothing can be written, is one line instead of a traceback;
* ``--data`` given a raw log file (not a data set folder) says so and how to make one, in
  ``train`` (also without --steps: it read "unreadable ([Errno 20] Not a directory ...)"),
  ``plan``, ``eval`` and ``check`` (they said "no such dataset directory" of a file that exists);
* a Criteo line one field short or long says why: the label column (Criteo's test.txt
  given to ``preprocess``, training lines given to ``predict`` without ``--labelled``);
* ``preprocess --input A --input B`` reads A and B (as ``--input A B`` does): the second
  option used to replace the first, and A's lines were silently left out;
* ``bagpipe bench --out`` at a file is one line naming it (it named OUT/data), and a
  results.json / results.md there that an earlier bench did not write is kept (it was
  replaced without a word);
* a ``kill -9`` of ``bagpipe predict`` (or ``plot``) left its partial output beside the
  target (``.NAME.tmp-PID``, gigabytes on a large log) that no later run removed: the next
  write of that name removes it, in one line, when its writer is gone; a live writer's
  file is kept;
* roles started by hand for different job shapes (``bagpipe serve --servers 2`` beside
  workers of ``--servers 1``) are refused at the rendezvous, naming the rank and both
  shapes, within --rendezvous-timeout: the arrival count was met by the stranger and the
  others then waited in the process group for its 30-minute time-out.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from runs import outputs, stopped_at_end

COMMON = ("--steps", 3, "--batch-size", 64, "--no-progress", "--threads", 1, "--eval-samples", 64)


def snapshot(folder: str | Path) -> dict[str, str]:
    """Every file under ``folder`` and the sha256 of its bytes."""
    folder = Path(folder)
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def one_line_error(rc: int, err: str, command: str, *fragments: str) -> str:
    """The one ``bagpipe COMMAND: error:`` line of a refusal (exit 2, no traceback)."""
    assert rc == 2 and "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith(f"bagpipe {command}: error: ")]
    assert len(lines) == 1, err
    for f in fragments:
        assert f in lines[0], (f, err)
    return lines[0].split(": error: ", 1)[1]


# -- train --out / --store-dir among the data set's files ---------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("where", ["the data set", "inside it"])
def test_train_out_in_the_data_set_is_refused_and_the_data_set_kept(run_cli, tiny_data, where):
    out = Path(tiny_data) if where == "the data set" else Path(tiny_data) / "train" / "run"
    before = snapshot(tiny_data)
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", out, *COMMON)
    what = "is" if where == "the data set" else "lies inside"
    one_line_error(
        rc, err, "train", f"--out {out} {what} --data {tiny_data}: the run would write its files among the data set's"
    )
    assert snapshot(tiny_data) == before  # no config.json, metrics, lock or checkpoint among the shards
    assert not out.exists() or out == Path(tiny_data)


@pytest.mark.integration
def test_train_store_dir_inside_the_data_set_is_refused(run_cli, tiny_data, tmp_path):
    store = Path(tiny_data) / "store"
    before = snapshot(tiny_data)
    rc, _, err = run_cli(
        "train", "--data", tiny_data, "--out", tmp_path / "run", *COMMON,
        "--mode", "lookahead", "--store", "disk", "--store-dir", store,
    )  # fmt: skip
    one_line_error(
        rc, err, "train", f"--store-dir {store} lies inside --data {tiny_data}", "choose another --store-dir"
    )
    assert snapshot(tiny_data) == before and not store.exists()
    assert not (tmp_path / "run").exists()


@pytest.mark.integration
def test_train_out_at_another_data_set_is_refused(run_cli, tiny_data, tmp_path):
    other = tmp_path / "other"
    (other / "train").mkdir(parents=True)
    (other / "meta.json").write_text("{}")
    before = snapshot(other)
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", other, *COMMON)
    one_line_error(rc, err, "train", f"--out {other} holds a data set (meta.json and train/)", "choose another --out")
    assert snapshot(other) == before and sorted(p.name for p in other.iterdir()) == ["meta.json", "train"]


# -- --cache-rows beyond every row --------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("command", ["train", "plan"])
def test_cache_rows_beyond_every_row_is_refused_by_train_and_plan(run_cli, tiny_data, tmp_path, command):
    from bagpipe.data.schema import DatasetMeta

    total = DatasetMeta.load(tiny_data).total_rows
    args = ["--data", tiny_data, "--batch-size", 64, "--mode", "lookahead", "--cache-rows", total + 1]
    if command == "train":
        args += ["--out", tmp_path / "run", "--steps", 3, "--no-progress", "--threads", 1]
    before = snapshot(tiny_data)
    rc, _, err = run_cli(command, *args)
    one_line_error(
        rc, err, command,
        f"--cache-rows {total + 1:,} is more than the {total:,} rows of all tables: give at most {total:,}",
    )  # fmt: skip
    assert not (tmp_path / "run").exists() and snapshot(tiny_data) == before


@pytest.mark.integration
def test_cache_rows_of_every_row_still_trains(run_cli, tiny_data, tmp_path):
    from bagpipe.data.schema import DatasetMeta

    total = DatasetMeta.load(tiny_data).total_rows
    rc, out, err = run_cli(
        "train", "--data", tiny_data, "--out", tmp_path / "run", *COMMON, "--mode", "lookahead", "--cache-rows", total
    )
    assert rc == 0, err
    assert (tmp_path / "run" / "summary.json").is_file()


# -- plot --out ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def a_run(tiny_data, tmp_path_factory) -> Path:
    from bagpipe.cli import main

    run = tmp_path_factory.mktemp("plot") / "run"
    assert main(["train", "--data", tiny_data, "--out", str(run), *map(str, COMMON)]) == 0
    return run


@pytest.mark.integration
@pytest.mark.parametrize("name", ["summary.json", "metrics.jsonl", "config.json"])
def test_plot_out_at_a_runs_file_is_refused_and_the_file_kept(run_cli, a_run, name):
    before = snapshot(a_run)
    target = a_run / name
    rc, _, err = run_cli("plot", a_run, "--out", target)
    one_line_error(
        rc,
        err,
        "plot",
        f"--out {target}: the file exists and is not a picture bagpipe wrote (it is not a PNG",
        "it is not replaced",
    )
    assert snapshot(a_run) == before


@pytest.mark.integration
def test_plot_replaces_its_own_png_and_writes_beside_a_run(run_cli, a_run, tmp_path):
    out = tmp_path / "curves.png"
    assert run_cli("plot", a_run, "--out", out)[0] == 0
    first = out.read_bytes()
    assert first.startswith(b"\x89PNG")
    rc, stdout, err = run_cli("plot", a_run, "--out", out)  # an earlier plot is replaced
    assert rc == 0 and f"wrote {out}" in stdout, err


@pytest.mark.integration
def test_plot_out_under_a_file_or_unwritable_is_one_line(run_cli, a_run, tmp_path):
    a_file = tmp_path / "c.png"
    a_file.write_bytes(b"mine")
    rc, _, err = run_cli("plot", a_run, "--out", a_file / "x.png")
    one_line_error(rc, err, "plot", f"--out {a_file / 'x.png'}: {a_file} is a file, not a folder")
    assert a_file.read_bytes() == b"mine"
    rc, _, err = run_cli("plot", a_run, "--out", "/proc/bagpipe-newcomer.png")
    one_line_error(rc, err, "plot", "--out /proc/bagpipe-newcomer.png: cannot write it")


# -- the label column's field -------------------------------------------------------------


def criteo_line(labelled: bool) -> str:
    fields = (["1"] if labelled else []) + ["3"] * 13 + ["68fd1e64"] * 26
    return "\t".join(fields) + "\n"


@pytest.mark.integration
def test_preprocess_of_unlabelled_criteo_lines_names_the_label_column(run_cli, tmp_path):
    raw = tmp_path / "test.txt"
    raw.write_text(criteo_line(labelled=False) * 20)
    out = tmp_path / "data"
    rc, _, err = run_cli("preprocess", "criteo", "--input", raw, "--out", out)
    one_line_error(
        rc, err, "preprocess",
        f"{raw}:1: expected 40 tab-separated fields, got 39 (no label column, as in Criteo's test.txt? "
        "preprocess --no-label, or predict without --labelled)",
    )  # fmt: skip
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["test.txt"]


@pytest.mark.unit
def test_an_unlabelled_parser_given_a_labelled_line_suggests_labelled():
    from bagpipe.preprocess.criteo import CriteoFormat
    from bagpipe.preprocess.formats import BadLine

    fmt = CriteoFormat(labelled=False)
    layout = fmt.layout("-", b"")
    with pytest.raises(
        BadLine, match=r"got 40 \(a label column first.*predict --labelled, or preprocess without --no-label\)"
    ):
        fmt.parse_line(criteo_line(labelled=True).encode(), layout)
    with pytest.raises(BadLine, match=r"expected 39 tab-separated fields, got 3$"):
        fmt.parse_line(b"1\t2\t3", layout)  # another count: no guess


# -- hand-started roles of different job shapes -------------------------------------------


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_roles_started_for_other_job_shapes_are_refused_at_the_rendezvous(tiny_data, tmp_path):
    from bagpipe.distributed.auth import SECRET_ENV, new_secret
    from bagpipe.distributed.launch import free_port

    port, secret = free_port(), new_secret()
    out = tmp_path / "job"
    worker = ["worker", "--data", tiny_data, "--out", out, "--steps", 20, "--batch-size", 64, "--no-progress"]
    worker += ["--mode", "lookahead", "--trainers", 1, "--servers", 1, "--rendezvous-timeout", 30]
    serve = ["serve", "--rank", 1, "--trainers", 1, "--servers", 2, "--master-addr", "127.0.0.1"]
    serve += ["--master-port", port, "--rendezvous-timeout", 30]
    commands = {0: worker, 1: serve, 2: worker}
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="3", OMP_NUM_THREADS="1")
    env[SECRET_ENV] = secret.decode()
    t0 = time.monotonic()
    with stopped_at_end() as procs:
        for rank, args in commands.items():
            cmd = [sys.executable, "-m", "bagpipe.cli", *map(str, args)]
            own = dict(env, RANK=str(rank))
            if args[0] == "serve":  # its job size comes from --trainers/--servers: WORLD_SIZE 3 would be refused
                del own["WORLD_SIZE"]
            procs.append(subprocess.Popen(cmd, env=own, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        results = outputs(procs, 100, t0)
    errors = [err for _, err in results]
    assert [p.returncode for p in procs] == [2, 2, 2], errors
    assert time.monotonic() - t0 < 90, errors  # not the process group's 30-minute wait
    shapes = (
        "rank 1 was started for a job of 1 trainer(s) + 2 server(s) (WORLD_SIZE 4), this role for one of "
        "1 trainer(s) + 1 server(s) (WORLD_SIZE 3): start every role with the same --trainers, --servers and WORLD_SIZE"
    )
    assert f"bagpipe worker: error: trainer 0: {shapes}" in errors[0], errors[0]
    assert f"bagpipe worker: error: oracle: {shapes}" in errors[2], errors[2]
    assert "bagpipe serve: error: server 0: " in errors[1], errors[1]
    assert not any("Traceback" in err for err in errors), errors
    assert not (out / "summary.json").exists()


@pytest.mark.integration
def test_preprocess_input_given_twice_reads_both_files(run_cli, tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text(criteo_line(labelled=True) * 30)
    b.write_text(criteo_line(labelled=True) * 70)
    rc, out, err = run_cli("preprocess", "criteo", "--input", a, "--input", b, "--out", tmp_path / "data", "--split", 1)
    assert rc == 0, err
    assert "rows train 100;" in out + err  # 30 + 70: A is not dropped
    rc, out_, err = run_cli("preprocess", "criteo", "--input", a, "--input", a, "--out", tmp_path / "again")
    one_line_error(rc, err, "preprocess", f"{a}: given twice")


# -- what a killed writer of an output file left ------------------------------------------


@pytest.mark.integration
def test_a_killed_writers_temporary_is_removed_by_the_next_write_and_a_live_ones_kept(run_cli, a_run, tmp_path, caplog):
    import logging

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stale = tmp_path / f".curves.png.tmp-{gone.pid}"
        stale.write_bytes(b"x" * 1000)
        kept = tmp_path / f".curves.png.tmp-{live.pid}"
        kept.write_bytes(b"y")
        mine = tmp_path / ".curves.png.tmp-notapid"
        mine.write_bytes(b"z")
        with caplog.at_level(logging.INFO, logger="bagpipe.files"):
            rc, _, err = run_cli("plot", a_run, "--out", tmp_path / "curves.png")
        assert rc == 0, err
        assert not stale.exists() and kept.read_bytes() == b"y" and mine.read_bytes() == b"z"
        assert f"removed the unfinished {stale} (0.0 MB) of pid {gone.pid}, which is gone" in caplog.text
        assert (tmp_path / "curves.png").read_bytes().startswith(b"\x89PNG")
    finally:
        live.kill()
        live.wait()


# -- bench --out --------------------------------------------------------------------------


@pytest.mark.integration
def test_bench_out_at_a_file_or_over_foreign_results_is_refused(run_cli, tmp_path):
    a_file = tmp_path / "c.png"
    a_file.write_bytes(b"mine")
    rc, _, err = run_cli("bench", "oracle", "--quick", "--out", a_file)
    one_line_error(rc, err, "bench", f"--out {a_file}: {a_file} is a file, not a folder; choose another --out")
    assert a_file.read_bytes() == b"mine"
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "results.md").write_text("my results")
    rc, _, err = run_cli("bench", "oracle", "--quick", "--out", folder)
    one_line_error(rc, err, "bench", f"{folder / 'results.md'} exists and is not an earlier bench's results")
    assert snapshot(folder) == {"results.md": hashlib.sha256(b"my results").hexdigest()}


# -- --data at a raw log file -------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("command", ["train", "train --steps 3", "plan", "check", "eval"])
def test_data_at_a_raw_file_says_it_is_a_file(run_cli, a_run, tmp_path, command):
    raw = tmp_path / "train.txt"
    raw.write_text(criteo_line(labelled=True) * 5)
    words = command.split()
    args = {
        "train": ["--data", raw, "--out", tmp_path / "run", *words[1:]],
        "plan": ["--data", raw],
        "check": [raw],
        "eval": ["--run", a_run, "--data", raw],
    }[words[0]]
    rc, _, err = run_cli(words[0], *args)
    one_line_error(
        rc, err, words[0], f"{raw}: a file, not a dataset directory (raw logs become one with `bagpipe preprocess`)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.txt"]
