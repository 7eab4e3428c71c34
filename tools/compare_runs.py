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

from bagpipe.checkpoint.compare import checkpoint_tensors, worst_difference
from bagpipe.errors import CheckpointError


def tensors(run: str) -> dict[str, np.ndarray]:
    try:
        return checkpoint_tensors(run)
    except CheckpointError as e:
        raise SystemExit(str(e)) from None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--tolerance", type=float, default=1e-5)
    args = ap.parse_args(argv)
    a, b = tensors(args.a), tensors(args.b)
    if a.keys() != b.keys():
        raise SystemExit("the runs have different parameters")
    worst, name = worst_difference(a, b)
    ok = worst <= args.tolerance
    print(
        f"largest difference: {worst:.2e} of the tensor's scale ({name}); tolerance {args.tolerance:g}: {'ok' if ok else 'EXCEEDED'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
