"""Compare two bagpipe runs' final checkpoints, tensor by tensor.

    python tools/compare_runs.py RUN_A RUN_B [--tolerance 1e-5]

Prints, for the worst tensor, max |a - b| relative to the tensor's scale (max |b|),
and exits 1 if it exceeds --tolerance (0 = must be bitwise equal). Dense parameters,
every embedding row and its optimizer state are compared.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from bagpipe.checkpoint import latest


def tensors(run: str) -> dict[str, np.ndarray]:
    ck = latest(run)
    if ck is None:
        raise SystemExit(f"{run}: no checkpoint")
    out = {f"dense/{k}": v.numpy() for k, v in ck.dense["model"].items()}
    out["embedding weights"], out["embedding optimizer state"] = ck.reader().arrays()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--tolerance", type=float, default=1e-5)
    args = ap.parse_args(argv)
    a, b = tensors(args.a), tensors(args.b)
    if a.keys() != b.keys():
        raise SystemExit("the runs have different parameters")
    worst, name = 0.0, "-"
    for k in b:
        if b[k].size == 0:
            continue
        rel = float(np.abs(np.asarray(a[k], np.float64) - b[k]).max() / max(float(np.abs(b[k]).max()), 1e-30))
        if rel > worst:
            worst, name = rel, k
    ok = worst <= args.tolerance
    print(f"largest difference: {worst:.2e} of the tensor's scale ({name}); tolerance {args.tolerance:g}: {'ok' if ok else 'EXCEEDED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
