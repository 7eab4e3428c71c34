"""Distributed training with real processes on loopback (gloo), in bounded time.

* N in {1, 2} trainers x S in {1, 2} embedding servers, SGD and Adagrad: the final
  parameters (dense + every embedding row + optimizer state) are within 1e-5 relative
  of ``--mode full`` on one process with the same global batch; with one trainer they
  are bitwise equal (nothing is averaged, the same float operations run). The trainers
  of this matrix compute on the asynchronous CPU twin (``--device cpu-async``): their
  rows reach and leave the cache through the GPU path's staged copies, and the summary
  names the device and the trainers' collectives' backend (gloo here). Row-wise Adam
  (2D state floats per row on the servers, in the caches and the checkpoint) with a
  warm-up schedule on 2 x 2 too. So is a 2 x 2
  job with a hot tier (hot rows on every trainer, planned by nobody), within tolerance.
* cDLRM's periodic averaging (``--cache-sync periodic:1``) with SGD ends within 1e-5 of
  ``--mode full`` too, and all-reduces the exact partitioned cache's bytes; it is marked
  approximate in the summary.
* The baselines across servers: ``--mode nocache`` (2 trainers x 1 server) and
  ``--mode lru`` (2 x 2, under ``slow``), whose plans run synchronously, are within
  1e-5 of ``--mode full``.
* Two identical distributed runs end with the same params_sha256.
* Killing one server mid-run stops every other role within 30 s with an error naming
  it; Ctrl-C (SIGINT to the launcher, also one that inherited SIGINT ignored, as ``cmd &``
  in a script starts it) and SIGTERM stop them all, exit 130 / 143, with the one line a
  one-process run ends with (its latest checkpoint and ``--resume``); ``nohup``'s ignored
  SIGHUP stays ignored; no process is left behind.
* A role that refuses on its own (a cache too small for a batch) makes the launcher's one
  line, naming that role and quoting its reason (not a role that only lost contact with
  it), and the line is in the role's log.

Every job is started through the command line, as a user would, and every process
it started is checked to be gone afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from runs import last_checkpoint, outputs, stopped_at_end

from bagpipe.config.train import DATA_PARALLEL_NOT_EXACT, TrainConfig
from bagpipe.train.loop import train

STEPS = 24
BATCH = 256
EVAL_EVERY = 8
JOB_TIMEOUT = 180

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]


def bagpipe(*args, timeout=JOB_TIMEOUT, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bagpipe.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def role_pids(run: Path) -> dict[str, int]:
    return {r["role"]: r["pid"] for r in json.loads((run / "roles.json").read_text())}


def assert_all_stopped(run: Path, within: float = 15.0) -> None:
    pids = role_pids(run)
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and any(alive(p) for p in pids.values()):
        time.sleep(0.2)
    left = {name: pid for name, pid in pids.items() if alive(pid)}
    for pid in left.values():
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left running: {left}"


# settings beside --optimizer for some optimizers (the same for the reference and the job)
# (Adam's dense step is lr-sized whatever the gradient: 0.01 keeps it at the scale of the others)
OPTIM_EXTRA = {"adam": {"lr": 0.01, "lr_schedule": "warmup-poly", "lr_warmup_steps": 8}}


def common(data: str, optimizer: str) -> list:
    settings = {"lr": 0.05} | OPTIM_EXTRA.get(optimizer, {})
    extra = [a for k, v in settings.items() for a in ("--" + k.replace("_", "-"), v)]
    return [
        "--data",
        data,
        "--steps",
        STEPS,
        "--batch-size",
        BATCH,
        "--optimizer",
        optimizer,
        "--threads",
        1,
        "--no-progress",
        "--cache-rows",
        1500,
        "--lookahead",
        4,
        *extra,
    ]


@pytest.fixture(scope="module")
def full_runs(tiny_data, tmp_path_factory):
    """--mode full on one process (one thread, as each distributed role uses)."""
    cache = {}

    def get(optimizer: str) -> Path:
        if optimizer not in cache:
            out = tmp_path_factory.mktemp(f"full-{optimizer}")
            settings = {"lr": 0.05} | OPTIM_EXTRA.get(optimizer, {})
            train(
                TrainConfig.of(
                    data=tiny_data,
                    out=str(out),
                    steps=STEPS,
                    batch_size=BATCH,
                    optimizer=optimizer,
                    threads=1,
                    progress=False,
                    eval_every=EVAL_EVERY,
                    **settings,
                )
            )
            cache[optimizer] = out
        return cache[optimizer]

    return get


def params(run: Path) -> dict[str, np.ndarray]:
    ck = last_checkpoint(run)
    out = {f"dense/{k}": v.numpy() for k, v in ck.dense["model"].items()}
    out["emb/weights"], out["emb/state"] = ck.reader().arrays()
    return out


def assert_close(a: dict, b: dict, rel: float = 1e-5) -> None:
    """Every tensor within ``rel`` of the reference, relative to the tensor's scale.

    Scale-relative (max |a-b| <= rel * max |b|, and the same for the L2 norm) rather
    than element-relative: Adagrad divides by the root of the accumulated squared
    gradient, so an element whose gradients are all ~0 moves by lr * sign(g), and the
    last-bit difference of an averaged ~0 gradient shows as a large *element* ratio.
    """
    assert a.keys() == b.keys()
    for k in b:
        assert a[k].shape == b[k].shape, k
        if b[k].size == 0:  # SGD keeps no row state
            continue
        d = np.abs(a[k].astype(np.float64) - b[k])
        scale = max(float(np.abs(b[k]).max()), 1e-12)
        assert d.max() <= rel * scale, f"{k}: max |diff| {d.max():.3g} > {rel} x {scale:.3g}"
        assert np.linalg.norm(d) <= rel * max(float(np.linalg.norm(b[k])), 1e-12), k


def run_distributed(data, out, optimizer, trainers, servers, *extra) -> dict:
    r = bagpipe(
        "train",
        *common(data, optimizer),
        "--out",
        out,
        "--mode",
        "lookahead",
        "--trainers",
        trainers,
        "--servers",
        servers,
        *extra,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert_all_stopped(Path(out))
    return json.loads((Path(out) / "summary.json").read_text())


# make test keeps one bitwise layout (1 x 2) and both 2 x 2 runs; the rest of the
# matrix runs with make test-slow (1 x 1 and 2 x 1 also run in test_recovery.py's resumes)
MATRIX = [
    pytest.param(
        optimizer,
        t,
        s,
        marks=[] if (t, s, optimizer) in {(1, 2, "adagrad"), (2, 2, "adagrad")} else [pytest.mark.slow],
        id=f"{t}-{s}-{optimizer}",
    )
    for t, s in [(1, 1), (1, 2), (2, 1), (2, 2)]
    for optimizer in ("sgd", "adagrad")
]


@pytest.mark.parametrize("optimizer,trainers,servers", MATRIX)
def test_distributed_matches_full(tiny_data, full_runs, tmp_path, optimizer, trainers, servers):
    ref = full_runs(optimizer)
    out = tmp_path / "dist"
    extra = ("--eval-every", EVAL_EVERY) if (trainers, servers) == (2, 2) else ()
    s = run_distributed(tiny_data, out, optimizer, trainers, servers, "--device", "cpu-async", *extra)
    assert s["steps"] == STEPS and s["distributed"]["trainers"] == trainers and s["distributed"]["servers"] == servers
    assert s["device"].startswith("cpu-async") and s["distributed"]["trainer_backend"] == (
        "gloo" if trainers > 1 else "none"
    )
    assert_close(params(out), params(ref))
    full = json.loads((ref / "summary.json").read_text())
    if (trainers, servers) == (2, 2):  # the run directory is a normal one: bagpipe eval reads it
        r = bagpipe("eval", "--run", out, "--data", tiny_data, "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["eval_logloss"] == pytest.approx(s["eval_logloss"], abs=1e-6)
        assert_same_run_files(out, ref, tmp_path, tiny_data, optimizer)
    if trainers == 1:  # nothing averaged: the same float operations as the reference
        assert s["params_sha256"] == full["params_sha256"]
        assert s["distributed"]["sync_bytes_per_step"] == 0
        assert s["exact"] is True and s["not_exact"] == []
    else:  # summed by the all-reduce in another order: within tolerance, and the summary says so
        assert s["exact"] is False and s["not_exact"] == [DATA_PARALLEL_NOT_EXACT.format(trainers=trainers)]
        d = s["distributed"]
        assert 0 < d["sync_bytes_per_step"] < d["replicated_sync_bytes_per_step"]
    assert 1 <= s["distributed"]["max_plans_in_flight"] <= 4  # the default --plans-in-flight
    assert abs(s["eval_logloss"] - full["eval_logloss"]) < 1e-5
    assert abs(s["train_logloss"] - full["train_logloss"]) < 1e-5  # averaged over the trainers' slices
    # every role wrote its log, prefixed lines reached the launcher's output
    assert sorted(p.name for p in (out / "logs").iterdir()) == sorted(
        [f"trainer-{i}.log" for i in range(trainers)] + [f"server-{k}.log" for k in range(servers)] + ["oracle.log"]
    )


@pytest.mark.parametrize(
    "mode,trainers,servers", [("nocache", 2, 1), pytest.param("lru", 2, 2, marks=pytest.mark.slow)]
)
def test_the_baselines_across_servers_match_full(tiny_data, full_runs, tmp_path, mode, trainers, servers):
    """lru and nocache plans, executed synchronously against the servers (each step's
    label marked after its write-backs, each read held for it): the maths of --mode full,
    also when a row one trainer wrote back is read by the other at the next step."""
    ref = full_runs("adagrad")
    out = tmp_path / "dist"
    args = common(tiny_data, "adagrad")
    args = args[: args.index("--cache-rows")] + args[args.index("--lookahead") + 2 :]  # settings these modes refuse
    if mode == "lru":
        args += ["--cache-rows", 1500]
    r = bagpipe("train", *args, "--out", out, "--mode", mode, "--trainers", trainers, "--servers", servers)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert_all_stopped(out)
    s = json.loads((out / "summary.json").read_text())
    assert s["mode"] == mode and s["distributed"]["trainers"] == trainers
    assert_close(params(out), params(ref))
    assert s["cache"]["rows_fetched"] > 0


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def assert_same_run_files(dist: Path, full: Path, tmp_path: Path, data: str, optimizer: str) -> None:
    """A distributed run writes metrics.jsonl and summary.json with one process's schema;
    its evaluations every EVAL_EVERY steps (read from the servers mid-run) match the
    reference's."""
    got, want = records(dist), records(full)
    # a job of 2 trainers is not bitwise --mode full's: every record says so, as a hotline run's
    assert all(r["exact"] is False and r["not_exact"] == [DATA_PARALLEL_NOT_EXACT.format(trainers=2)] for r in got)
    assert [sorted(set(r) - {"exact", "not_exact"}) for r in got] == [sorted(r) for r in want]
    assert [r["step"] for r in got] == [r["step"] for r in want]
    evals = [(a, b) for a, b in zip(got, want) if "eval_auc" in b]
    assert [a["step"] for a, _ in evals] == [EVAL_EVERY, 2 * EVAL_EVERY, STEPS]
    for a, b in evals:
        assert abs(a["eval_logloss"] - b["eval_logloss"]) < 1e-5 and a["eval_samples"] == b["eval_samples"]
    one = tmp_path / "one-process-lookahead"  # the cache section's schema: one process, same mode
    train(
        TrainConfig.of(
            data=data,
            out=str(one),
            steps=STEPS,
            batch_size=BATCH,
            optimizer=optimizer,
            lr=0.05,
            threads=1,
            progress=False,
            mode="lookahead",
            cache_rows=1500,
            lookahead=4,
        )
    )
    s, f, o = (json.loads((r / "summary.json").read_text()) for r in (dist, full, one))
    assert s.keys() == f.keys() == o.keys()
    assert s["time_per_step_ms"].keys() == o["time_per_step_ms"].keys()
    assert s["cache"].keys() == o["cache"].keys()
    assert o["distributed"] is None and s["distributed"]["trainers"] == 2
    assert s["measured_steps"] == STEPS and s["steps_this_run"] == STEPS


