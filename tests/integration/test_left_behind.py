"""Nothing left behind by a process killed outright (issue 32, "Processes and files left
behind").

* A ``kill -9`` of the local launcher ends every role it started (each watches it:
  :mod:`bagpipe.lifeline`) within 10 s, the run folder's lock stays held until the last
  role is gone, and a ``--resume`` then takes the lock over, saying so, and trains on.
* A ``kill -9`` of ``preprocess`` mid-way leaves its spill folder, staging folder and
  lock file; the next ``preprocess`` to the same ``--out`` removes them, naming each and
  the dead pid, and succeeds; the user's files beside them stay as they were.
* A run folder's lock left by a dead process is taken over with one line; one held by a
  live process (or by the children of a dead launcher) is refused as before.
* ``bench cluster``'s network namespaces carry their owner's pid and start time; the next
  run removes those of a process that is gone, with whatever runs inside, in one line
  (a real test where namespaces can be made here, else the naming logic only).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from bagpipe import lifeline
from bagpipe.testbed import netns

PY = sys.executable


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has ended)."""
    return lifeline.start_time(pid) is not None


def wait_gone(pids: list[int], within: float) -> float:
    """Seconds until every one of ``pids`` has ended; fails (and kills them) after ``within``."""
    t0 = time.monotonic()
    while any(alive(p) for p in pids):
        if time.monotonic() - t0 > within:
            left = [p for p in pids if alive(p)]
            for p in left:
                os.kill(p, signal.SIGKILL)
            raise AssertionError(f"still running {within:.0f} s after their parent was killed: {left}")
        time.sleep(0.05)
    return time.monotonic() - t0


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --------------------------------------------------------------------------- the watch itself


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_a_child_started_with_the_variable_ends_when_its_parent_is_killed(tmp_path):
    said = tmp_path / "child.err"
    parent_code = textwrap.dedent(
        f"""
        import subprocess, sys, time
        from bagpipe import lifeline
        child = subprocess.Popen(
            [sys.executable, "-c", "from bagpipe import lifeline; lifeline.watch('test child'); import time; time.sleep(120)"],
            env=lifeline.child_env(), stderr=open({str(said)!r}, "w"),
        )
        print(child.pid, flush=True)
        time.sleep(120)
        """
    )
    parent = subprocess.Popen([PY, "-c", parent_code], stdout=subprocess.PIPE, text=True)
    child = 0
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        time.sleep(0.5)
        assert alive(child)
        parent.kill()
        parent.wait()
        took = wait_gone([child], within=10)
    finally:
        stop(parent)
        if child and alive(child):
            os.kill(child, signal.SIGKILL)
    assert took < 5, took
    text = said.read_text()
    assert f"test child (pid {child}): the process that started it (pid {parent.pid}) is gone; ending" in text


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_a_token_knows_a_reused_pid_and_nothing_to_watch_starts_nothing(monkeypatch):
    me = lifeline.token()
    assert lifeline.alive(me)
    pid, start = me.split(":")
    assert not lifeline.alive(f"{pid}:{int(start) + 1}")  # same pid, another process
    monkeypatch.delenv(lifeline.ENV, raising=False)
    assert lifeline.watch() is None  # started by hand: today's behaviour
    monkeypatch.setenv(lifeline.ENV, "garbage")
    assert lifeline.watch() is None


# --------------------------------------------------------------------------- the local launcher

LONG_JOB = [
    "--steps",
    "1000000",
    "--batch-size",
    "64",
    "--threads",
    "1",
    "--mode",
    "lookahead",
    "--trainers",
    "1",
    "--servers",
    "1",
    "--cache-rows",
    "2000",
    "--lookahead",
    "4",
    "--checkpoint-every",
    "20",
    "--no-progress",
]


