"""gloo point-to-point vs torch.distributed.rpc for an embedding server's reads.

Two processes on loopback; the client asks for ROWS rows of D floats and waits for
them, REPEAT times, through (a) bagpipe's Transport (authenticated data-only message over gloo
send/recv, what the embedding servers use) and (b) ``rpc_sync`` of a function that
returns the rows (TensorPipe). Also (c) the same exchange as bare gloo tensors, the floor of (a). Prints the
median round trip of each and the ratio of (b) to (a);
``--json`` writes them too. This is the measurement behind the choice documented in
bagpipe/distributed/transport.py and docs/distributed.md.

    python benchmarks/transport.py --rows 20000 --dim 64 --repeat 50
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import TYPE_CHECKING

import numpy as np
import torch.multiprocessing as mp

if TYPE_CHECKING:
    import torch

_TABLE: torch.Tensor | None = None  # the served rows, set in the serving process by _rpc


def _rows(n: int, d: int):
    return np.ones((n, d), np.float32)


def _gloo(rank: int, port: int, n: int, d: int, repeat: int, q) -> None:
    import torch.distributed as dist

    from bagpipe.distributed.transport import REPLY, REQUEST, Transport

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    t = Transport()
    t.join([1 - rank], b"a benchmark's secret, 32 bytes..")
    table = _rows(n, d)
    state = np.ones((n, 1), np.float32)
    if rank == 1:
        for _ in range(repeat + 3):
            msg = t.recv(0, REQUEST)
            t.send(0, REPLY, {"w": table[: len(msg["rows"])], "s": state[: len(msg["rows"])]})
    else:
        rows = np.arange(n, dtype=np.int64)
        times = []
        for i in range(repeat + 3):
            t0 = time.perf_counter()
            t.send(1, REQUEST, {"op": "read", "rows": rows, "after": -1, "count": True})
            w = t.recv(1, REPLY)["w"]
            if i >= 3:
                times.append(time.perf_counter() - t0)
        assert w.shape == (n, d)
        q.put(times)
    dist.destroy_process_group()


def _raw(rank: int, port: int, n: int, d: int, repeat: int, q) -> None:
    """The floor: the same request and reply as bare tensors, no framing at all."""
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    table = torch.ones(n, d)
    times = []
    for i in range(repeat + 3):
        t0 = time.perf_counter()
        if rank == 1:
            req = torch.empty(n, dtype=torch.int64)
            dist.recv(req, 0, tag=1)
            dist.send(table, 0, tag=2)
        else:
            dist.send(torch.arange(n), 1, tag=1)
            out = torch.empty(n, d)
            dist.recv(out, 1, tag=2)
        if i >= 3:
            times.append(time.perf_counter() - t0)
    if rank == 0:
        q.put(times)
    dist.destroy_process_group()


def _serve_rows(rows):
    assert _TABLE is not None, "_rpc sets the table before the RPC agent starts"
    return _TABLE[: len(rows)]


def _rpc(rank: int, port: int, n: int, d: int, repeat: int, q) -> None:
    import torch
    import torch.distributed.rpc as rpc

    global _TABLE
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    _TABLE = torch.ones(n, d)
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=2)
    if rank == 0:
        rows = torch.arange(n)
        times = []
        for i in range(repeat + 3):
            t0 = time.perf_counter()
            w = rpc.rpc_sync("w1", _serve_rows, args=(rows,))
            if i >= 3:
                times.append(time.perf_counter() - t0)
        assert tuple(w.shape) == (n, d)
        q.put(times)
    rpc.shutdown()


def measure(fn, n: int, d: int, repeat: int) -> list[float]:
    from bagpipe.distributed.launch import free_port

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=fn, args=(r, port, n, d, repeat, q)) for r in (0, 1)]
    for p in procs:
        p.start()
    times = q.get(timeout=300)
    for p in procs:
        p.join(timeout=60)
        if p.is_alive():
            p.kill()
    return times


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--json", help="also write the result here")
    a = ap.parse_args(argv)
    res = {}
    runs = (
        ("gloo send/recv (bagpipe Transport)", _gloo),
        ("rpc_sync (TensorPipe)", _rpc),
        ("gloo send/recv, bare tensors (floor)", _raw),
    )
    for name, fn in runs:
        t = measure(fn, a.rows, a.dim, a.repeat)
        res[name] = {"median_ms": 1000 * statistics.median(t), "min_ms": 1000 * min(t), "max_ms": 1000 * max(t)}
    mb = a.rows * a.dim * 4 / 2**20
    print(f"round trip of {a.rows:,} rows x {a.dim} floats ({mb:.1f} MiB), median of {a.repeat}:")
    g, r, _ = res.values()
    for name, v in res.items():
        print(f"  {name:36s} {v['median_ms']:7.2f} ms  (min {v['min_ms']:.2f}, max {v['max_ms']:.2f})")
    print(f"  rpc_sync / gloo: {r['median_ms'] / g['median_ms']:.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": a.rows, "dim": a.dim, "repeat": a.repeat, "results": res}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