def test_tiny_cache_evicts_rows_whose_sync_is_still_in_flight(tiny_data, full_runs, tmp_path):
    """A cache so small that the oracle forces rows out, often rows whose (deferred)
    synchronisation from the step before is still in flight: the trainer must finish
    it before writing them back."""
    out = tmp_path / "tiny-cache"
    s = run_distributed(tiny_data, out, "adagrad", 2, 2, "--cache-rows", 1000)
    assert s["cache"]["forced_evictions"] > 0
    assert 0 < s["distributed"]["sync_overlapped_share"] < 1
    assert_close(params(out), params(full_runs("adagrad")))


def test_adam_on_two_trainers_and_two_servers(tiny_data, full_runs, tmp_path):
    out = tmp_path / "adam"
    s = run_distributed(tiny_data, out, "adam", 2, 2)
    assert s["optimizer"] == "adam" and s["distributed"]["sync_bytes_per_step"] > 0
    assert params(out)["emb/state"].shape[1] == 2 * params(out)["emb/weights"].shape[1]
    assert_close(params(out), params(full_runs("adam")))


def test_hot_tier_on_every_trainer(tiny_data, full_runs, tmp_path):
    """A hot tier in a 2 x 2 job: the oracle role profiles and plans only the cold rows,
    every trainer holds the hot rows and synchronises them as cached rows; the result is
    that of one process on the global batch."""
    out = tmp_path / "hot"
    s = run_distributed(tiny_data, out, "adagrad", 2, 2, "--hot-budget-mb", 0.02, "--hot-sample-rate", 1)
    assert_close(params(out), params(full_runs("adagrad")))
    hot = s["cache"]["hot"]
    assert hot["rows"] == int(0.02 * 2**20) // 36 and 0.5 < hot["lookup_share"] < 1
    assert s["cache"]["unique_rows"] == hot["unique_rows"] - hot["hot_unique_rows"]  # the oracle planned cold rows only
    assert 0 < s["distributed"]["sync_overlapped_share"] < 1


