"""A trainer's plan receiver takes the oracle's plans off the wire ahead of the trainer.

The oracle sends each trainer its plan in turn, and a gloo send completes only once the
peer receives: a trainer that received its next plan only when it asked for it (the
synchronous executor, at the start of every step) held up the oracle's sends to every
trainer after it (docs/distributed.md, "The plans reached the trainers one after
another"). These tests run the receiver against an oracle over the fake wire: the plans
leave the wire before the trainer asks, arrive in order with one credit per plan taken,
a failure of the oracle reaches the trainer's thread, and a transport knows when
another thread is inside a receive (the role then does not leave its process group under
it, and the process ends past it with its exit code).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from fakes import FakeNet, join_all
from test_wire import assert_same, trainer_plans

from bagpipe.cache.setup import CachePlan
from bagpipe.distributed.oracle_report import OracleReport
from bagpipe.distributed.oracle_role import PlanReceiver
from bagpipe.distributed.transport import PeerLost, Transport, receiving_elsewhere
from bagpipe.distributed.wire import CREDIT, PLAN

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

TRAINER, ORACLE = 0, 1


def _pair() -> tuple[Transport, Transport, FakeNet]:
    net = FakeNet(timeout=5.0)

    def name(rank: int) -> str:
        return "trainer 0" if rank == TRAINER else "oracle"

    t, o = Transport(name, net.wire(TRAINER)), Transport(name, net.wire(ORACLE))
    assert not join_all({TRAINER: t, ORACLE: o}, {TRAINER: [ORACLE], ORACLE: [TRAINER]})
    return t, o, net


def _wait_until(cond, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_plans_leave_the_wire_before_the_trainer_asks_and_arrive_in_order_one_credit_each():
    t, o, net = _pair()
    plans = trainer_plans()[::2]  # trainer 0's part of every step (partitioned over 2)
    o.send(TRAINER, PLAN, CachePlan(cache_rows=6, lookahead=2))
    for p in plans:
        o.send(TRAINER, PLAN, p)
    o.send(TRAINER, PLAN, {"end": True, "report": OracleReport(cache_rows=6, lookahead=2)})
    receiver = PlanReceiver(t, ORACLE)
    it = iter(receiver)
    first = next(it)
    # while the trainer holds its first plan, the rest are already off the wire
    _wait_until(lambda: not net._fifos[(ORACLE, TRAINER, PLAN)])
    got = [first, *it]
    assert len(got) == len(plans)
    for g, p in zip(got, plans):
        assert_same(g, p)
    assert receiver.report is not None and receiver.report.cache_rows == 6
    assert [o.recv(TRAINER, CREDIT) for _ in plans] == [1] * len(plans)  # one credit per plan taken
    assert not t.receiving_elsewhere()  # the receiver's thread ended at the stream's end


def test_the_oracle_lost_reaches_the_trainers_thread_as_peer_lost():
    t, o, net = _pair()
    o.send(TRAINER, PLAN, CachePlan(cache_rows=6, lookahead=2))
    receiver = PlanReceiver(t, ORACLE)
    it = iter(receiver)
    got: list[BaseException] = []

    def take() -> None:
        try:
            next(it)
        except BaseException as e:  # noqa: BLE001 - what the trainer's thread sees
            got.append(e)

    th = threading.Thread(target=take)
    th.start()
    _wait_until(t.receiving_elsewhere)  # the receiver waits inside a receive, not the trainer
    net.kill(ORACLE)
    th.join(timeout=10)
    assert len(got) == 1 and isinstance(got[0], PeerLost), got
    assert "oracle" in str(got[0])
    assert not t.receiving_elsewhere()


def test_a_transport_knows_whether_another_thread_is_inside_a_receive():
    t, o, _ = _pair()
    assert not t.receiving_elsewhere()
    th = threading.Thread(target=t.recv, args=(ORACLE, CREDIT))
    th.start()
    _wait_until(t.receiving_elsewhere)
    o.send(TRAINER, CREDIT, 1)
    th.join(timeout=10)
    assert not t.receiving_elsewhere()


def test_any_transports_receive_counts_for_the_process_but_not_the_calling_thread():
    t, o, _ = _pair()
    other, _, _ = _pair()
    assert not t.receiving_elsewhere() and not other.receiving_elsewhere()
    th = threading.Thread(target=t.recv, args=(ORACLE, CREDIT))
    th.start()
    _wait_until(receiving_elsewhere)  # any transport of this process
    assert t.receiving_elsewhere() and not other.receiving_elsewhere()  # or that transport's
    o.send(TRAINER, CREDIT, 1)
    th.join(timeout=10)
    assert not t.receiving_elsewhere()
    o.send(TRAINER, CREDIT, 2)
    assert t.recv(ORACLE, CREDIT) == 2 and not t.receiving_elsewhere()  # the caller's own receive is not "elsewhere"


_A_THREAD_INSIDE_A_RECEIVE = """
import atexit, sys, threading, time
from fakes import FakeNet, join_all
import bagpipe.cli as cli
from bagpipe.distributed.transport import Transport, receiving_elsewhere
net = FakeNet(timeout=60.0)
t, o = Transport(str, net.wire(0)), Transport(str, net.wire(1))
assert not join_all({0: t, 1: o}, {0: [1], 1: [0]})
threading.Thread(target=t.recv, args=(1, 4), daemon=True).start()  # never answered
while not receiving_elsewhere():
    time.sleep(0.01)
"""


def _run_child(script: str, *args: str) -> subprocess.CompletedProcess:
    """Run ``script`` in a child process with a thread of it blocked inside a receive; the
    child imports fakes.py and bagpipe, and is no bagpipe process's child (lifeline)."""
    tests = Path(__file__).resolve().parents[2]  # fakes.py; bagpipe beside it
    env = {k: v for k, v in os.environ.items() if k != "BAGPIPE_PARENT"}
    env["PYTHONPATH"] = f"{tests}{os.pathsep}{tests.parent}"
    code = _A_THREAD_INSIDE_A_RECEIVE + textwrap.dedent(script)
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=50, env=env)


@pytest.mark.parametrize("rc", [0, 2])
def test_the_command_line_ends_a_failed_process_past_a_thread_inside_a_receive(rc):
    """After an error (rc != 0) the command line ends the process with its code at once when
    a thread is still inside a receive (in gloo, the interpreter's teardown would abort it);
    a command that succeeded returns as usual."""
    r = _run_child(
        """
        cli._leave_past_stuck_threads(int(sys.argv[1]))
        print("returned", flush=True)
        """,
        str(rc),
    )
    assert r.returncode == rc, r.stderr
    assert ("returned" in r.stdout) == (rc == 0), r.stdout


def test_a_bug_ends_the_process_past_a_thread_inside_a_receive_with_its_traceback():
    r = _run_child(
        """
        atexit.register(print, "teardown", flush=True)  # the interpreter's teardown ran (os._exit skips it)
        def bug(argv):
            raise RuntimeError("a bug in a command")
        cli._main = bug
        sys.argv = ["bagpipe", "version"]
        cli.main()
        print("returned", flush=True)
        """
    )
    assert r.returncode == 1, r.stderr
    assert r.stderr.count("RuntimeError: a bug in a command") == 1, r.stderr  # the traceback, once
    assert "returned" not in r.stdout and "teardown" not in r.stdout, r.stdout  # ended past the thread
