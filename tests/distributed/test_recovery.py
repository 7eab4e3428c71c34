"""Recovery of any role with nothing lost: real processes are killed, runs end exact.

* Distributed checkpoints (``--checkpoint-every``) do not change the maths: a 2x2 run
  that checkpoints ends with the digest of one that does not (the uninterrupted run).
* The launcher with ``--max-restarts``: SIGKILL a trainer, a server or the oracle at a
  step the test picks at random (the seed is printed), or a server while it writes its
  checkpoint part in the background (training has gone on meanwhile); the launcher
  names the role and the step, restarts every role from the latest complete
  checkpoint, records where the seconds of the restart went (``recovery.json``'s
  phases), and the run ends with the uninterrupted digest -- for one trainer that is
  ``--mode full``'s, bit for bit. No process is left behind.
* ``torchrun --max-restarts`` does the same without our launcher: restarted roles
  find the latest checkpoint on their own.
* One process: ``kill -9`` at a random moment, or while a checkpoint is half written in
  the background and training has gone on past it, then ``--resume``, ends bitwise
  equal to ``--mode full`` (disk store).
* Checkpoints hold only the rows trained: a one-process checkpoint holds exactly the
  rows its steps touched (the union of their batches' rows), and restoring it -- rows
  never written re-derived from the seed -- on embedding servers ends with ``--mode
  full``'s digest.
* Resume anywhere: a one-process checkpoint resumes as a distributed run and the other
  way round, and a checkpoint resumes on another number of servers (bitwise) or of
  trainers (within the distributed tolerance).

Every job is bounded in time and every process it started is checked to be gone.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from runs import last_checkpoint, trained

from bagpipe.checkpoint import latest
from bagpipe.config.train import TrainConfig
from bagpipe.data.shards import Dataset
from bagpipe.data.stream import train_stream
from bagpipe.phases import PHASES
from bagpipe.train.loop import train

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]

STEPS, BATCH, EVERY = 40, 64, 5
JOB_TIMEOUT = 240
PHASE_NAMES = [name for name, _ in PHASES]


def settings(data: str, out: Path, *extra) -> list[str]:
    return [
        "--data",
        data,
        "--out",
        str(out),
        "--steps",
        str(STEPS),
        "--batch-size",
        str(BATCH),
        "--optimizer",
        "adagrad",
        "--lr",
        "0.05",
        "--threads",
        "1",
        "--no-progress",
        "--cache-rows",
        "1000",
        "--lookahead",
        "4",
        "--checkpoint-every",
        str(EVERY),
        *map(str, extra),
    ]


def digest(run: Path) -> str:
    return json.loads((run / "summary.json").read_text())["params_sha256"]


def latest_step(run: Path) -> int:
    """The step of the checkpoint LATEST names (0: none yet)."""
    from bagpipe.checkpoint import CheckpointFolder

    name = CheckpointFolder(run).latest_name()
    return int(name.rsplit("-", 1)[-1]) if name else 0


def heartbeat(run: Path) -> int:
    try:
        return int.from_bytes((run / ".step").read_bytes()[:8], "little")
    except (OSError, ValueError):
        return 0


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def wait_for(cond, proc: subprocess.Popen, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if proc.poll() is not None:
            raise AssertionError(f"the job ended before {what}: {proc.communicate()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def pick_step(seed_note: list[int]) -> int:
    seed = int(time.time() * 1000) % 100_000
    seed_note.append(seed)
    print(f"kill step drawn with seed {seed}")
    return random.Random(seed).randint(EVERY + 2, STEPS - 6)


def launch(data: str, out: Path, trainers: int, servers: int, *extra, env=None) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "bagpipe.cli",
        "train",
        *settings(data, out, "--mode", "lookahead", "--trainers", trainers, "--servers", servers, *extra),
    ]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def finish(proc: subprocess.Popen) -> tuple[str, str]:
    try:
        out, err = proc.communicate(timeout=JOB_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    return out, err


def assert_nothing_left(run: Path, pids: set[int]) -> None:
    pids |= {r["pid"] for r in json.loads((run / "roles.json").read_text())}
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.2)
    left = [p for p in pids if alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left, f"processes left running: {left}"


@pytest.fixture(scope="module")
def full_digest(tiny_data, tmp_path_factory) -> str:
    """--mode full on one process: what every one-trainer run must end with, bitwise."""
    out = tmp_path_factory.mktemp("full") / "run"
    cfg = TrainConfig.of(
        data=tiny_data,
        out=str(out),
        steps=STEPS,
        batch_size=BATCH,
        optimizer="adagrad",
        lr=0.05,
        threads=1,
        progress=False,
    )
    return trained(cfg)["params_sha256"]


@pytest.fixture(scope="module")
def two_by_two(tiny_data, tmp_path_factory) -> str:
    """The uninterrupted 2x2 run, without checkpoints: its digest (a run that checkpoints
    and recovers must end with it, so checkpoints do not change the maths either)."""
    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    finish(launch(tiny_data, out, 2, 2, "--checkpoint-every", 0))
    assert [p.name for p in (out / "checkpoints").glob("step-*")] == [f"step-{STEPS:08d}"]  # the final one only
    return digest(out)


def spares(launcher: subprocess.Popen, out: Path) -> int:
    """The launcher's pre-started spare processes (``bagpipe worker --standby``) waiting
    now: a spare that became a role keeps its command line, so the job's roles are left out."""
    try:
        kids = psutil.Process(launcher.pid).children()
        roles = {r["pid"] for r in json.loads((out / "roles.json").read_text())}
    except (psutil.NoSuchProcess, OSError, ValueError):
        return 0
    n = 0
    for k in kids:
        try:
            n += "--standby" in k.cmdline() and k.pid not in roles
        except psutil.Error:
            pass
    return n