@pytest.mark.distributed
@pytest.mark.timeout(400)
def test_kill_9_of_the_launcher_ends_every_role_and_a_resume_takes_over(tiny_data, tmp_path):
    out = tmp_path / "job"
    cmd = [PY, "-m", "bagpipe.cli", "train", "--data", tiny_data, "--out", str(out)]
    # started as a shell's `bagpipe train ... &` starts it: SIGINT ignored, which its roles
    # inherit (the interrupt that lets a role clean up must still reach it)
    launcher = subprocess.Popen(
        cmd + LONG_JOB,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 180
        while not (out / "checkpoints" / "LATEST").exists():  # training, a checkpoint written
            assert launcher.poll() is None, "the job ended early"
            assert time.monotonic() < deadline, "no checkpoint in time"
            time.sleep(0.2)
        pids = [r["pid"] for r in json.loads((out / "roles.json").read_text())]
        assert len(pids) == 3 and all(alive(p) for p in pids)  # trainer, server, oracle
        launcher.kill()
        launcher.wait()
        took = wait_gone(pids, within=10)
    finally:
        stop(launcher)
        for p in pids:
            if alive(p):
                os.kill(p, signal.SIGKILL)
    print(f"every role gone {took:.2f} s after kill -9 of the launcher")
    # a role that noticed said why in its log (one may end first on its own: its output
    # pipe to the dead launcher broken, or a peer gone)
    logs = [(out / "logs" / f"{name}.log").read_text() for name in ("trainer-0", "server-0", "oracle")]
    assert any(f"the process that started it (pid {launcher.pid}) is gone; ending" in t for t in logs)
    # and stopped there: trainer 0 logged no step after the line (it did not train on until
    # the kernel's alarm ended it)
    trainer = logs[0]
    if "is gone; ending" in trainer:
        assert " step " not in trainer.split("is gone; ending", 1)[1], trainer[-2000:]
    lock = json.loads((out / ".lock").read_text())
    assert lock["pid"] == launcher.pid and "released" not in lock  # it died holding it
    step = int((out / "checkpoints" / "LATEST").read_text().strip().split("-")[-1])
    r = subprocess.run(
        cmd + [*LONG_JOB[2:], "--steps", str(step + 20), "--resume"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"took over the lock left by pid {launcher.pid}" in r.stdout
    assert "which is gone" in r.stdout
    assert json.loads((out / ".lock").read_text()).get("released")  # let go on purpose this time


# --------------------------------------------------------------------------- the run folder's lock

HOLD = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from pathlib import Path
    from bagpipe.files import RunLock, held_lock_fds
    out = Path(sys.argv[1]); out.mkdir(exist_ok=True)
    RunLock(out / ".lock").acquire()
    if sys.argv[2] == "die":
        os._exit(9)
    if sys.argv[2] == "child-holds":  # like a launcher's role: the lock's descriptor passed on
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], pass_fds=held_lock_fds())
        print(child.pid, flush=True)
        os._exit(9)
    print(os.getpid(), flush=True)
    time.sleep(60)
    """
)


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_lock_left_by_a_dead_process_is_taken_over_with_a_message(run_cli, tiny_data, tmp_path):
    out = tmp_path / "stale"
    r = subprocess.run([PY, "-c", HOLD, str(out), "die"])
    assert r.returncode == 9
    dead = json.loads((out / ".lock").read_text())["pid"]
    assert not alive(dead)
    rc, stdout, err = run_cli("train", "--data", tiny_data, "--out", out, "--steps", 5, "--no-progress")
    assert rc == 0, err
    assert f"{out}: took over the lock left by pid {dead} on " in stdout and "which is gone" in stdout
    # a clean end marks the lock released: the next run has nothing to take over
    rc, stdout, err = run_cli("train", "--data", tiny_data, "--out", out, "--steps", 10, "--resume", "--no-progress")
    assert rc == 0, err
    assert "took over" not in stdout


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_live_holder_or_its_children_are_refused_as_before(run_cli, tiny_data, tmp_path):
    for how in ("live", "child-holds"):
        out = tmp_path / how
        holder = subprocess.Popen([PY, "-c", HOLD, str(out), how], stdout=subprocess.PIPE, text=True)
        pid = 0
        try:
            assert holder.stdout is not None
            pid = int(holder.stdout.readline())
            if how == "child-holds":  # the lock's taker is gone (it exits right after the line), its child holds it
                holder.wait(timeout=30)
            before = sorted(p.name for p in out.iterdir())
            rc, _, err = run_cli("train", "--data", tiny_data, "--out", out, "--steps", 5, "--no-progress")
            assert rc == 2 and f"{out} is in use by another run (pid " in err, err
            if how == "child-holds":
                assert "it is gone, and processes it started still hold the lock" in err
            assert sorted(p.name for p in out.iterdir()) == before  # nothing written
        finally:
            stop(holder)
            if pid and alive(pid):
                os.kill(pid, signal.SIGKILL)


# --------------------------------------------------------------------------- preprocess


def write_big_criteo(path: Path, repeats: int = 20) -> None:
    """About 6 MB of Criteo lines per repeat (distinct keys within a repeat)."""
    rng = np.random.default_rng(0)
    n = 20_000
    lab, ints, cats = rng.integers(0, 2, n), rng.integers(0, 5000, (n, 13)), rng.integers(0, 1 << 32, (n, 26))
    block = (
        "\n".join(
            "\t".join([str(lab[i]), *map(str, ints[i]), *(format(int(v), "08x") for v in cats[i])]) for i in range(n)
        )
        + "\n"
    ).encode()
    with open(path, "wb") as f:
        for _ in range(repeats):
            f.write(block)


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_kill_9_of_preprocess_is_cleaned_by_the_next_one_naming_what_it_removed(tmp_path):
    raw = tmp_path / "day.tsv"
    write_big_criteo(raw)
    mine = tmp_path / "notes.txt"  # the user's own files beside the output
    mine.write_text("mine\n")
    (tmp_path / ".out.spill-notes").mkdir()
    before = {p: digest(p) for p in (raw, mine)}
    out = tmp_path / "out"
    cmd = [PY, "-m", "bagpipe.cli", "preprocess", "criteo", "--input", str(raw), "--out", str(out), "--no-progress"]
    proc = subprocess.Popen([*cmd, "--workers", "1", "--block-mb", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while True:  # mid-way: the spill has blocks in it
            spills = [p for p in tmp_path.glob(f".out.spill-{proc.pid}-*") if (p / "blocks.bin").exists()]
            if spills and (spills[0] / "blocks.bin").stat().st_size > 1_000_000:
                break
            assert proc.poll() is None, f"preprocess ended before it could be killed: {proc.communicate()}"
            assert time.monotonic() < deadline
            time.sleep(0.02)
        proc.kill()
        proc.wait()
    finally:
        stop(proc)
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".out."))
    assert f".out.partial-{proc.pid}" in left and ".out.lock" in left and spills[0].name in left, left
    assert not out.exists()

    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    said = r.stdout
    assert f"took over the lock left by pid {proc.pid} on " in said
    assert f"removed the spill folder {spills[0]} (" in said and f"MB) of pid {proc.pid}, which is gone" in said
    assert f"removed the unfinished dataset {tmp_path / f'.out.partial-{proc.pid}'} (" in said
    assert (out / "meta.json").exists()
    after = sorted(p.name for p in tmp_path.iterdir())
    assert after == sorted([".out.spill-notes", "day.tsv", "notes.txt", "out"]), after
    assert {p: digest(p) for p in (raw, mine)} == before


# --------------------------------------------------------------------------- bench cluster's namespaces


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_namespace_names_tell_a_gone_owner_from_a_live_one():
    me = netns.run_tag()
    assert netns.NAME.match(f"{me}-clsw")
    assert not netns.owner_gone(f"{me}-clsw")  # this process
    pid, start = me[len(netns.PREFIX) :].split("s")
    assert netns.owner_gone(f"{netns.PREFIX}{pid}s{int(start) + 7}-clsw")  # the pid reused since
    dead = subprocess.run([PY, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    assert netns.owner_gone(f"{netns.PREFIX}{dead}-clt0")  # an older name (no start time): pid alone
    assert not netns.owner_gone("mynamespace") and not netns.owner_gone(f"{netns.PREFIX}x-y")  # not a run's


@pytest.mark.integration
@pytest.mark.timeout(120)
@pytest.mark.skipif(netns.unavailable() is not None, reason=f"no emulated hosts here: {netns.unavailable()}")
def test_namespaces_and_processes_of_a_killed_bench_are_removed_by_the_next_run(tmp_path, caplog):
    code = textwrap.dedent(
        """
        import sys, time
        from bagpipe.testbed.netns import EmulatedNet
        net = EmulatedNet("cl").__enter__()
        host = net.add("t0", rate_mbit=100)
        p = net.popen(host, [sys.executable, "-c", "import time; time.sleep(120)"])
        print(p.pid, flush=True)
        time.sleep(120)
        """
    )
    bench = subprocess.Popen([PY, "-c", code], stdout=subprocess.PIPE, text=True)
    inside = 0
    try:
        assert bench.stdout is not None
        inside = int(bench.stdout.readline())
        names = netns.run_namespaces()[bench.pid]
        assert len(names) == 2  # the switch and the host
        bench.kill()
        bench.wait()
        with caplog.at_level(logging.INFO, logger="bagpipe"):
            removed = netns.remove_stale()
    finally:
        stop(bench)
        for ns in netns.run_namespaces().get(bench.pid, []):
            netns._remove(ns)
    assert sorted(removed) == sorted(names)
    assert bench.pid not in netns.run_namespaces()
    assert wait_gone([inside], within=5) < 5
    said = [r.getMessage() for r in caplog.records if "network namespace" in r.getMessage()]
    assert said == [
        f"removed the 2 network namespace(s) of bagpipe pid {bench.pid}, which is gone ({', '.join(names)}), "
        "and stopped the 1 process(es) left in them"
    ]
