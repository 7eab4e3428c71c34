"""The third newcomer round: what a new user found still silently wrong or unhelpful,
each now one line (exit 2, no traceback) with nothing of the user's changed.

* a data set carried no checksums: a byte changed in a shard file passed ``bagpipe
  check`` and was trained on. meta.json now records every shard file's size and CRC-32
  (summed as the writer wrote it); ``check`` and a run's first read of a shard name a
  changed file in one line; a data set written before (no sums) still opens, checks by
  size and keeps its fingerprint (its runs still resume);
* a MANIFEST.json that does not parse stopped ``train --resume`` with "invalid JSON"
  and nothing more: it is a damaged checkpoint file like any other, and the checkpoint
  before it is offered (``--resume-from``);
* an empty LATEST was blamed on a missing MANIFEST: it is said so, with the newest
  intact checkpoint to resume from;
* ``--memory-budget-mb 0`` (no budget) still had a local job refused on its cgroup's
  limit by the job-sum check: it now warns that the roles may not fit, and starts them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from bagpipe.checkpoint import verify
from bagpipe.filesums import seal

pytestmark = pytest.mark.usefixtures("one_thread")

TRAIN = ("--steps", 40, "--batch-size", 64, "--checkpoint-every", 20, "--no-progress", "--eval-samples", 0)


def tree_hash(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` and the sha256 of its bytes (but ``.lock``)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(Path(folder).rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


def one_line(result: tuple[int, str, str], command: str) -> str:
    rc, _, err = result
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"bagpipe {command}: error: "), err
    return lines[0].split(": error: ", 1)[1]


@pytest.fixture
def data(tiny_data, tmp_path) -> Path:
    """A copy of the tiny data set, for this test to damage."""
    copy = tmp_path / "data"
    shutil.copytree(tiny_data, copy)
    return copy


def flip_byte(path: Path, at: int) -> None:
    b = bytearray(path.read_bytes())
    b[at] ^= 0x40
    path.write_bytes(bytes(b))


# --- 1. data set sums ------------------------------------------------------------------


@pytest.mark.unit
def test_meta_json_records_every_shard_files_size_and_crc32(tiny_data):
    meta = json.loads((Path(tiny_data) / "meta.json").read_text())
    on_disk = sorted(str(p.relative_to(tiny_data)) for p in Path(tiny_data).rglob("*.npy"))
    assert sorted(meta["files"]) == on_disk
    for rel, s in meta["files"].items():
        b = (Path(tiny_data) / rel).read_bytes()
        assert s == {"bytes": len(b), "crc32": f"{zlib.crc32(b):08x}"}, rel


@pytest.mark.integration
def test_a_changed_byte_is_named_by_check_and_by_train(data, tmp_path, run_cli):
    dense = data / "train" / "00000" / "dense.npy"
    want = json.loads((data / "meta.json").read_text())["files"]["train/00000/dense.npy"]["crc32"]
    flip_byte(dense, 50_000)
    found = f"{zlib.crc32(dense.read_bytes()):08x}"
    before = tree_hash(data)
    rc, out, err = run_cli("check", data, "--no-progress")
    assert rc == 2, out + err
    assert (
        f"train/00000: {dense}: damaged data set file: meta.json expects CRC-32 {want}, found {found} "
        "(its bytes changed since the data set was written)"
    ) in out.splitlines(), out
    assert "eval/00000: ok" in out
    said = one_line(run_cli("train", "--data", data, "--out", tmp_path / "run", "--steps", 5, "--no-progress"), "train")
    assert said.startswith(f"{dense}: damaged data set file: meta.json expects CRC-32 {want}, found {found}"), said
    assert tree_hash(data) == before


@pytest.mark.integration
def test_a_grown_file_is_named_with_the_size_meta_json_expects(data, run_cli):
    sparse = data / "eval" / "00000" / "sparse.npy"
    size = sparse.stat().st_size
    with open(sparse, "ab") as f:  # bytes appended: its header's shape still fits, only the size tells
        f.write(b"\0" * 8)
    before = tree_hash(data)
    rc, out, _ = run_cli("check", data, "--no-progress")
    assert rc == 2, out
    assert (
        f"eval/00000: {sparse}: damaged data set file: meta.json expects {size:,} bytes, found {size + 8:,} "
        "(longer than written)"
    ) in out.splitlines(), out
    assert tree_hash(data) == before


def old_fingerprint(root: Path) -> str:
    """The fingerprint as bagpipe computed it before meta.json held sums (of its files, and
    of its own content: meta_crc32 is no part of it)."""
    d = json.loads((root / "meta.json").read_text())
    d.pop("meta_crc32", None)
    src = dict(d.get("source", {}))
    if isinstance(src.get("inputs"), list):
        src["inputs"] = [{k: v for k, v in i.items() if k != "path"} for i in src["inputs"]]
    d["source"] = src
    h = hashlib.sha256(json.dumps(d, sort_keys=True).encode())
    for split in sorted(d["splits"]):
        for i in range(len(d["splits"][split]["shard_sizes"])):
            for p in sorted((root / split / f"{i:05d}").glob("*.npy")):
                h.update(f"{split}/{i}/{p.name}:{p.stat().st_size};".encode())
    return h.hexdigest()


@pytest.mark.integration
def test_a_data_set_without_sums_opens_checks_by_size_and_keeps_its_fingerprint(data, tmp_path, run_cli):
    from bagpipe.data.shards import Dataset

    meta = json.loads((data / "meta.json").read_text())
    del meta["files"], meta["meta_crc32"]  # as written before there were sums
    meta["format_version"] = 1
    (data / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
    before = tree_hash(data)
    assert Dataset(data).fingerprint() == old_fingerprint(data)
    rc, out, err = run_cli("check", data, "--no-progress")
    assert rc == 0 and f"{data}: all 2 shards ok" in out, out + err
    rc, _, err = run_cli("train", "--data", data, "--out", tmp_path / "run", "--steps", 5, "--no-progress")
    assert rc == 0, err
    assert tree_hash(data) == before


@pytest.mark.unit
def test_sums_are_in_a_new_data_sets_fingerprint(data):
    from bagpipe.data.shards import Dataset

    was = Dataset(data).fingerprint()
    assert was == old_fingerprint(data)  # meta.json as written, sums included
    meta = json.loads((data / "meta.json").read_text())
    meta["files"]["train/00000/dense.npy"]["crc32"] = "00000000"  # same sizes, other contents
    (data / "meta.json").write_text(json.dumps(seal(meta, "meta_crc32"), indent=2, sort_keys=True))
    assert Dataset(data).fingerprint() != was


# --- 2, 3. a damaged MANIFEST, an empty LATEST ----------------------------------------------


@pytest.fixture(scope="module")
def trained_run(tiny_data, tmp_path_factory) -> Path:
    from bagpipe.cli import main

    run = tmp_path_factory.mktemp("newcomer") / "run"
    assert main(["train", "--data", tiny_data, "--out", str(run), *map(str, TRAIN)]) == 0
    assert sorted(p.name for p in (run / "checkpoints").glob("step-*")) == ["step-00000020", "step-00000040"]
    return run


@pytest.fixture
def run(trained_run, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(trained_run, copy)
    verify.forget()
    return copy


def resume(tiny_data, run, *more) -> list:
    return ["train", "--data", tiny_data, "--out", run, "--steps", 60, *TRAIN[2:], "--resume", *more]


@pytest.mark.integration
@pytest.mark.parametrize("text", ["{x\n", "[]\n"], ids=["not-json", "not-a-manifest"])
def test_a_damaged_manifest_offers_the_previous_checkpoint(run, tiny_data, run_cli, text):
    manifest = run / "checkpoints" / "step-00000040" / "MANIFEST.json"
    manifest.write_text(text)
    before = tree_hash(run)
    said = one_line(run_cli(*resume(tiny_data, run)), "train")
    assert said.startswith(f"cannot resume {run} from its latest checkpoint step-00000040: {manifest}"), said
    assert "a damaged checkpoint file" in said or "malformed manifest" in said, said
    assert said.endswith(
        "the previous intact checkpoint is step 20: resume from it with --resume-from step-00000020 "
        "(nothing in the run folder was changed)"
    ), said
    assert tree_hash(run) == before
    rc, _, err = run_cli(*resume(tiny_data, run, "--resume-from", "step-00000020"))
    assert rc == 0, err
    assert (run / "checkpoints" / "LATEST").read_text().strip() == "step-00000060"


@pytest.mark.integration
@pytest.mark.parametrize("which", ["eval", "resume"])
def test_an_empty_latest_is_said_so_with_the_newest_intact_checkpoint(run, tiny_data, run_cli, which):
    latest = run / "checkpoints" / "LATEST"
    latest.write_text("")
    before = tree_hash(run)
    args = ["eval", "--run", run, "--data", tiny_data] if which == "eval" else resume(tiny_data, run)
    said = one_line(run_cli(*args), "eval" if which == "eval" else "train")
    assert said == (
        f"{latest} is empty: it names no checkpoint (a damaged run folder); the newest intact checkpoint is "
        "step-00000040 (step 40): `bagpipe train ... --resume --resume-from step-00000040` continues from it "
        "and makes LATEST name it (nothing in the run folder was changed)"
    ), said
    assert "MANIFEST" not in said
    assert tree_hash(run) == before
    if which == "resume":
        rc, _, err = run_cli(*resume(tiny_data, run, "--resume-from", "step-00000040"))
        assert rc == 0, err
        assert latest.read_text().strip() == "step-00000060"


# --- 4. --memory-budget-mb 0 in a local job -----------------------------------------------------


def job_roles():
    from bagpipe.budget.estimate import MIB, Estimate, Part
    from bagpipe.budget.job import RoleShare

    one = Estimate("trainer", (Part("rows", 300 * MIB, "test"),))
    return (RoleShare("each trainer", 2, one), RoleShare("the oracle", 1, one))


@pytest.mark.unit
def test_no_budget_warns_instead_of_refusing_a_job_over_the_cgroup(caplog):
    from bagpipe.budget.job import check_job
    from bagpipe.budget.sizing import Budget, BudgetError

    cgroup = Budget(400 << 20, "the memory cgroup's limit (test)", enforced=True)
    with pytest.raises(BudgetError, match="is shared by every role of this local job"):
        check_job(job_roles(), cgroup)
    with caplog.at_level(logging.WARNING):
        check_job(job_roles(), cgroup, off=True)
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith(
        "no budget (--memory-budget-mb 0), but the roles of this local job may not fit the memory cgroup's limit "
        "(test), 400 MiB: they are estimated at 1,145 MiB together"
    ), line


@pytest.mark.integration
def test_plan_with_no_budget_in_a_small_cgroup_does_not_refuse_the_job(tiny_data):
    from bagpipe.testbed.memlimit import MemoryGroup, find_memory_controller

    controller, why = find_memory_controller()
    if controller is None:
        pytest.skip(f"no memory cgroup can be made here: {why}")
    before = tree_hash(Path(tiny_data))
    job = ("--data", tiny_data, "--batch-size", 128, "--mode", "lookahead", "--trainers", 2, "--servers", 1)
    code = "import sys\nfrom bagpipe.cli import main\nsys.exit(main(sys.argv[1:]))"

    def plan(group, *more) -> subprocess.CompletedProcess:
        args = [sys.executable, "-c", code, "plan", *map(str, job + more)]
        return subprocess.run(args, preexec_fn=group.enter, capture_output=True, text=True, timeout=240)

    with MemoryGroup(controller, 400 << 20, "bagpipe-newcomer-test") as group:
        off = plan(group, "--memory-budget-mb", 0)
        on = plan(group)
    assert on.returncode == 2 and "is shared by every role of this local job" in on.stdout + on.stderr, on.stdout
    assert off.returncode == 0, off.stdout + off.stderr
    assert "fits: not checked -- no budget (--memory-budget-mb 0), but the roles of this local job may not fit" in (
        off.stdout
    ), off.stdout
    assert "does not fit" not in off.stdout + off.stderr
    assert tree_hash(Path(tiny_data)) == before


# --- round 3: where outputs go, a run's damaged summary, meta.json that disagrees -----------


@pytest.mark.integration
def test_an_output_file_of_a_run_or_data_set_is_not_replaced(run, data, tmp_path, run_cli):
    """`predict --out` (and every command checked with check_out_file) refuses an existing
    file that belongs to a run (its summary.json) or a data set (its meta.json): a third
    newcomer round overwrote both with probabilities."""
    from bagpipe.errors import ConfigError
    from bagpipe.files import check_out_file

    for victim, owner in ((run / "summary.json", f"the run {run}"), (data / "meta.json", f"the data set {data}")):
        before = victim.read_bytes()
        with pytest.raises(ConfigError, match=f"the file is part of {owner}; it is not replaced"):
            check_out_file(victim, "--out")
        assert victim.read_bytes() == before
    mine = run / "my-predictions.txt"  # a file of the user's own beside the run's files is theirs
    mine.write_text("old\n")
    assert check_out_file(mine, "--out") == mine


@pytest.mark.integration
def test_an_output_where_nothing_can_be_written_is_refused_before_the_work(tiny_data, tmp_path, run_cli):
    from bagpipe.errors import ConfigError
    from bagpipe.files import check_out_file

    with pytest.raises(ConfigError, match=r"--out /proc/q\.pred: cannot write in /proc"):
        check_out_file("/proc/q.pred", "--out")
    out = tmp_path / "r"
    line = one_line(
        run_cli("train", "--data", tiny_data, "--out", out, "--steps", 2, "--summary-json", "/proc/x.json"), "train"
    )
    assert line.startswith("--summary-json /proc/x.json: cannot write in /proc") and not out.exists()


@pytest.mark.integration
def test_export_of_a_run_whose_summary_is_damaged_exports_the_checkpoint(run, tmp_path, run_cli, caplog):
    (run / "summary.json").write_text("not json\n")
    with caplog.at_level(logging.WARNING, logger="bagpipe"):
        rc, _, err = run_cli("export", "--run", run, "--out", tmp_path / "exp")
    assert rc == 0, err
    assert "summary.json: unreadable" in caplog.text and "records no params_sha256" in caplog.text
    assert json.loads((tmp_path / "exp" / "model.json").read_text())


@pytest.mark.integration
def test_a_meta_json_whose_counts_disagree_is_refused_by_check_and_train(data, tmp_path, run_cli):
    meta = json.loads((data / "meta.json").read_text())
    n = meta["splits"]["train"]["num_samples"]
    meta["splits"]["train"]["num_samples"] = n - 1000
    (data / "meta.json").write_text(json.dumps(seal(meta, "meta_crc32")))  # resealed: the counts' own check
    want = f"meta.json: splits.train.num_samples is {n - 1000} but its shard_sizes add up to {n:,}"
    assert want in one_line(run_cli("check", data), "check")
    out = tmp_path / "r"
    assert want in one_line(run_cli("train", "--data", data, "--out", out, "--epochs", 1), "train")
    assert not out.exists()