def kill(out: Path, role: str) -> int:
    pid = {r["role"]: r["pid"] for r in json.loads((out / "roles.json").read_text())}[role]
    os.kill(pid, signal.SIGKILL)
    return pid


def test_a_killed_trainer_and_then_a_killed_oracle_are_recovered_exactly(tiny_data, tmp_path, two_by_two):
    """2 trainers + 2 servers: trainer 1, then the oracle, SIGKILLed at random steps; the
    roles restart into new interpreters (--no-spares; the test below uses the spares)."""
    out, seeds = tmp_path / "job", list[int]()
    pick_step(seeds)
    first = random.Random(seeds[0]).randint(EVERY + 2, STEPS - 18)
    second = random.Random(seeds[0] + 1).randint(first + EVERY + 3, STEPS - 2)
    proc = launch(tiny_data, out, 2, 2, "--max-restarts", 2, "--no-spares")  # restarts into new interpreters
    wait_for(lambda: heartbeat(out) >= first, proc, f"step {first}")
    pids = {kill(out, "trainer 1")}
    wait_for(
        lambda: (out / "recovery.json").exists() and heartbeat(out) >= second, proc, f"step {second} after a restart"
    )
    pids.add(kill(out, "oracle"))
    stdout, _ = finish(proc)
    events = json.loads((out / "recovery.json").read_text())
    assert [(e["role"], e["exit"]) for e in events] == [
        ("trainer 1", "killed by SIGKILL"),
        ("oracle", "killed by SIGKILL"),
    ], seeds
    for e in events:
        assert e["died_at_step"] >= e["from_checkpoint"] and e["from_checkpoint"] % EVERY == 0
        assert (
            f"[launcher] {e['role']} died at step {e['died_at_step']}; restarting all roles from the checkpoint of "
            f"step {e['from_checkpoint']} (restart {e['restart']} of 2)"
        ) in stdout
    assert digest(out) == two_by_two, seeds
    assert_nothing_left(out, pids)


def test_a_killed_server_and_a_server_killed_while_writing_are_recovered_bitwise(tiny_data, tmp_path, full_digest):
    """1 trainer + 2 servers: server 1 SIGKILLed at a random step, then a server killed
    while it writes its part of the checkpoint of step 30 in the background, training
    having gone on (the checkpoint therefore never completes: the job falls back to step
    25's); the restarts go into the launcher's pre-started spares; ends bitwise equal to
    --mode full."""
    out, flag, seeds = tmp_path / "job", tmp_path / "paused", list[int]()
    pick_step(seeds)
    at = random.Random(seeds[0]).randint(EVERY + 2, 20)
    env = dict(os.environ, BAGPIPE_TEST_PAUSE=f"checkpoint:30:{flag}")
    proc = launch(tiny_data, out, 1, 2, "--max-restarts", 2, env=env)
    wait_for(lambda: heartbeat(out) >= at and spares(proc, out) == 4, proc, f"step {at} and the spares")
    pids = {kill(out, "server 1")}
    wait_for(flag.exists, proc, "a server pausing inside its checkpoint write")
    pids.add(int(flag.read_text()))
    wait_for(
        lambda: heartbeat(out) >= 33 and spares(proc, out) == 4, proc, "training going on while the part is written"
    )
    assert (out / "checkpoints" / ".tmp-step-00000030").is_dir()  # the write is under way
    os.kill(int(flag.read_text()), signal.SIGKILL)
    stdout, _ = finish(proc)
    events = json.loads((out / "recovery.json").read_text())
    assert [e["role"] for e in events][0] == "server 1" and len(events) == 2, seeds
    assert events[1]["from_checkpoint"] == 25 and "restarting all roles from the checkpoint of step 25" in stdout
    assert stdout.count("[launcher] 4 of 4 roles start in pre-started spare processes") == 2
    for e in events:  # where the seconds went: consecutive phases that add up to the whole
        ph = e["phases"]
        # a kill before the first checkpoint was durable (its part still being written on a
        # loaded machine: from_checkpoint None) restarts from the beginning: nothing to restore
        names = [n for n in PHASE_NAMES if n != "restore" or e["from_checkpoint"] is not None]
        assert list(ph) == [*names, "total"] and all(v >= 0 for v in ph.values()), (ph, seeds)
        assert abs(sum(ph[k] for k in names) - ph["total"]) < 1e-6 and ph["total"] > 0
    assert digest(out) == full_digest, seeds
    assert_nothing_left(out, pids)