def test_servers_on_disk_stores(tiny_data, full_runs, tmp_path):
    out = tmp_path / "disk"
    run_distributed(tiny_data, out, "sgd", 2, 2, "--store", "disk")
    assert_close(params(out), params(full_runs("sgd")))
    for k in range(2):  # each server keeps its own shard file, labelled with its part of the row space
        header = json.loads((out / "store" / f"shard-{k}-of-2" / "header.json").read_text())
        assert header["shard"] == f"{k}/2"


def test_the_replicated_cache_computes_the_same_and_syncs_every_row(tiny_data, full_runs, tmp_path):
    rep = run_distributed(
        tiny_data, tmp_path / "rep", "adagrad", 2, 2, "--cache-sync", "replicated", "--plans-in-flight", 1
    )
    d = rep["distributed"]
    assert d["max_plans_in_flight"] == 1  # back-pressure: the oracle never ran ahead
    assert d["sync_bytes_per_step"] > 0 and d["sync_bytes_per_step"] == pytest.approx(
        d["replicated_sync_bytes_per_step"]
    )
    assert_close(params(tmp_path / "rep"), params(full_runs("adagrad")))


def test_the_owner_exchange_computes_the_same_and_moves_fewer_rows(tiny_data, full_runs, tmp_path):
    """--cache-sync owner over 4 trainers (owners, deliveries to trainers that did not use a
    row, deferred halves, mid-run evaluations that flush every trainer's owned rows): within
    tolerance of one process, and fewer bytes than the partitioned cache's all-reduce."""
    s = run_distributed(tiny_data, tmp_path / "own", "adagrad", 4, 1, "--cache-sync", "owner")
    d = s["distributed"]
    assert d["cache_sync"] == "owner" and s["exact"] is False  # N >= 2: within tolerance, as every sync
    assert 0 < d["sync_overlapped_share"] < 1
    ring = d["partitioned_sync_bytes_per_step"] * 2 * 3 / 4  # a ring all-reduce sends 2 (N - 1) / N of the buffer
    assert 0 < d["sync_bytes_per_step"] < ring
    assert_close(params(tmp_path / "own"), params(full_runs("adagrad")))


