"""The 23rd newcomer round's findings (issue 32), each with nothing of the user's changed:

* a run that fails at start-up removed its run folder but left the folders above it that
  it had made, empty;
* a range error of a value from `--config` (`lr = inf`) named neither the file nor the key;
* `bench modes` without `full` printed `nanx` and `nan%` where a ratio has no reference.
"""

from __future__ import annotations

import pytest
from runs import one_line

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    "extra",
    [("--batch-size", 99999), ("--mode", "lookahead", "--cache-rows", 3), ("--resume",)],
    ids=["batch-too-big", "cache-too-small", "resume-nothing"],
)
def test_a_run_failing_at_start_up_leaves_no_folder_it_made(run_cli, tiny_data, tmp_path, extra):
    rc, _, err = run_cli("train", "--data", tiny_data, "--batch-size", 64, "--steps", 3, "--no-progress",
                         "--out", tmp_path / "a" / "b" / "run", *extra)  # fmt: skip
    assert rc == 2, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("line, says", [("lr = inf", "lr must be a finite number, got inf"),
                                        ("seed = -1", "seed must be >= 0, got -1")])  # fmt: skip
def test_a_range_error_from_the_config_file_names_it(run_cli, tiny_data, tmp_path, line, says):
    toml = tmp_path / "c.toml"
    toml.write_text(f'data = "{tiny_data}"\n{line}\n')
    rc, _, err = run_cli("train", "--config", toml, "--steps", 5, "--out", tmp_path / "r")
    key = line.split(" = ")[0]
    assert one_line(rc, err) == (
        f"{says} ({line} is from {toml}, not the command line: change it there, or give --{key} another value on "
        "the command line)"
    )


def test_bench_modes_without_full_says_n_a_for_its_ratios(run_cli, tmp_path):
    rc, _, err = run_cli("bench", "modes", "--quick", "--modes", "lru", "--stores", "memory", "--out", tmp_path / "b")
    assert rc == 0, err
    [row] = [ln for ln in (tmp_path / "b" / "results.md").read_text().splitlines() if ln.startswith("| lru/memory")]
    assert "nan" not in row and row.count("n/a") >= 3, row


def test_a_finished_run_without_a_final_checkpoint_is_complete(run_cli, tiny_data, tmp_path):
    """`--resume` of a finished `--no-final-checkpoint` run trained its last steps again and
    replaced its summary's figures; it is complete, and `--resume-from` says how to do it."""
    run = tmp_path / "run"
    argv = ("train", "--data", tiny_data, "--batch-size", 64, "--steps", 20, "--checkpoint-every", 15,
            "--no-final-checkpoint", "--no-progress", "--out", run)  # fmt: skip
    rc, _, err = run_cli(*argv)
    assert rc == 0, err
    before = (run / "summary.json").read_bytes()
    rc, _, err = run_cli(*argv, "--resume")
    assert one_line(rc, err) == (
        f"{run} is complete: it trained to step 20 (summary.json; its latest checkpoint is step 15, "
        "--no-final-checkpoint) and --steps is 20; give a larger --steps (or --epochs) to train further, or "
        "--resume-from 15 to train steps 16-20 again (its summary is then replaced)"
    )
    assert (run / "summary.json").read_bytes() == before
    rc, _, err = run_cli(*argv, "--resume", "--steps", 25)  # the last --steps wins: further is fine
    assert rc == 0, err


def test_an_unknown_option_is_never_offered_an_option_the_scenario_refuses(run_cli, tmp_path):
    """`bench sweep --cache-budget-mb` offered `--hot-budget-mb`, another scenario's option
    that sweep then refused."""
    rc, _, err = run_cli("bench", "sweep", "--quick", "--cache-budget-mb", 1, "--out", tmp_path / "b")
    assert one_line(rc, err, "bench sweep") == (
        "unrecognized arguments: --cache-budget-mb 1 (see bagpipe bench sweep --help)"
    )
    rc, _, err = run_cli("bench", "oracle", "--quick", "--hot-budgte-mb", 1, "--out", tmp_path / "b")
    assert one_line(rc, err, "bench oracle").endswith(
        "; did you mean --hot-budget-mb? (see bagpipe bench oracle --help)"
    )


def test_a_local_job_refuses_cuda_without_one_before_any_role_starts(run_cli, tiny_data, tmp_path):
    """It started every role, a trainer refused, the folder stayed half-made (and with
    --max-restarts the job restarted on it); one process refused at once."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU: --device cuda is not refused here")
    rc, _, err = run_cli("train", "--data", tiny_data, "--batch-size", 64, "--steps", 4, "--mode", "lookahead",
                         "--device", "cuda", "--trainers", 2, "--servers", 1, "--out", tmp_path / "job")  # fmt: skip
    assert one_line(rc, err).startswith("--device cuda: this torch (") and "use --device cpu" in err
    assert list(tmp_path.iterdir()) == []


def test_a_data_set_replaced_while_a_run_reads_it_is_said_so_not_damaged(run_cli, tmp_path):
    """`synth`/`preprocess --overwrite` of a data set a run was training on: the run ended
    "damaged data set file ... (truncated)" and `bagpipe check` found nothing damaged."""
    from bagpipe.data.shards import Dataset
    from bagpipe.errors import DataError

    data = tmp_path / "d"
    rc, _, err = run_cli("synth", "--profile", "tiny", "--samples", 3000, "--out", data, "--no-progress")
    assert rc == 0, err
    ds = Dataset(data)  # as a run opens it at its start
    ds.shard("train", 0)
    rc, _, err = run_cli("synth", "--profile", "tiny", "--samples", 500, "--out", data, "--overwrite", "--no-progress")
    assert rc == 0, err
    with pytest.raises(DataError) as e:
        ds.shard("eval", 0)  # read only now: the new data set's file
    assert str(e.value).startswith(f"{data} was replaced while this run read it (its meta.json is not the one")
    rc, out, _ = run_cli("check", data)
    assert rc == 0  # the new data set is whole
