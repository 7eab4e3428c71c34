"""The eleventh newcomer round's other findings: a command line, a config file or a figure
that said too little or named the wrong command.

* ``bagpipe plan`` refused ``--out`` (``bagpipe: error: unrecognized arguments``) though it
  takes ``train``'s options: it takes it, writes nothing there, and refuses an ``--out``
  that ``train`` would refuse, in train's words (inside ``--data``, a folder holding
  another run's checkpoints or records without ``--resume``), from the command line or a
  ``--config``.
* An unknown option of any command was reported by ``bagpipe`` itself (``bagpipe: error:
  ... (see bagpipe --help)``, whose help lists no command's options): the command that
  was given it says so (``bagpipe train: error:``, ``bagpipe bench modes: error:``), with
  the option it is close to where there is one.
* A TOML file with a top-level ``data = "..."`` and a ``[data]`` table was tomllib's
  ``Cannot overwrite a value``: the message names the clash and what to write instead,
  and that form is read.
* ``predict`` of Avazu lines with one field too many (the ``click`` column) said only the
  count: it says why, as Criteo's does (one hint, both formats).
* ``profile --embedding-dim`` took D up to 2^20, ``train`` only to 2^16: one bound.
* A benchmark of one repetition showed ``spread 0%``: ``n/a`` (``null`` in results.json).
* ``--eval-every`` on a data set without an eval split said ``no eval split`` at every
  evaluation: it says so once.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bagpipe.data.synthetic import SynthConfig, generate

RUN = ("--batch-size", 64, "--no-progress", "--threads", 1)


def one_line_error(rc: int, err: str, command: str, text: str) -> None:
    assert rc == 2, err
    assert err == f"bagpipe {command}: error: {text}\n", err


# -- plan takes --out ----------------------------------------------------------------------


@pytest.mark.integration
def test_plan_takes_out_and_writes_nothing_there(run_cli, tiny_data, tmp_path):
    out = tmp_path / "runs" / "zz"
    rc, stdout, err = run_cli("plan", "--data", tiny_data, *RUN, "--steps", 5, "--out", out)
    assert rc == 0, err
    assert "estimate of the trainer's peak" in stdout
    assert not (tmp_path / "runs").exists()  # nothing made
    rc, stdout, _ = run_cli("plan", "--help")
    assert rc == 0 and "plan writes nothing there" in " ".join(stdout.split())


@pytest.mark.integration
def test_plan_refuses_an_out_train_refuses_in_trains_words(run_cli, tiny_data, tmp_path):
    inside = Path(tiny_data) / "run"
    said = (
        f"--out {inside} lies inside --data {tiny_data}: the run would write its files among the data set's; "
        "choose another --out"
    )
    for command in ("plan", "train"):
        rc, _, err = run_cli(command, "--data", tiny_data, *RUN, "--steps", 5, "--out", inside)
        one_line_error(rc, err, command, said)
    assert not inside.exists()
    # from a config file too
    toml = tmp_path / "run.toml"
    toml.write_text(f'data = "{tiny_data}"\nout = "{inside}"\nbatch_size = 64\n')
    rc, _, err = run_cli("plan", "--config", toml)
    from_file = f' (out = "{inside}" is from {toml}, not the command line: change it there, or give --out another value'
    one_line_error(rc, err, "plan", said + from_file + " on the command line)")  # the option the user did not type


@pytest.mark.integration
def test_plan_refuses_another_runs_folder_unless_resumed(run_cli, tiny_data, tmp_path):
    out = tmp_path / "a"
    rc, _, err = run_cli("train", "--data", tiny_data, *RUN, "--steps", 3, "--eval-samples", 64, "--out", out)
    assert rc == 0, err
    before = sorted(p.name for p in out.iterdir())
    rc, _, err = run_cli("plan", "--data", tiny_data, *RUN, "--steps", 6, "--out", out)
    assert rc == 2 and err.startswith("bagpipe plan: error: ") and "--resume" in err and err.count("\n") == 1, err
    rc, _, train_err = run_cli("train", "--data", tiny_data, *RUN, "--steps", 6, "--out", out)
    assert rc == 2 and err.removeprefix("bagpipe plan") == train_err.removeprefix("bagpipe train")
    rc, _, err = run_cli("plan", "--data", tiny_data, *RUN, "--steps", 6, "--out", out, "--resume")
    assert rc == 0, err
    assert sorted(p.name for p in out.iterdir()) == before
    # a run that kept no checkpoint, only its records: refused alike
    records = tmp_path / "b"
    rc, _, err = run_cli(
        "train", "--data", tiny_data, *RUN, "--steps", 3, "--eval-samples", 64, "--no-final-checkpoint", "--out", records
    )  # fmt: skip
    assert rc == 0, err
    rc, _, err = run_cli("plan", "--data", tiny_data, *RUN, "--steps", 6, "--out", records)
    rc_train, _, train_err = run_cli("train", "--data", tiny_data, *RUN, "--steps", 6, "--out", records)
    assert rc == rc_train == 2 and "summary.json" in err and err.count("\n") == 1, err
    assert err.removeprefix("bagpipe plan") == train_err.removeprefix("bagpipe train")


# -- unknown options named by their command --------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize(
    ("argv", "command", "said"),
    [
        (("train", "--bogus"), "train", "--bogus"),
        (("train", "--data", "d", "--bogus=3", "x"), "train", "--bogus=3 x"),
        (("bench", "modes", "--bogus"), "bench modes", "--bogus"),
        (("plan", "--stpes", "3"), "plan", "--stpes 3; did you mean --steps?"),
        (("train", "--batchsize", "3"), "train", "--batchsize 3; did you mean --batch-size?"),
        (("bench", "oracle", "--quik"), "bench oracle", "--quik; did you mean --quick?"),
        (("--bogus", "train"), "", "--bogus"),
    ],
)
def test_an_unknown_option_is_said_by_its_command(run_cli, argv, command, said):
    rc, out, err = run_cli(*argv)
    prog = f"bagpipe {command}".strip()
    assert rc == 2 and out == ""
    assert err == f"{prog}: error: unrecognized arguments: {said} (see {prog} --help)\n"


# -- a TOML key that is also a table -------------------------------------------------------


@pytest.mark.integration
def test_a_top_level_key_and_the_table_of_its_name_say_what_to_write(run_cli, tiny_data, tmp_path):
    bad = tmp_path / "f.toml"
    bad.write_text(f'data = "{tiny_data}"\nsteps = 10\n[data]\nbatch_size = 32\n')
    rc, _, err = run_cli("train", "--config", bad, "--out", tmp_path / "t")
    one_line_error(
        rc, err, "train",
        f"{bad}: the top-level key 'data' (line 1) and the table [data] (line 3) are the same TOML key, which "
        f'cannot hold both a value and a table: write data = "{tiny_data}" on a line below [data] instead '
        "(a setting may be given in the table of its group)",
    )  # fmt: skip
    assert not (tmp_path / "t").exists()
    # what it says to write is read: data inside [data]
    good = tmp_path / "g.toml"
    good.write_text(f'steps = 10\n[data]\ndata = "{tiny_data}"\nbatch_size = 32\n')
    rc, out, err = run_cli("plan", "--config", good)
    assert rc == 0, err
    assert "batch 32 " in out
    # [device] clashes with --device the same way; another mistake keeps tomllib's words
    dev = tmp_path / "d.toml"
    dev.write_text('device = "cpu"\n[device]\n')
    rc, _, err = run_cli("plan", "--config", dev)
    assert rc == 2 and "the top-level key 'device' (line 1) and the table [device] (line 2)" in err, err
    assert 'write device = "cpu" on a line below [device]' in err
    twice = tmp_path / "t.toml"
    twice.write_text("[run]\n[run]\n")
    rc, _, err = run_cli("plan", "--config", twice)
    one_line_error(rc, err, "plan", f"{twice}: Cannot declare ('run',) twice (at line 2, column 5)")


# -- the label column's hint, Avazu as Criteo --------------------------------------------------


def avazu_line(labelled: bool) -> bytes:
    fields = ["1000009418151094273"] + (["0"] if labelled else []) + ["14102100"] + ["1005"] * 21
    return ",".join(fields).encode()


@pytest.mark.unit
def test_avazu_lines_with_or_without_the_click_column_say_why():
    from bagpipe.preprocess.avazu import AvazuFormat
    from bagpipe.preprocess.formats import BadLine

    unlabelled = AvazuFormat(labelled=False, header="none")
    layout = unlabelled.layout("-", avazu_line(False))
    with pytest.raises(BadLine) as e:
        unlabelled.parse_line(avazu_line(True), layout)
    assert str(e.value) == (
        "expected 23 comma-separated fields, got 24 (a label column (click), as in training lines? "
        "predict --labelled, or preprocess without --no-label)"
    )
    labelled = AvazuFormat(labelled=True, header="none")
    layout = labelled.layout("-", avazu_line(True))
    with pytest.raises(BadLine) as e:
        labelled.parse_line(avazu_line(False), layout)
    assert str(e.value) == (
        "expected 24 comma-separated fields, got 23 (no label column, as in Avazu's test file? "
        "preprocess --no-label, or predict without --labelled)"
    )
    with pytest.raises(BadLine, match=r"^expected 24 comma-separated fields, got 3$"):
        labelled.parse_line(b"1,2,3", layout)  # another count: no guess


# -- profile's D bound is train's ------------------------------------------------------------


@pytest.mark.integration
def test_profile_and_train_bound_the_embedding_dim_alike(run_cli, tiny_data, tmp_path):
    from bagpipe.config.sections import MAX_DIM

    rc, _, err = run_cli("profile", "--data", tiny_data, "--hot-budget-mb", 1, "--embedding-dim", MAX_DIM + 1)
    assert rc == 2 and f"must be an integer in [1, {MAX_DIM}], got {MAX_DIM + 1}" in err, err
    rc, _, err = run_cli("train", "--data", tiny_data, "--embedding-dim", MAX_DIM + 1, "--out", tmp_path / "r")
    one_line_error(rc, err, "train", f"embedding dim must be in [1, {MAX_DIM}], got {MAX_DIM + 1}")


# -- one repetition has no spread ------------------------------------------------------------


@pytest.mark.unit
def test_one_repetition_has_no_spread():
    from bagpipe.bench.harness.report import median_spread, percent

    med, spread = median_spread([5.0])
    assert med == 5.0 and math.isnan(spread)
    assert median_spread([4.0, 5.0, 6.0]) == (5.0, 0.4)
    assert [percent(x) for x in (spread, None, 0.4, 0.0)] == ["n/a", "n/a", "40%", "0%"]


@pytest.mark.integration
def test_a_benchmark_of_one_repetition_shows_no_spread(run_cli, tmp_path):
    out = tmp_path / "bench"
    rc, _, err = run_cli("bench", "oracle", "--quick", "--out", out)
    assert rc == 0, err
    table = [line.split(" | ") for line in (out / "results.md").read_text().splitlines() if line.startswith("| 512")]
    assert table and all(row[3] == "n/a" for row in table)
    assert "0%" not in (out / "results.md").read_text()
    results = json.loads((out / "results.json").read_text())
    spreads = [v for v in _values(results, "spread")]
    assert spreads and all(v is None for v in spreads)


def _values(obj, key: str):
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == key:
                yield v
            else:
                yield from _values(v, key)
    elif isinstance(obj, list):
        for v in obj:
            yield from _values(v, key)


# -- no eval split: said once ----------------------------------------------------------------


@pytest.mark.integration
def test_eval_every_without_an_eval_split_says_so_once(run_cli, tmp_path):
    data = tmp_path / "noeval"
    generate(SynthConfig(profile="tiny", samples=3000, seed=1, eval_fraction=0.0), data, progress=False)
    rc, out, err = run_cli(
        "train", "--data", data, *RUN, "--steps", 6, "--eval-every", 2, "--out", tmp_path / "r"
    )  # fmt: skip
    assert rc == 0, err
    said = [line for line in (out + err).splitlines() if "eval split" in line]
    assert said == [f"step 2: {data} has no eval split, so --eval-every evaluates nothing (said once)"], out + err
    # every evaluation is still recorded, as before
    records = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "eval_samples" in r] == [2, 4, 6]