def test_periodic_averaging_every_step_matches_full_with_sgd(tiny_data, full_runs, tmp_path):
    """cDLRM's periodic averaging with K = 1 and SGD: the average of the trainers' copies is
    the exact update, so the job ends within tolerance of full; it is still marked approximate."""
    s = run_distributed(tiny_data, tmp_path / "p1", "sgd", 2, 1, "--cache-sync", "periodic:1")
    assert s["exact"] is False and s["approximation"]["names"] == ["cache-sync periodic:1"]
    assert s["approximation"]["periodic"]["period"] == 1 and s["approximation"]["periodic"]["averagings"] > 0
    d = s["distributed"]
    # SGD keeps no row state: the same rows' D floats as the exact partitioned cache's gradients
    assert (
        d["sync_bytes_per_step"] == pytest.approx(d["partitioned_sync_bytes_per_step"]) and d["sync_bytes_per_step"] > 0
    )
    assert_close(params(tmp_path / "p1"), params(full_runs("sgd")))


@pytest.mark.slow
def test_two_identical_runs_have_equal_digests_and_replicated_syncs_more(tiny_data, tmp_path):
    a = run_distributed(tiny_data, tmp_path / "a", "adagrad", 2, 2)
    b = run_distributed(tiny_data, tmp_path / "b", "adagrad", 2, 2)
    assert a["params_sha256"] == b["params_sha256"] is not None
    rep = run_distributed(
        tiny_data, tmp_path / "rep", "adagrad", 2, 2, "--cache-sync", "replicated", "--plans-in-flight", 1
    )
    assert rep["distributed"]["max_plans_in_flight"] == 1  # back-pressure: the oracle never ran ahead
    # the same maths, more traffic: every planned row is synchronised
    assert_close(params(tmp_path / "rep"), params(tmp_path / "a"))
    assert rep["distributed"]["sync_bytes_per_step"] == pytest.approx(
        rep["distributed"]["replicated_sync_bytes_per_step"]
    )
    assert rep["distributed"]["sync_bytes_per_step"] > a["distributed"]["sync_bytes_per_step"]
    assert sum(rep["distributed"]["fetched_rows_per_trainer"]) > sum(a["distributed"]["fetched_rows_per_trainer"])


