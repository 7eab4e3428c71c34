"""`bagpipe train` and `bagpipe eval`, driven in-process through ``bagpipe.cli.main``.

What this proves (``--mode full`` on the shared ``tiny`` dataset):
* a run writes RUN/summary.json with the documented keys, RUN/metrics.jsonl with one
  JSON object per line (the last one the final evaluation), RUN/config.json, and the
  same summary at ``--summary-json PATH``;
* every model (dlrm, deepfm, wide_deep, dcn) learns: eval AUC > 0.6 after 200 steps;
* runs are reproducible: the same config twice gives the same params_sha256, another
  seed a different one;
* resume is exact: N steps + ``--resume --steps 2N`` (after a clean stop, or after a
  simulated crash at step N+5 with ``--checkpoint-every N``) ends with the params_sha256
  of one 2N-step run; a new run refuses a directory that already has checkpoints
  (exit 2, one line) and ``--resume`` without a checkpoint fails cleanly; a leftover
  ``.tmp-step-...`` directory from a crash mid-checkpoint is ignored and LATEST's
  checkpoint is used; LATEST naming a missing checkpoint is a clean error;
* ``bagpipe eval`` reproduces the summary's eval AUC and log loss (to 1e-6);
* a loss that explodes stops the run at once: exit 2, one line naming the step, no
  checkpoint of the blown-up parameters, no summary;
* bad configuration (bad numbers, missing or unfinished data, bad TOML, a batch larger
  than the split) fails at start-up with exit code 2 and one line on stderr, no
  traceback; a TOML ``--config`` supplies settings and the command line overrides them;
* ``bagpipe --help`` and ``bagpipe train --help`` exit 0 and name the modes.

The models are tiny, so torch runs single-threaded in this module (10x faster on a busy
2-core host); the previous thread count is restored afterwards.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bagpipe.train.step import STEPS

B = 128
COMMON = ("--batch-size", B, "--optimizer", "adagrad", "--lr", 0.05, "--no-progress")
SUMMARY_KEYS = {
    "steps", "samples", "samples_per_s", "train_logloss", "eval_logloss", "eval_auc",
    "params_sha256", "peak_rss_mb",
}  # fmt: skip


pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]


def read_json(path) -> dict:
    return json.loads(Path(path).read_text())


def train_ok(run_cli, data, out, *args) -> dict:
    """Run ``bagpipe train`` (COMMON settings, then args); assert success; return the summary."""
    rc, stdout, stderr = run_cli("train", "--data", data, "--out", out, *COMMON, *args)
    assert rc == 0, stderr
    return read_json(Path(out) / "summary.json")


def assert_one_line_error(rc: int, stderr: str, *fragments: str) -> None:
    assert rc == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("bagpipe ") and ": error: " in lines[0], stderr
    assert "Traceback" not in stderr
    for f in fragments:
        assert f in lines[0], (f, stderr)


# --------------------------------------------------------------------------- outputs


@pytest.fixture(scope="module")
def dlrm_run(tiny_data, tmp_path_factory):
    """A finished 60-step DLRM run shared by the read-only tests below."""
    from bagpipe.cli import main

    root = tmp_path_factory.mktemp("dlrm")
    out, extra = root / "run", root / "elsewhere" / "summary.json"
    rc = main(["train", "--data", tiny_data, "--out", str(out), *map(str, COMMON), "--steps", "60",
               "--eval-every", "20", "--summary-json", str(extra)])  # fmt: skip
    assert rc == 0
    return out, extra


def test_train_writes_summary_metrics_and_config(dlrm_run, tiny_data):
    out, extra = dlrm_run
    s = read_json(out / "summary.json")
    assert SUMMARY_KEYS <= set(s)
    assert s["steps"] == 60 and s["samples"] == 60 * B and s["mode"] == "full" and s["model"] == "dlrm"
    assert len(s["params_sha256"]) == 64 and int(s["params_sha256"], 16) >= 0
    assert 0 < s["eval_logloss"] < 1 and 0.5 < s["eval_auc"] <= 1 and 0 < s["train_logloss"] < 1
    assert s["samples_per_s"] > 0 and s["peak_rss_mb"] > 0
    assert extra.read_text() == (out / "summary.json").read_text()
    lines = (out / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert all(isinstance(r, dict) and isinstance(r["step"], int) for r in records)
    assert [r["step"] for r in records if "loss" in r] == [1, 10, 20, 30, 40, 50, 60]  # the first step, then every 10
    evals = [r for r in records if "eval_auc" in r]
    assert [r["step"] for r in evals] == [20, 40, 60]
    assert evals[-1]["eval_auc"] == s["eval_auc"] and evals[-1]["eval_logloss"] == s["eval_logloss"]
    conf = read_json(out / "config.json")
    assert conf["train"]["run"]["steps"] == 60 and conf["train"]["data"]["data"] == tiny_data
    assert conf["model"]["embedding_dim"] > 0
    assert (out / "checkpoints" / "LATEST").read_text().strip() == "step-00000060"


def test_train_prints_a_result_line(run_cli, tiny_data, tmp_path):
    rc, stdout, stderr = run_cli("train", "--data", tiny_data, "--out", tmp_path / "r", *COMMON, "--steps", 5)
    assert rc == 0, stderr
    assert "5 steps" in stdout and "eval AUC" in stdout and str(tmp_path / "r") in stdout


def test_eval_matches_summary(run_cli, dlrm_run, tiny_data):
    out, _ = dlrm_run
    s = read_json(out / "summary.json")
    rc, stdout, stderr = run_cli("eval", "--run", out, "--data", tiny_data, "--json")
    assert rc == 0, stderr
    ev = json.loads(stdout)
    assert ev["step"] == 60 and ev["eval_samples"] == 2400
    assert ev["eval_auc"] == pytest.approx(s["eval_auc"], abs=1e-6)
    assert ev["eval_logloss"] == pytest.approx(s["eval_logloss"], abs=1e-6)
    rc, stdout, stderr = run_cli("eval", "--run", out, "--data", tiny_data, "--batch-size", 500)
    assert rc == 0, stderr
    assert f"eval AUC {s['eval_auc']:.4f}" in stdout and f"eval logloss {s['eval_logloss']:.4f}" in stdout


def test_eval_errors_are_one_line(run_cli, tiny_data, tmp_path):
    rc, _, err = run_cli("eval", "--run", tmp_path, "--data", tiny_data)
    assert_one_line_error(rc, err, "not a bagpipe run directory")


# --------------------------------------------------------------------------- learning, determinism


@pytest.mark.parametrize("model", ["dlrm", "deepfm", "wide_deep", "dcn"])
def test_every_model_learns(run_cli, tiny_data, tmp_path, model):
    s = train_ok(run_cli, tiny_data, tmp_path / "run", "--model", model, "--steps", 200)
    assert s["model"] == model
    assert s["eval_auc"] > 0.6, s


def test_same_config_same_digest_other_seed_other_digest(run_cli, tiny_data, tmp_path):
    args = ("--model", "deepfm", "--steps", 25, "--seed", 3)
    a = train_ok(run_cli, tiny_data, tmp_path / "a", *args)
    b = train_ok(run_cli, tiny_data, tmp_path / "b", *args)
    c = train_ok(run_cli, tiny_data, tmp_path / "c", *args[:-1], 4)
    assert a["params_sha256"] == b["params_sha256"]
    assert a["eval_auc"] == b["eval_auc"] and a["train_logloss"] == b["train_logloss"]
    assert c["params_sha256"] != a["params_sha256"]


# --------------------------------------------------------------------------- resume, checkpoints

N = 30


@pytest.fixture(scope="module")
def straight(tiny_data, tmp_path_factory) -> dict:
    """Summary of one uninterrupted 2N-step DCN run."""
    from bagpipe.cli import main

    out = tmp_path_factory.mktemp("straight") / "run"
    assert (
        main(
            [
                "train",
                "--data",
                tiny_data,
                "--out",
                str(out),
                *map(str, COMMON),
                "--model",
                "dcn",
                "--steps",
                str(2 * N),
            ]
        )
        == 0
    )
    return read_json(out / "summary.json")


def test_resume_after_clean_stop_is_exact(run_cli, tiny_data, tmp_path, straight):
    out = tmp_path / "run"
    first = train_ok(run_cli, tiny_data, out, "--model", "dcn", "--steps", N, "--checkpoint-every", N)
    assert first["steps"] == N
    s = train_ok(run_cli, tiny_data, out, "--model", "dcn", "--steps", 2 * N, "--resume")
    assert s["steps"] == 2 * N and s["steps_this_run"] == N and s["samples"] == N * B
    assert s["params_sha256"] == straight["params_sha256"]
    assert s["eval_auc"] == straight["eval_auc"]


def test_resume_after_crash_is_exact(run_cli, tiny_data, tmp_path, straight, monkeypatch):
    out = tmp_path / "run"
    calls = {"n": 0}
    real_step = STEPS["plain"]

    def crashing_step(*a, **kw):
        calls["n"] += 1
        if calls["n"] == N + 5:
            raise KeyboardInterrupt  # "the machine died" between checkpoints
        return real_step(*a, **kw)

    monkeypatch.setitem(STEPS, "plain", crashing_step)
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", out, *COMMON, "--model", "dcn",
                         "--steps", 2 * N, "--checkpoint-every", N)  # fmt: skip
    assert rc == 130 and "interrupted" in err
    assert not (out / "summary.json").exists()
    assert (out / "checkpoints" / "LATEST").read_text().strip() == f"step-{N:08d}"
    monkeypatch.setitem(STEPS, "plain", real_step)

    # a fresh start in the same directory is refused, and leaves the checkpoint alone
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", out, *COMMON, "--model", "dcn", "--steps", 2 * N)
    assert_one_line_error(rc, err, "--resume")
    assert (out / "checkpoints" / "LATEST").read_text().strip() == f"step-{N:08d}"

    s = train_ok(run_cli, tiny_data, out, "--model", "dcn", "--steps", 2 * N, "--checkpoint-every", N, "--resume")
    assert s["steps"] == 2 * N and s["steps_this_run"] == N
    assert s["params_sha256"] == straight["params_sha256"]


def test_a_loss_that_explodes_stops_the_run_in_one_line_naming_the_step(run_cli, tiny_data, tmp_path):
    from bagpipe.train.guards import Diverged, StepGuard

    out = tmp_path / "run"
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", out, "--batch-size", 64, "--optimizer", "sgd",
                         "--lr", 1000, "--steps", 30, "--checkpoint-every", 1, "--no-progress")  # fmt: skip
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, err
    found = re.fullmatch(
        r"bagpipe train: error: training diverged at step (\d+): the loss (is nan|has stayed above 100 for 5 steps "
        r"\(it is \S+\)); stopped without checkpointing it \(the run's latest checkpoint, if any, is from before\); "
        r"start again with a lower --lr / --embedding-lr, or check the data with `bagpipe check`",
        lines[0],
    )
    assert found, lines[0]
    step = int(found.group(1))
    assert (out / "checkpoints" / "LATEST").read_text().strip() == f"step-{step - 1:08d}"  # the last good one
    assert not (out / "summary.json").exists()
    guard = StepGuard()  # a spike that training recovers from is no divergence (DLRM, Adagrad: 1,752 at step 2)
    for k, loss in enumerate([0.69, 1752.0, 0.71, 7.9, 0.83, 0.61] + [150.0] * 4, start=1):
        guard.check(k, loss)
    with pytest.raises(Diverged, match="^training diverged at step 11: the loss has stayed above 100 for 5 steps"):
        guard.check(11, 7.7e11)


def test_resume_without_checkpoint_fails_cleanly(run_cli, tiny_data, tmp_path):
    for out in (tmp_path / "empty", tmp_path / "missing"):
        if out.name == "empty":
            out.mkdir()
        rc, _, err = run_cli("train", "--data", tiny_data, "--out", out, *COMMON, "--steps", 5, "--resume")
        assert_one_line_error(rc, err, "no checkpoint")
        assert not (out / "summary.json").exists()


def test_leftover_tmp_checkpoint_is_ignored(run_cli, tiny_data, tmp_path, straight):
    out = tmp_path / "run"
    train_ok(run_cli, tiny_data, out, "--model", "dcn", "--steps", N)
    ckpts = out / "checkpoints"
    good = ckpts / f"step-{N:08d}"
    assert (ckpts / "LATEST").read_text().strip() == good.name
    # a crash while writing the step-2N checkpoint: half a temp directory, LATEST untouched
    tmp = ckpts / f".tmp-step-{2 * N:08d}"
    tmp.mkdir()
    (tmp / "rows-0-of-1.npy").write_bytes(b"\x93NUMPY garbage, the write was cut short")
    rc, stdout, err = run_cli("eval", "--run", out, "--data", tiny_data, "--json")
    assert rc == 0, err
    assert json.loads(stdout)["step"] == N
    s = train_ok(run_cli, tiny_data, out, "--model", "dcn", "--steps", 2 * N, "--resume")
    assert s["params_sha256"] == straight["params_sha256"]
    assert (ckpts / "LATEST").read_text().strip() == f"step-{2 * N:08d}"
    assert not tmp.exists()
    assert sorted(p.name for p in ckpts.iterdir()) == ["LATEST", good.name, f"step-{2 * N:08d}"]


def test_latest_naming_a_missing_checkpoint_is_a_clean_error(run_cli, tiny_data, tmp_path):
    out = tmp_path / "run"
    train_ok(run_cli, tiny_data, out, "--steps", 5)
    shutil.rmtree(out / "checkpoints" / "step-00000005")
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", out, *COMMON, "--steps", 10, "--resume")
    assert_one_line_error(rc, err, "step-00000005")
    rc, _, err = run_cli("eval", "--run", out, "--data", tiny_data)
    assert_one_line_error(rc, err, "step-00000005")


# --------------------------------------------------------------------------- bad configuration


@pytest.fixture
def unfinished_data(tmp_path) -> Path:
    """A dataset directory with shards but no meta.json (a generator that died)."""
    d = tmp_path / "unfinished"
    (d / "train" / "00000").mkdir(parents=True)
    (d / "train" / "00000" / "labels.npy").write_bytes(b"")
    return d


BAD = {
    "batch-size-0": (("--batch-size", 0), "batch size"),
    "lr-negative": (("--lr", -1), "learning rate"),
    "steps-0": (("--steps", 0), "steps"),
    "eval-every-negative": (("--eval-every", -5), "eval_every"),
    "batch-larger-than-split": (("--batch-size", 100_000), "exceeds"),
}


@pytest.mark.parametrize("args,fragment", BAD.values(), ids=BAD.keys())
def test_bad_numbers_fail_at_startup(run_cli, tiny_data, tmp_path, args, fragment):
    rc, stdout, err = run_cli("train", "--data", tiny_data, "--out", tmp_path / "run", *COMMON, "--steps", 5, *args)
    assert_one_line_error(rc, err, fragment)
    assert not (tmp_path / "run" / "config.json").exists()


def test_unknown_model_is_an_argparse_error(run_cli, tiny_data, tmp_path):
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", tmp_path / "run", "--model", "transformer")
    assert rc == 2 and "invalid choice" in err and "Traceback" not in err


def test_missing_and_unfinished_data(run_cli, tmp_path, unfinished_data):
    rc, _, err = run_cli("train", "--data", tmp_path / "nope", "--out", tmp_path / "r1", *COMMON, "--steps", 5)
    assert_one_line_error(rc, err, "no such dataset directory")
    rc, _, err = run_cli("train", "--data", unfinished_data, "--out", tmp_path / "r2", *COMMON, "--steps", 5)
    assert_one_line_error(rc, err, "meta.json", "not a finished")
    rc, _, err = run_cli("train", "--out", tmp_path / "r3", *COMMON, "--steps", 5)
    assert_one_line_error(rc, err, "--data is required")
    # without --steps (one epoch, read from meta.json): the same reason, not "no meta.json" (newcomer round 16)
    rc, _, err = run_cli("train", "--data", tmp_path / "nope", "--out", tmp_path / "r4", *COMMON)
    assert_one_line_error(rc, err, f"{tmp_path / 'nope'}: no such dataset directory")
    rc, _, err = run_cli("train", "--data", unfinished_data, "--out", tmp_path / "r5", *COMMON)
    assert_one_line_error(rc, err, "not a finished bagpipe dataset (no meta.json), so one epoch's steps are unknown")


def test_bad_config_files(run_cli, tiny_data, tmp_path):
    unknown = tmp_path / "unknown.toml"
    unknown.write_text(f'data = "{tiny_data}"\nsteps = 5\nbatch_sise = 64\n')
    rc, _, err = run_cli("train", "--config", unknown, "--out", tmp_path / "r")
    assert_one_line_error(rc, err, str(unknown), "unknown key", "batch_sise", "did you mean 'batch_size'")
    broken = tmp_path / "broken.toml"
    broken.write_text("steps = = 5\n")
    rc, _, err = run_cli("train", "--config", broken, "--data", tiny_data, "--out", tmp_path / "r")
    assert_one_line_error(rc, err, str(broken))
    rc, _, err = run_cli("train", "--config", tmp_path / "absent.toml", "--data", tiny_data, "--out", tmp_path / "r")
    assert_one_line_error(rc, err, "not found")


SECTIONED = """
[data]
data = "{data}"
batch_size = 64
[arch]
model = "wide_deep"
[optim]
lr = 0.1
optimizer = "sgd"
[run]
out = "{out}"
steps = 40
seed = 4
progress = false
"""


@pytest.mark.parametrize("layout", ["train-table", "top-level", "sections"])
def test_config_file_with_command_line_overrides(run_cli, tiny_data, tmp_path, layout):
    out = tmp_path / "run"
    conf = tmp_path / "run.toml"
    body = (
        f'data = "{tiny_data}"\nout = "{out}"\nmodel = "wide_deep"\nsteps = 40\nbatch_size = 64\n'
        'lr = 0.1\nseed = 4\nprogress = false\noptimizer = "sgd"\n'
    )
    text = {
        "train-table": "[train]\n" + body,
        "top-level": body,
        "sections": SECTIONED.format(data=tiny_data, out=out),
    }[layout]
    conf.write_text(text)
    rc, _, err = run_cli("train", "--config", conf, "--steps", 12, "--seed", 9)
    assert rc == 0, err
    s = read_json(out / "summary.json")
    assert s["steps"] == 12 and s["samples"] == 12 * 64  # the command line won
    assert s["model"] == "wide_deep" and s["batch_size"] == 64 and s["optimizer"] == "sgd"  # the file's
    t = read_json(out / "config.json")["train"]
    got = (t["run"]["seed"], t["run"]["steps"], t["optim"]["lr"], t["data"]["batch_size"], t["arch"]["model"])
    assert got == (9, 12, 0.1, 64, "wide_deep")


def test_config_file_key_in_the_wrong_table(run_cli, tiny_data, tmp_path):
    conf = tmp_path / "run.toml"
    conf.write_text(f'[run]\nsteps = 3\nbatch_size = 16\n[data]\ndata = "{tiny_data}"\n')
    rc, _, err = run_cli("train", "--config", conf, "--out", tmp_path / "r")
    assert_one_line_error(rc, err, str(conf), "'batch_size' belongs in [data], not [run]")


@pytest.mark.parametrize("setting", ["steps = 2.5", "batch_size = 64.0", "steps = true", 'seed = "1"'])
def test_config_file_values_of_the_wrong_type_fail_at_startup(run_cli, tiny_data, tmp_path, setting):
    conf = tmp_path / "run.toml"
    lines = {"steps": "steps = 3", "batch_size": "batch_size = 16", "seed": "seed = 0"}
    lines[setting.split()[0]] = setting
    conf.write_text(
        f'data = "{tiny_data}"\nout = "{tmp_path / "run"}"\nprogress = false\n' + "\n".join(lines.values()) + "\n"
    )
    rc, _, err = run_cli("train", "--config", conf)
    assert_one_line_error(rc, err)


# --------------------------------------------------------------------------- help


def test_help_texts(run_cli):
    rc, out, _ = run_cli("--help")
    assert rc == 0
    assert "train" in out and "eval" in out and "lookahead" in out
    rc, out, _ = run_cli("train", "--help")
    assert rc == 0
    assert "--mode" in out
    for mode in ("full", "nocache", "lru", "lookahead"):
        assert mode in out
    rc, out, _ = run_cli()
    assert rc == 2 and "usage: bagpipe" in out


@pytest.mark.integration
@pytest.mark.parametrize(
    "argv, shows",
    [
        (["--version"], "bagpipe 0."),
        (["--help"], "train a model"),
        ([], "Run `bagpipe COMMAND --help`"),
        (["train", "--help"], "--steps"),
        (["eval", "--help"], "--run"),
    ],
)
def test_version_and_help_import_no_command_but_their_own(argv, shows):
    """`bagpipe --version` / `--help` import no command module (torch alone takes seconds to
    import); `bagpipe COMMAND --help` only its own."""
    probe = (
        "import sys\n"
        "from bagpipe.cli import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('bagpipe.commands.'))\n"
        "print('torch' in sys.modules, ','.join(loaded), file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    torch_loaded, _, loaded = done.stderr.strip().splitlines()[-1].partition(" ")
    assert torch_loaded == "False", done.stderr
    command = argv[0] if argv and not argv[0].startswith("-") else None
    assert loaded == (f"bagpipe.commands.{command}" if command else ""), loaded
    assert shows in done.stdout, done.stdout
