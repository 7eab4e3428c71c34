"""The eighteenth newcomer round's output findings: symbolic links given as outputs, and
what ``bench scale``'s results.md says it measured.

* ``--summary-json LINK`` and ``profile --out LINK`` replaced the link with a regular file
  (a temporary file renamed onto the link), so the file the link names stayed stale, or
  was never written where the link dangled: every atomic writer writes through a link to
  its target (a dangling link's too), and the link stays.
* ``--out LINK``, a dangling link, said ``cannot create the run directory (File exists)``:
  the folder it names is made, as ``mkdir -p`` through it would, the link stays, and a run
  refused at start-up removes the folder it made and leaves the link.
* ``bench scale --store-layout frequency``'s results.md never said the layout measured,
  and its table said ``anon MiB at step 100 / last`` for a 12-step --quick run: it names
  the layout, and the step its memory is first read at.
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest

from bagpipe.files import atomic_file, atomic_write_bytes, atomic_write_text

pytestmark = pytest.mark.integration

RUN = ("--steps", 2, "--batch-size", 64, "--no-progress")


def steps_in(path) -> int:
    return json.loads(open(path).read())["steps"]


# -- the atomic writers through a symbolic link ---------------------------------------------------


@pytest.mark.parametrize("writer", ["bytes", "text", "file"])
def test_an_atomic_write_goes_through_a_link_to_its_target(tmp_path, writer):
    """A link to a file, a dangling link and a chain of links: the target gets the content,
    every link stays a link, and no temporary file is left beside the link or the target."""

    def write(path, text):
        if writer == "bytes":
            atomic_write_bytes(path, text.encode())
        elif writer == "text":
            atomic_write_text(path, text)
        else:
            with atomic_file(path) as f:
                f.write(text)

    (tmp_path / "sub").mkdir()
    target = tmp_path / "sub" / "a.txt"
    target.write_text("old")
    link = tmp_path / "link"
    link.symlink_to("sub/a.txt")  # relative, as `ln -s` makes it
    write(link, "new")
    assert link.is_symlink() and os.readlink(link) == "sub/a.txt"
    assert target.read_text() == "new"

    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "sub" / "b.txt")
    write(dangling, "made")
    assert dangling.is_symlink() and (tmp_path / "sub" / "b.txt").read_text() == "made"

    chain = tmp_path / "chain"
    chain.symlink_to(link)
    write(chain, "again")
    assert chain.is_symlink() and link.is_symlink() and target.read_text() == "again"

    plain = tmp_path / "plain.txt"
    write(plain, "plain")
    assert plain.read_text() == "plain" and not plain.is_symlink()
    left = sorted(p.name for p in [*tmp_path.iterdir(), *(tmp_path / "sub").iterdir()] if ".tmp-" in p.name)
    assert left == []


def test_summary_json_through_a_link_updates_its_target_on_resume(run_cli, tiny_data, tmp_path):
    """The report's commands: a run with --summary-json summaries/b.json, then a resumed run
    given a link to it (and a dangling link's target, a folder that does not exist yet)."""
    summaries = tmp_path / "summaries"
    summaries.mkdir()
    run = tmp_path / "run"
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", run, *RUN, "--summary-json", summaries / "b.json")
    assert rc == 0, err
    assert steps_in(summaries / "b.json") == 2
    link = tmp_path / "lnk6"
    link.symlink_to(summaries / "b.json")
    rc, _, err = run_cli(
        "train", "--data", tiny_data, "--out", run, "--resume", "--steps", 4, "--batch-size", 64, "--no-progress",
        "--summary-json", link,
    )  # fmt: skip
    assert rc == 0, err
    assert link.is_symlink() and steps_in(summaries / "b.json") == 4

    dangling = tmp_path / "lnk5"
    dangling.symlink_to(summaries / "later" / "a.json")
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", tmp_path / "run2", *RUN, "--summary-json", dangling)
    assert rc == 0, err
    assert dangling.is_symlink() and steps_in(summaries / "later" / "a.json") == 2


def test_profile_out_through_a_link_writes_its_target(run_cli, tiny_data, tmp_path):
    """``profile --out LINK`` (a link to an earlier hot-row file, and a dangling one): the
    link stays and the file it names is the new hot-row file."""
    summaries = tmp_path / "summaries"
    summaries.mkdir()
    dangling = tmp_path / "lnk8"
    dangling.symlink_to(summaries / "h.npz")
    rc, _, err = run_cli("profile", "--data", tiny_data, "--hot-budget-mb", "0.05", "--out", dangling)
    assert rc == 0, err
    assert dangling.is_symlink() and (summaries / "h.npz").is_file()
    first = (summaries / "h.npz").stat().st_ino

    rc, _, err = run_cli("profile", "--data", tiny_data, "--hot-budget-mb", "0.1", "--out", dangling)
    assert rc == 0, err
    assert dangling.is_symlink() and (summaries / "h.npz").stat().st_ino != first  # replaced whole
    with np.load(summaries / "h.npz") as z:
        assert len(z["rows"]) > 0
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []


# -- --out a dangling link ------------------------------------------------------------------------


def test_out_a_dangling_link_makes_the_folder_it_names(run_cli, tiny_data, tmp_path):
    link = tmp_path / "lnk3"
    link.symlink_to("runs/tb41")  # relative to the link's folder, as `ln -s runs/tb41 lnk3` makes it
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", link, *RUN)
    assert rc == 0, err
    assert link.is_symlink() and os.readlink(link) == "runs/tb41"
    made = tmp_path / "runs" / "tb41"
    assert steps_in(made / "summary.json") == 2 and (made / "config.json").is_file()


def test_a_run_failing_at_start_removes_the_folder_it_made_through_a_link(tmp_path):
    """RunDir.claim: a start-up that fails removes the folder this process made (the link's
    target, its parent made too is kept as `mkdir -p`'s would be) and leaves the link."""
    from bagpipe.train.rundir import RunDir

    link = tmp_path / "lnk"
    link.symlink_to(tmp_path / "runs" / "x")
    with pytest.raises(RuntimeError, match="refused"):
        with RunDir(link).claim() as run:
            assert run.created and (tmp_path / "runs" / "x" / ".lock").is_file()
            raise RuntimeError("refused at start-up")
    assert link.is_symlink() and not (tmp_path / "runs" / "x").exists()


def test_a_link_loop_as_the_run_folder_is_refused_in_one_line(tmp_path):
    """RunDir.claim: a loop of links names no folder to make; said so, nothing made."""
    from bagpipe.errors import ConfigError
    from bagpipe.train.rundir import RunDir

    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(ConfigError, match="is a symbolic link that never reaches a file or folder"):
        with RunDir(tmp_path / "a").claim():
            pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


def test_a_link_loop_as_out_is_one_line_from_train(run_cli, tiny_data, tmp_path):
    """The same through ``bagpipe train``: the new-run check of --out listed the folder
    first (ELOOP, a traceback)."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", tmp_path / "a", *RUN)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and lines == [
        f"bagpipe train: error: --out {tmp_path / 'a'} is a symbolic link that never reaches a file or folder (a "
        "loop); remove the link or give another --out"
    ], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


# -- bench scale's results.md ---------------------------------------------------------------------


def fake_run(steps: int) -> dict:
    """One finished run's summary, as bench scale keeps it (the fields the report reads)."""
    return {
        "status": "ok",
        "samples_per_s": 1000.0,
        "steps": steps,
        "time_per_step_ms": {"wait_embeddings": 1.0, "forward_backward": 3.0},
        "io_per_step": {"read_bytes": 2**20, "write_bytes": 0},
        "memory_group": {"limit_mb": 512.0, "peak_mb": 300.0, "max": {"dirty": 4.0}, "limit_hits": 0, "oom_kills": 0},
        "peak_anon_rss_mb": 200.0,
        "memory": {"estimate_mb": 250.0, "by_step": [[1, 190.0], [steps, 195.0]]},
        "cache": {"hit_rate": 0.9},
        "params_sha256": "abc",
    }


@pytest.mark.parametrize("layout", ["identity", "frequency"])
def test_scale_results_md_names_the_layout_and_the_step_measured(layout):
    from bagpipe.bench.scenarios.scale.report import summarise
    from bagpipe.bench.scenarios.scale.scenario import ScaleBench

    b = dataclasses.replace(ScaleBench.quick(), steps=12, store_layout=layout)
    results = {"full": [fake_run(12) | {"memory_group": None}], "lookahead": [fake_run(12)]}
    results["full"][0].pop("memory_group")
    payload = summarise(b, results, [], 1000, 100, 2**20, "test", {})
    table = payload["table"]
    assert f"in the {layout} row layout (--store-layout {layout})" in table
    assert "anon MiB at step 12 / last" in table and "step 100" not in table
    assert "within 5% of step 12:" in table
    assert payload["config"]["store_layout"] == layout