def start_long_job(data: str, out: Path, *extra, ignored: tuple[int, ...] = ()) -> subprocess.Popen:
    """A 2 x 2 job of a million steps (``extra``: more options, the last of an option
    wins). SIGINT, SIGTERM and SIGHUP start at their default action, or ignored where
    ``ignored`` names them -- as ``cmd &`` (SIGINT) or ``nohup cmd &`` (SIGINT, SIGHUP)
    in a script start a job -- whatever pytest itself inherited."""

    def dispositions() -> None:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN if sig in ignored else signal.SIG_DFL)

    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bagpipe.cli",
            "train",
            "--data",
            data,
            "--out",
            str(out),
            "--steps",
            "1000000",
            "--batch-size",
            "64",
            "--threads",
            "1",
            "--mode",
            "lookahead",
            "--trainers",
            "2",
            "--servers",
            "2",
            "--cache-rows",
            "2000",
            "--lookahead",
            "4",
            *map(str, extra),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=dispositions,
    )


def wait_for_training(out: Path, proc: subprocess.Popen, timeout: float = 90.0) -> None:
    log = out / "logs" / "trainer-0.log"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the job ended early: {proc.communicate()}")
        if log.exists() and "step " in log.read_text():
            return
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("training did not start in time")


def test_killing_a_server_stops_every_role_naming_it(tiny_data, tmp_path):
    out = tmp_path / "job"
    proc = start_long_job(tiny_data, out)
    try:
        wait_for_training(out, proc)
        os.kill(role_pids(out)["server 1"], signal.SIGKILL)
        t0 = time.monotonic()
        stdout, stderr = proc.communicate(timeout=30)
        assert time.monotonic() - t0 < 30
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2
    assert "server 1 (rank 3) failed (killed by SIGKILL)" in stderr
    # the last line also says where the run can continue, as a stop signal's does
    from bagpipe.checkpoint.folder import where_to_continue

    assert (
        stderr.strip()
        .splitlines()[-1]
        .endswith(f"; {where_to_continue(str(out))} (--max-restarts N restarts a failed role by itself)")
    )
    assert "[launcher] server 1" in stdout
    assert_all_stopped(out, within=1.0)


