"""What the data-only, authenticated wire costs per training step, against pickle.

One process, no network: the messages of one step of one trainer of the ``bench
distributed`` setting (Criteo-Kaggle profile, batch 2048 split over 2 trainers, D = 16,
row-wise Adagrad, lookahead plans of a 5% cache; its plan, credit, read request and
reply, write-back and mark) are turned into bytes and back, REPEAT times, interleaved:

(a) ``pickle`` protocol 5 with the arrays out of band, as the transport did before
    (``dumps`` + ``loads``, no copy of the arrays either way), and
(b) what ``bagpipe.distributed.transport.Transport`` does now on both ends: the schema
    check and data-only encoding (arrays copied once into the body, integer arrays
    narrowed), HMAC-SHA256 over header and body on the sender and again on the
    receiver, and the decoding with its schema check.

What moves the bytes (gloo, the kernel) is the same work for both and is left out, so
the difference is the CPU the new wire adds per step. Prints CPU milliseconds per step
of each and the difference as a share of one ``bench distributed`` step at
--samples-per-s (an upper bound of its cost in throughput: the work runs on the
prefetch threads, which hide it unless the machine is CPU-bound).

    python benchmarks/wire_cost.py --repeat 200 --samples-per-s 18000
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import pickle
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bagpipe.data.batch import Batch  # noqa: E402
from bagpipe.distributed.partition import partition  # noqa: E402
from bagpipe.distributed.transport import _FIXED, CREDIT, MAGIC, PLAN, REPLY, REQUEST  # noqa: E402
from bagpipe.distributed.wire import decode, encode  # noqa: E402
from bagpipe.oracle import LookaheadOracle  # noqa: E402

KEY = b"k" * 32


def pickle_both_ends(stream: int, obj) -> None:
    buffers: list = []
    data = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    pickle.loads(data, buffers=[b.raw() for b in buffers])  # the reference only: never on network input


def wire_both_ends(stream: int, obj) -> None:
    body = encode(stream, obj)
    fixed = _FIXED.pack(MAGIC, stream, 0, 7, len(body))
    mac = hmac.new(KEY, fixed, hashlib.sha256)
    mac.update(body.data)
    sent = mac.digest()
    check = hmac.new(KEY, fixed, hashlib.sha256)
    check.update(body.data)
    assert hmac.compare_digest(sent, check.digest())
    decode(stream, body)


def one_step(
    batch_size: int, fetched: int, dim: int, state: int, num_rows: int, trainers: int
) -> list[tuple[int, object]]:
    """(stream, message) of one step of one trainer, as trainer 0 and server 0 exchange them."""
    rng = np.random.default_rng(0)
    F = 26
    batches = [
        (
            i,
            Batch(
                labels=torch.zeros(batch_size),
                dense=torch.randn(batch_size, 13),
                rows=torch.from_numpy((rng.zipf(1.15, batch_size * F) % num_rows).astype(np.int64)),
                offsets=torch.arange(batch_size * F + 1),
                num_features=F,
            ),
        )
        for i in range(4)
    ]
    oracle = LookaheadOracle(num_rows=num_rows, cache_rows=num_rows // 20, lookahead=2)
    plan = partition(list(oracle.plans(batches))[-1], trainers)[0]
    rows = np.sort(rng.choice(num_rows, fetched, replace=False)).astype(np.int64) // 2
    w = rng.standard_normal((fetched, dim)).astype(np.float32)
    s = rng.standard_normal((fetched, state)).astype(np.float32)
    return [
        (PLAN, plan),
        (CREDIT, 1),
        (REQUEST, {"op": "read", "rows": rows, "after": 3, "count": True}),
        (REPLY, {"w": w, "s": s}),
        (REQUEST, {"op": "write", "rows": rows, "w": w, "s": s}),
        (REQUEST, {"op": "mark", "label": 3}),
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=2048, help="global batch (split over --trainers)")
    p.add_argument("--trainers", type=int, default=2)
    p.add_argument("--fetched", type=int, default=2130, help="rows a trainer fetches (and writes back) per step")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--num-rows", type=int, default=33_762_577)
    p.add_argument("--samples-per-s", type=float, default=18_000, help="bench distributed's throughput, for the share")
    args = p.parse_args()
    torch.set_num_threads(1)
    msgs = one_step(args.batch_size, args.fetched, args.dim, 1, args.num_rows, args.trainers)
    ways = {"pickle": pickle_both_ends, "wire": wire_both_ends}
    times: dict[str, list[float]] = {k: [] for k in ways}
    for i in range(args.repeat + 5):
        for name, fn in list(ways.items())[:: 1 if i % 2 else -1]:
            t0 = time.process_time()
            for stream, m in msgs:
                fn(stream, m)
            if i >= 5:
                times[name].append(time.process_time() - t0)
    step_ms = 1000 * args.batch_size / args.samples_per_s
    med = {k: 1000 * statistics.median(v) for k, v in times.items()}
    for k, v in med.items():
        q = np.percentile(times[k], [25, 75]) * 1000
        print(f"{k:7s} {v:6.3f} ms CPU per step (both ends; middle half {q[0]:.3f}-{q[1]:.3f} ms)")
    extra = med["wire"] - med["pickle"]
    print(
        f"difference {extra:+.3f} ms per step = {extra / step_ms:+.2%} of a {step_ms:.0f} ms step "
        f"({args.samples_per_s:,.0f} samples/s at batch {args.batch_size})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
