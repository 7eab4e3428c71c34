"""Stand-ins for torch.distributed in thread tests: trainers are threads of one process."""

from __future__ import annotations

import threading


class FakeAllReduce:
    """Sums the k-th ``all_reduce`` of each of ``n`` threads (each thread passes its index as ``group``)."""

    def __init__(self, n: int):
        self.n = n
        self.calls: dict[int, dict] = {}
        self.count = [0] * n
        self.lock = threading.Lock()

    def __call__(self, tensor, op=None, group=None, async_op=False):
        me = int(group)
        with self.lock:
            k = self.count[me]
            self.count[me] += 1
            call = self.calls.setdefault(k, {"parts": {}, "done": threading.Event()})
            call["parts"][me] = tensor
            if len(call["parts"]) == self.n:
                total = sum(t.clone() for t in call["parts"].values())
                for t in call["parts"].values():
                    t.copy_(total)
                call["done"].set()
        work = _Work(call["done"])
        if async_op:
            return work
        work.wait()
        return None


class _Work:
    def __init__(self, done: threading.Event):
        self.done = done

    def wait(self) -> None:
        assert self.done.wait(timeout=10), "the other trainer never joined the all-reduce"

