"""The 22nd newcomer round's findings (issue 32), each with nothing of the user's changed:

* `bench SCENARIO --out` of another scenario's results replaced them (and left their
  picture beside the new results): refused in one line;
* a refusal of a setting that came from `--config` named it as a command-line option the
  user never typed: it says the file and the key, and how to change it;
* `plot` with more than ten runs reused colours and its legends covered the curves (cut
  off at forty): a colour and line style a run, one legend below the panels.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from runs import one_line

pytestmark = pytest.mark.integration


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_bench_does_not_replace_another_scenarios_results(run_cli, tmp_path):
    out = tmp_path / "bo"
    rc, _, err = run_cli("bench", "oracle", "--quick", "--out", out)
    assert rc == 0, err
    before = snapshot(out)
    rc, _, err = run_cli("bench", "modes", "--quick", "--out", out)
    assert one_line(rc, err, "bench") == (
        f"--out {out} holds the results of bench oracle; bench modes would replace them: choose another --out "
        "(bench oracle run there again replaces them)"
    )
    assert snapshot(out) == before


def test_a_refused_setting_from_the_config_file_names_the_file(run_cli, tiny_data, tmp_path):
    toml = tmp_path / "a.toml"
    toml.write_text(
        f'[data]\ndata = "{tiny_data}"\nbatch_size = 64\n[cache]\nmode = "lookahead"\nstore = "disk"\n'
        f'[run]\nsteps = 4\nout = "{tmp_path / "r"}"\nresume = true\n'
    )
    for command in ("train", "plan"):
        rc, _, err = run_cli(command, "--config", toml, "--mode", "full", "--no-resume")
        assert one_line(rc, err, command) == (
            '--store does not apply to --mode full: every row is in this process\'s memory (store = "disk" is '
            f"from {toml}, not the command line: change it there, or give --store another value on the command line)"
        )
    rc, _, err = run_cli("train", "--config", toml)
    assert one_line(rc, err).endswith(
        f"(resume = true is from {toml}, not the command line: change it there, or give --no-resume on the command line)"
    )
    rc, _, err = run_cli("train", "--config", toml, "--mode", "full", "--store", "disk", "--no-resume")
    assert "is from" not in err  # given on the command line: nothing to point at
    assert not (tmp_path / "r").exists()


def test_plot_tells_forty_runs_apart_with_one_legend_below(run_cli, tiny_data, tmp_path):
    from bagpipe.train.plot import run_style

    styles = [tuple(sorted(run_style(i).items())) for i in range(40)]
    assert len(set(styles)) == 40
    runs = []
    for i in range(12):
        run = tmp_path / f"r{i}"
        rc, _, err = run_cli("train", "--data", tiny_data, "--out", run, "--steps", 20, "--batch-size", 64,
                             "--eval-every", 10, "--no-progress")  # fmt: skip
        assert rc == 0, err
        runs.append(run)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib's "Tight layout not applied" among them
        rc, out, err = run_cli("plot", *runs, "--out", tmp_path / "many.png")
    assert rc == 0 and (tmp_path / "many.png").stat().st_size > 0, err


@pytest.mark.parametrize("ended", [True, False], ids=["after-the-end", "mid-run"])
def test_a_local_job_stopped_after_its_end_has_ended(run_cli, tiny_data, tmp_path, caplog, monkeypatch, ended):
    """SIGTERM to a local job after trainer 0 wrote its summary and final checkpoint (the
    roles still exiting) said "stopped by SIGTERM ... run the same command with --resume",
    exit 143, and that --resume was refused as complete. It is the end of the run now; a
    stop before the end still unwinds. The launcher's roles are a stand-in: the signal's
    moment is what is tested."""
    import signal

    from bagpipe import lifeline
    from bagpipe.config.train import load_config
    from bagpipe.distributed import launch
    from bagpipe.train.rundir import RunDir

    out = tmp_path / "run"
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", out, "--steps", 10, "--batch-size", 64,
                         "--checkpoint-every", 5, "--no-progress")  # fmt: skip
    assert rc == 0, err
    summary = out / "summary.json"

    class Roles:  # trainer 0 writes its summary (after the end) or not (mid-run), then the signal comes
        def __init__(self, *args, **kwargs):
            pass

        def run(self) -> None:
            if ended:
                summary.write_bytes(summary.read_bytes())
            raise lifeline.Terminated(signal.SIGTERM)

    monkeypatch.setattr(launch, "Launcher", Roles)
    cfg = load_config(None, {"data": tiny_data, "out": str(out), "steps": 10, "batch_size": 64, "mode": "lookahead",
                             "trainers": 2, "servers": 1, "resume": True})  # fmt: skip
    caplog.set_level("INFO")
    if not ended:
        with pytest.raises(lifeline.Terminated):
            launch._run_job(cfg, RunDir(out), None)
        return
    assert launch._run_job(cfg, RunDir(out), None)["steps"] == 10
    assert any(
        r.getMessage() == "[launcher] stopped by SIGTERM after the run had ended; its summary and final checkpoint "
        "are written"
        for r in caplog.records
    ), [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("command", ["train", "plan"])
def test_config_given_twice_is_refused(run_cli, tmp_path, command):
    """`--config a.toml --config b.toml` read only b.toml without a word."""
    rc, _, err = run_cli(command, "--config", tmp_path / "a.toml", "--config", tmp_path / "b.toml")
    assert one_line(rc, err, command) == (
        f"--config given twice ({tmp_path / 'a.toml'} and {tmp_path / 'b.toml'}): one settings file is read; merge "
        f"them into one (command-line options win over it) (see bagpipe {command} --help)"
    )
