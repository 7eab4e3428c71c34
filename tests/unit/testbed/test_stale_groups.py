"""A memory group left by a benchmark that was killed is removed by the next one.

``MemoryGroup`` names its group ``bagpipe-<what>-<owner pid>``; a bench killed with SIGTERM
or SIGKILL cannot remove it. These tests make real groups (cgroup v1 or v2, as root; skipped
where no memory controller can be written) and check that exactly the stale ones go: an
owner that is gone and no process inside -- never a live owner's group, one with a process
still in it, or a group bagpipe did not name.
"""

import os
import subprocess
import sys
import time

import pytest

from bagpipe.testbed.memlimit import MemoryGroup, find_memory_controller, remove_stale_groups

pytestmark = pytest.mark.unit


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def controller():
    c, why = find_memory_controller()
    if c is None:
        pytest.skip(why)
    return c


def test_groups_of_a_gone_owner_are_removed_live_and_foreign_ones_kept(controller):
    dead = _dead_pid()
    stale = controller.parent / f"bagpipe-scale-{dead}"
    live = controller.parent / f"bagpipe-scale-{os.getppid()}"  # the test runner's parent: alive
    foreign = controller.parent / f"someone-else-{dead}"
    made = [stale, live, foreign]
    try:
        for g in made:
            g.mkdir()
        with MemoryGroup(controller, 0, "bagpipe-test") as group:
            assert group.removed_stale == [stale.name]
            assert not stale.exists() and live.exists() and foreign.exists()
    finally:
        for g in made:
            if g.exists():
                g.rmdir()


def test_a_stale_group_with_a_process_inside_is_kept(controller):
    dead = _dead_pid()
    stale = controller.parent / f"bagpipe-memory-{dead}"
    stale.mkdir()
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"],
        preexec_fn=lambda: (stale / "cgroup.procs").write_text(str(os.getpid())),
    )
    try:
        assert remove_stale_groups(controller.parent) == []
        assert stale.exists()
    finally:
        sleeper.kill()
        sleeper.wait()
    for _ in range(50):  # the killed process leaves the group's list a moment later
        if remove_stale_groups(controller.parent) == [stale.name]:
            break
        time.sleep(0.1)
    assert not stale.exists()