def test_without_the_launcher_every_role_exits_when_a_server_dies(tiny_data, tmp_path):
    """The torchrun path: roles started by hand (the environment torchrun sets; the
    servers with `bagpipe serve`), no launcher to stop them; each must notice the dead
    server (or the roles that left because of it) and exit with an error on its own,
    none hanging."""
    from bagpipe.distributed.auth import SECRET_ENV, new_secret, write_secret_file
    from bagpipe.distributed.launch import free_port

    port = free_port()
    secret = new_secret()
    secret_file = write_secret_file(tmp_path / "job.secret", secret)
    with stopped_at_end() as procs:
        for rank in range(5):
            env = dict(
                os.environ,
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                RANK=str(rank),
                WORLD_SIZE="5",
                GLOO_SOCKET_IFNAME="lo",
                OMP_NUM_THREADS="1",
            )
            if rank in (2, 3):  # the servers as a user starts them on storage machines, the secret in a file
                cmd = [
                    "serve",
                    "--rank",
                    str(rank),
                    "--trainers",
                    "2",
                    "--servers",
                    "2",
                    "--master-addr",
                    "127.0.0.1",
                    "--master-port",
                    str(port),
                    "--secret-file",
                    str(secret_file),
                ]
            else:  # the others as torchrun would, the secret in the environment
                env[SECRET_ENV] = secret.decode()
                cmd = [
                    "worker",
                    "--data",
                    tiny_data,
                    "--out",
                    str(tmp_path / "job"),
                    "--steps",
                    "1000000",
                    "--batch-size",
                    "64",
                    "--mode",
                    "lookahead",
                    "--trainers",
                    "2",
                    "--servers",
                    "2",
                    "--cache-rows",
                    "2000",
                    "--lookahead",
                    "4",
                ]
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "bagpipe.cli", *cmd],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not list(tmp_path.glob("job/config.json")):
            time.sleep(0.2)
        time.sleep(3)  # a few steps
        assert all(p.poll() is None for p in procs), "a role ended before the kill"
        procs[3].kill()  # server 1
        t0 = time.monotonic()
        results = outputs(procs, 30, t0, floor=0.1)
    codes = [p.returncode for p in procs]
    assert codes[3] == -signal.SIGKILL
    assert [c for i, c in enumerate(codes) if i != 3] == [2, 2, 2, 2], codes
    errors = "".join(err for _, err in results)
    assert "lost contact with server 1" in errors, errors
    assert "step 1/" in results[0][0]  # trainer 0 trained against the `bagpipe serve` servers


def test_a_cache_too_small_is_refused_by_the_launcher_before_any_role_starts(tiny_data, tmp_path):
    out = tmp_path / "job"
    r = bagpipe(
        "train",
        "--data",
        tiny_data,
        "--out",
        out,
        "--steps",
        5,
        "--batch-size",
        64,
        "--no-progress",
        "--mode",
        "lookahead",
        "--trainers",
        1,
        "--servers",
        1,
        "--cache-rows",
        40,
        "--threads",
        1,
    )
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    # the launcher's own memory checks (bagpipe.train.preflight.memory_checks) plan the first
    # batches as the oracle role would: the oracle's refusal, said before any role starts
    assert "cannot hold" in lines[0] and "failed: " not in lines[0] and "lost contact" not in lines[0], lines[0]
    assert not out.exists() and "[oracle, rank" not in r.stdout


def test_a_roles_own_refusal_is_the_launchers_line_and_in_its_log(tiny_data, tmp_path):
    """A refusal only a role can make, mid-run (trainer 0 reads a malformed fault-injection
    variable at its first checkpoint's cut): one line from the launcher naming the role,
    the same line in that role's log."""
    out = tmp_path / "job"
    env = dict(os.environ, BAGPIPE_TEST_PAUSE="not-a-point")
    r = bagpipe(
        "train", "--data", tiny_data, "--out", out, "--steps", 6, "--batch-size", 64, "--no-progress",
        "--mode", "lookahead", "--trainers", 1, "--servers", 1, "--cache-rows", 4000, "--threads", 1,
        "--checkpoint-every", 2,
        env=env,
    )  # fmt: skip
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "failed: " in lines[0] and "BAGPIPE_TEST_PAUSE" in lines[0] and "lost contact" not in lines[0], lines[0]
    role = lines[0].split("error: ")[1].split(" (rank")[0]  # the role that refused: trainer 0
    assert role == "trainer 0", lines[0]
    assert "BAGPIPE_TEST_PAUSE" in (out / "logs" / "trainer-0.log").read_text()
    assert "[trainer 0, rank" in r.stdout


