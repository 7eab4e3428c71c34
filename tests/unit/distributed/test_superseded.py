"""The watch that ends a torchrun role once another host's roles restarted
(``bagpipe/distributed/superseded.py``), against a real TCPStore in this process.

:class:`SupersededWatch`: a role's watch of attempt N stays quiet while only attempt N
(and the stranger's writes to it) are in the store, calls back naming attempt N + 1
within seconds of a role arriving there, and a stopped watch never calls back. Every
thread a test starts must have ended when it finishes (``every_thread_ends``).
"""

from __future__ import annotations

import threading
import time

import pytest
import torch.distributed as dist

from bagpipe.distributed.superseded import SupersededWatch, attempt_key

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60), pytest.mark.usefixtures("every_thread_ends")]


def test_a_role_ends_its_attempt_once_another_host_restarted_into_the_next():
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    master.add(attempt_key(0), 4)
    master.add(attempt_key(0), 100)  # what the stranger in test_multihost.py writes
    told: list[str] = []
    ended = threading.Event()

    def tell(m: str) -> None:
        told.append(m)
        ended.set()

    watches = [
        SupersededWatch("127.0.0.1", master.port, 0, "server 0", tell, period_s=0.1),
        SupersededWatch("127.0.0.1", master.port, 0, "trainer 0", lambda m: told.append("stopped " + m), period_s=0.1),
    ]
    for w in watches:
        w.start()
    time.sleep(1.0)
    assert told == []  # attempt 0 alone, however many arrivals it counts: nothing to end
    watches[1].stop()
    master.add(attempt_key(1), 1)  # host 1's first restarted role arrives in attempt 1
    assert ended.wait(10)
    watches[0].stop()
    assert told == [
        "server 0: another host's roles restarted (attempt 1 began at 127.0.0.1:"
        f"{master.port}); ending this attempt so that torchrun restarts this role too"
    ]