def test_torchrun_restarts_every_role_from_the_checkpoint(tiny_data, tmp_path, full_digest):
    out = tmp_path / "job"
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [
        str(torchrun),
        "--standalone",
        "--nproc-per-node",
        "4",
        "--max-restarts",
        "1",
        "-m",
        "bagpipe.cli",
        "worker",
        *settings(tiny_data, out, "--mode", "lookahead", "--trainers", 1, "--servers", 2),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", BAGPIPE_JOB_SECRET="a secret for this test job only")
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path, start_new_session=True
    )
    try:
        # the checkpoint of step 10 is written in the background: on a loaded machine it may
        # still be in flight at step 12, and the restart would resume from step 5
        wait_for(lambda: heartbeat(out) >= 12 and latest_step(out) >= 10, proc, "step 12 and the checkpoint of step 10")
        workers = [
            int(p)
            for p in subprocess.run(
                ["pgrep", "-f", f"bagpipe.cli worker.*{out}"], capture_output=True, text=True
            ).stdout.split()
        ]
        ranks = {}
        for p in workers:
            try:
                env_p = dict(
                    line.split("=", 1) for line in open(f"/proc/{p}/environ").read().split("\0") if "=" in line
                )
                ranks[int(env_p["RANK"])] = p
            except (OSError, KeyError):
                pass
        os.kill(ranks[2], signal.SIGKILL)  # server 1
        stdout, stderr = proc.communicate(timeout=JOB_TIMEOUT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, stderr[-3000:]
    # the kill lands after step 12 was seen: the restart resumes from the checkpoint of step 10,
    # or a later one if training went on past it before the kill (a loaded machine)
    resumed = [int(n) for n in re.findall(r"resumed from step (\d+)", stdout)]
    assert resumed and all(n >= 10 and n % EVERY == 0 for n in resumed), stdout[-3000:]
    assert digest(out) == full_digest
    leftover = subprocess.run(
        ["pgrep", "-f", f"bagpipe.cli worker.*{out}"], capture_output=True, text=True
    ).stdout.split()
    assert not leftover


# --------------------------------------------------------------------------- one process


def one_process(data: str, out: Path, *extra, env=None) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "bagpipe.cli",
        "train",
        *settings(data, out, "--mode", "lookahead", "--store", "disk", *extra),
    ]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_one_process_killed_at_any_moment_and_while_checkpointing_resumes_exactly(tiny_data, tmp_path):
    """kill -9 inside a random step, --resume; then kill -9 while the checkpoint of step
    175 is half written in the background and training has gone on past it, --resume
    again: bitwise --mode full (disk store)."""
    steps = 200  # one process runs the short job of the other tests in about a second
    ref = TrainConfig.of(
        data=tiny_data,
        out=str(tmp_path / "full"),
        steps=steps,
        batch_size=BATCH,
        optimizer="adagrad",
        lr=0.05,
        threads=1,
        progress=False,
    )
    want = trained(ref)["params_sha256"]
    out, flag, seeds = tmp_path / "run", tmp_path / "paused", list[int]()
    pick_step(seeds)
    at = random.Random(seeds[0]).randint(EVERY + 2, 150)
    extra = ("--steps", steps)  # given last: replaces STEPS
    proc = one_process(tiny_data, out, *extra)
    wait_for(lambda: heartbeat(out) >= at, proc, f"step {at}")
    time.sleep(random.Random(seeds[0]).random() * 0.01)  # anywhere inside a step
    proc.kill()
    proc.wait()
    assert latest(out) is not None, seeds
    proc = one_process(
        tiny_data, out, *extra, "--resume", env=dict(os.environ, BAGPIPE_TEST_PAUSE=f"checkpoint:175:{flag}")
    )
    wait_for(flag.exists, proc, "the checkpoint of step 175 half written")
    wait_for(lambda: heartbeat(out) >= 178, proc, "training going on while it is written")
    proc.kill()
    proc.wait()
    assert last_checkpoint(out).step == 170 and (out / "checkpoints" / ".tmp-step-00000175").is_dir()
    stdout, _ = finish(one_process(tiny_data, out, *extra, "--resume"))
    assert "resumed from step 170" in stdout and digest(out) == want, seeds