def wait_for_checkpoint(out: Path, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not (out / "checkpoints" / "LATEST").exists():
        if proc.poll() is not None:
            raise AssertionError(f"the job ended early: {proc.communicate()}")
        assert time.monotonic() < deadline, "no checkpoint in time"
        time.sleep(0.2)


def assert_says_where_to_continue(out: Path, stderr: str, how: str) -> None:
    """The launcher's last word: the one line a one-process run stopped the same way prints."""
    from bagpipe.checkpoint.folder import where_to_continue

    step = int((out / "checkpoints" / "LATEST").read_text().strip().split("-")[1])
    line = f"bagpipe train: {how}; its latest checkpoint is step {step} in {out}/checkpoints: run the same command with --resume to continue from it"
    assert line == f"bagpipe train: {how}; {where_to_continue(str(out))}"
    lines = stderr.strip().splitlines()
    assert lines and lines[-1] == line, stderr[-2000:]
    assert sum("--resume" in x for x in lines) == 1 and "Traceback" not in stderr, stderr[-2000:]


@pytest.mark.parametrize("inherited", ["default", "ignored"])
def test_ctrl_c_stops_every_role(tiny_data, tmp_path, inherited):
    """SIGINT to the launcher stops every role and says where the run can continue, exit
    130 -- also where the launcher inherited SIGINT ignored (``cmd &`` in a script, or a
    test suite run so: the launcher restores it)."""
    out = tmp_path / "job"
    ignored = (signal.SIGINT,) if inherited == "ignored" else ()
    with stopped_at_end() as procs:
        procs.append(proc := start_long_job(tiny_data, out, "--checkpoint-every", 5, ignored=ignored))
        wait_for_checkpoint(out, proc)
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        [(_, stderr)] = outputs(procs, within=30, since=t0)
    assert proc.returncode == 130, stderr[-2000:]
    assert_all_stopped(out, within=1.0)
    assert_says_where_to_continue(out, stderr, "interrupted")


def test_sigterm_stops_every_role_and_nohups_sighup_stays_ignored(tiny_data, tmp_path):
    """A launcher started as ``nohup cmd &`` (SIGINT and SIGHUP ignored) keeps running on
    SIGHUP; SIGTERM stops every role at once (the launcher itself, not the roles' watch of
    it) and says where the run can continue, exit 143."""
    out = tmp_path / "job"
    with stopped_at_end() as procs:
        procs.append(
            proc := start_long_job(tiny_data, out, "--checkpoint-every", 5, ignored=(signal.SIGINT, signal.SIGHUP))
        )
        wait_for_checkpoint(out, proc)
        proc.send_signal(signal.SIGHUP)
        time.sleep(2)
        assert proc.poll() is None and all(alive(p) for p in role_pids(out).values())
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        [(_, stderr)] = outputs(procs, within=30, since=t0)
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-2000:]
    assert_all_stopped(out, within=1.0)
    assert_says_where_to_continue(out, stderr, "stopped by SIGTERM")


@pytest.mark.parametrize(
    "args,message",
    [
        (["--trainers", "2"], "need embedding servers"),
        (["--servers", "1", "--mode", "full"], "use --mode nocache or lru or lookahead, got --mode full"),
        (
            ["--servers", "1", "--mode", "lookahead", "--trainers", "3", "--batch-size", "256"],
            "split evenly over 3 trainers",
        ),
    ],
)
def test_bad_distributed_options(tiny_data, tmp_path, run_cli, args, message):
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", tmp_path / "x", *args)
    assert rc == 2 and message in err


def test_worker_without_rendezvous_environment(tiny_data, tmp_path, monkeypatch, run_cli):
    for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    rc, _, err = run_cli(
        "worker", "--data", tiny_data, "--out", tmp_path / "x", "--mode", "lookahead", "--servers", "1"
    )
    assert rc == 2 and "needs MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE" in err


def test_serve_rejects_a_non_server_rank_and_unknown_address(run_cli):
    rc, _, err = run_cli("serve", "--rank", "0", "--trainers", "1", "--servers", "1", "--bind", "203.0.113.9")
    assert rc == 2 and "no network interface" in err
    rc, _, err = run_cli("serve", "--rank", "0", "--trainers", "1", "--servers", "1")
    assert rc == 2 and "not a server" in err


def test_a_role_refusing_a_setting_before_the_first_checkpoint_is_not_restarted(tiny_data, tmp_path, run_cli):
    """Newcomer round 23: a trainer's refusal at start-up (exit 2, one line) was met by
    --max-restarts 2 restarting every role twice on the same refusal; it ends the job at
    once, saying to change the setting."""
    out = tmp_path / "job"
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", out, "--steps", 4, "--batch-size", 64, "--threads", 1,
                         "--mode", "lookahead", "--trainers", 2, "--servers", 1, "--max-restarts", 2,
                         "--rendezvous-timeout", 0.001, "--no-progress")  # fmt: skip
    lines = [ln for ln in err.splitlines() if ln.startswith("bagpipe train: error: ")]
    assert rc == 2 and len(lines) == 1, err[-3000:]
    assert lines[0].endswith("; change that setting and run the command again"), lines[0]
    assert "restarting" not in err and "restart 1 of 2" not in err
