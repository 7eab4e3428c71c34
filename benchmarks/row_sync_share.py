"""How much of the exact row synchronisation of data-parallel trainers could an owner-based
sparse exchange avoid? (issue 31 item 4: the urgent row sync binds `lookahead` at 4-8
trainers in `bagpipe bench cluster`.)

Reads a data set's train split as N trainers of B samples each consume it (trainer k takes
samples [(t N + k) B, (t N + k + 1) B) at step t) and counts, per step t, the rows a
step's sync holds today (docs/distributed.md, "partitioned" cache):

  multi   rows used by >= 2 trainers at t: their gradients must be summed
  single  rows used by exactly 1 trainer at t and used again (by anyone) within L steps:
          synchronised today because the row stays cached on every trainer
  same    of single: the next use is by that same trainer alone (no transfer at all)

and the row transfers a step over all links together: a ring all-reduce of the sync set
moves 2 (N - 1) rows per row; an owner-based exchange (the users of a multi row send
their gradients to one of them, which sums them in trainer order and sends the sum back;
a single row goes only to the trainers of its next use) moves 2 (m - 1) per multi row
used by m trainers and the next use's trainers per single row. Counts only: no bytes on
a link, no timing, no claim about balance across links.

    bagpipe synth --profile criteo-kaggle --samples 2000000 --out /tmp/ck --no-progress
    python benchmarks/row_sync_share.py --data /tmp/ck --trainers 8 --batch-size 2048 --lookahead 20,50
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def uses(data: Path, n: int, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(row, step, trainer) of every distinct use, sorted by row, step, trainer; and the steps."""
    meta = json.loads((data / "meta.json").read_text())
    sizes = [f["num_rows"] for f in meta["features"] if not f.get("multi_hot")]
    off = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    shards = len(meta["splits"]["train"]["shard_sizes"])
    s = np.concatenate([np.load(data / "train" / f"{i:05d}" / "sparse.npy") for i in range(shards)])
    s = s.astype(np.int64) + off[None, :]
    steps = len(s) // (n * b)
    rows, st, tr = [], [], []
    for t in range(steps):
        for k in range(n):
            u = np.unique(s[(t * n + k) * b : (t * n + k + 1) * b])
            rows.append(u)
            st.append(np.full(len(u), t, np.int32))
            tr.append(np.full(len(u), k, np.int16))
    r, t_, k_ = np.concatenate(rows), np.concatenate(st), np.concatenate(tr)
    o = np.lexsort((k_, t_, r))
    return r[o], t_[o], k_[o], steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="a bagpipe data set (one-hot features)")
    p.add_argument("--trainers", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=2048, help="samples per trainer a step")
    p.add_argument("--lookahead", default="20,50", help="L values, comma-separated")
    a = p.parse_args()
    n = a.trainers
    rows, st, tr, steps = uses(a.data, n, a.batch_size)
    first = np.r_[True, (rows[1:] != rows[:-1]) | (st[1:] != st[:-1])]  # one group per (row, step)
    start = np.flatnonzero(first)
    grow, gst, gtr = rows[start], st[start], tr[start]
    users = np.diff(np.r_[start, len(rows)])
    has_next = np.r_[grow[1:] == grow[:-1], False]
    nxt_st = np.where(has_next, np.r_[gst[1:], 0], -1)
    nxt_users = np.where(has_next, np.r_[users[1:], 0], 0)
    nxt_tr = np.where(has_next, np.r_[gtr[1:], -1], -1)
    for lookahead in (int(x) for x in a.lookahead.split(",")):
        m = steps - lookahead  # steps whose window lies inside the data
        if m <= 0:
            print(f"L={lookahead}: the data holds {steps} steps, too few")
            continue
        sel = gst < m
        reused = has_next & (nxt_st - gst <= lookahead)
        multi = sel & (users >= 2)
        single = sel & (users == 1) & reused
        same = single & (nxt_users == 1) & (nxt_tr == gtr)
        ring = 2 * (n - 1) * (multi.sum() + single.sum())
        sparse = 2 * (users[multi] - 1).sum() + np.where(same[single], 0, nxt_users[single]).sum()
        print(
            f"N={n}, B={a.batch_size}, L={lookahead}, {m} steps: a step's sync set {(multi.sum() + single.sum()) / m:,.0f} "
            f"rows = multi {multi.sum() / m:,.0f} (mean users {users[multi].mean():.2f}) + single {single.sum() / m:,.0f} "
            f"(next use by the same trainer alone: {same.sum() / max(single.sum(), 1):.0%}); local (no reuse) "
            f"{(sel & (users == 1) & ~reused).sum() / m:,.0f}; row transfers a step, all links: ring "
            f"{ring / m:,.0f}, owner-based {sparse / m:,.0f} ({sparse / ring:.0%})"
        )


if __name__ == "__main__":
    main()