# --------------------------------------------------------------------------- resume anywhere


def params(run: Path) -> dict[str, np.ndarray]:
    ck = last_checkpoint(run)
    out = {f"dense/{k}": v.numpy() for k, v in ck.dense["model"].items()}
    out["emb/weights"], out["emb/state"] = ck.reader().arrays()
    return out


def job(data: str, out: Path, steps: int, *extra) -> None:
    cmd = settings(data, out, "--mode", "lookahead", *extra)
    cmd[cmd.index("--steps") + 1] = str(steps)
    finish(
        subprocess.Popen(
            [sys.executable, "-m", "bagpipe.cli", "train", *cmd],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    )


def test_a_checkpoint_of_the_touched_rows_resumes_distributed_bitwise(tiny_data, tmp_path, full_digest):
    """One process to step 20: its checkpoint holds exactly the rows the 20 steps touched
    (bytes: theirs alone); then 1 trainer + 2 servers restore it, re-deriving every other
    row from the seed, and train to the end: --mode full's digest."""
    out = tmp_path / "run"
    cfg = TrainConfig.of(
        data=tiny_data,
        batch_size=BATCH,
        optimizer="adagrad",
        lr=0.05,
        threads=1,
        progress=False,
        out=str(out),
        steps=20,
        mode="lookahead",
        cache_rows=1000,
        lookahead=4,
        checkpoint_every=EVERY,
    )
    train(cfg)
    stream = train_stream(Dataset(tiny_data), cfg.data, cfg.run.seed)
    touched = np.unique(np.concatenate([stream.batch(k).rows.numpy() for k in range(20)]))
    ck = last_checkpoint(out)
    reader = ck.reader()
    assert np.array_equal(reader.stored_ids(), touched) and len(touched) < reader.num_rows // 4
    stored = sum(m.rows for _, m in reader.chain)  # the chain: the first full checkpoint, then deltas
    row_bytes = 8 + 4 * (8 + 1)  # a row's id, its D = 8 weights and Adagrad's one value
    assert sum(m.bytes for _, m in reader.chain) == stored * row_bytes + 2 * 128 * len(reader.chain)  # + .npy headers
    job(tiny_data, out, STEPS, "--trainers", 1, "--servers", 2, "--resume")
    assert digest(out) == full_digest


@pytest.mark.slow
def test_resume_anywhere(tiny_data, tmp_path):
    """One process to step 20, then 1 trainer + 2 servers to 30 (bitwise --mode full's),
    1 trainer + 1 server to 35 (another number of servers: bitwise), 2 trainers + 1
    server to 40, and one process again to 45 (within the distributed tolerance)."""
    out = tmp_path / "run"
    base = dict(data=tiny_data, batch_size=BATCH, optimizer="adagrad", lr=0.05, threads=1, progress=False)
    train(
        TrainConfig.of(
            **base, out=str(out), steps=20, mode="lookahead", cache_rows=1000, lookahead=4, checkpoint_every=EVERY
        )
    )
    full = {
        n: trained(TrainConfig.of(**base, out=str(tmp_path / f"full-{n}"), steps=n))["params_sha256"] for n in (30, 35)
    }
    job(tiny_data, out, 30, "--trainers", 1, "--servers", 2, "--resume")
    assert digest(out) == full[30]  # a one-process checkpoint, resumed distributed
    job(tiny_data, out, 35, "--trainers", 1, "--servers", 1, "--resume")
    assert digest(out) == full[35]  # rows re-partitioned over 1 server instead of 2
    job(tiny_data, out, 40, "--trainers", 2, "--servers", 1, "--resume")
    train(TrainConfig.of(**base, out=str(out), steps=45, mode="lookahead", cache_rows=1000, lookahead=4, resume=True))
    ref = tmp_path / "full-45"
    train(TrainConfig.of(**base, out=str(ref), steps=45))
    got, want = params(out), params(ref)
    for k in want:
        d = np.abs(got[k].astype(np.float64) - want[k])
        assert d.max() <= 1e-5 * max(float(np.abs(want[k]).max()), 1e-12), k
