"""``python -m bagpipe.gpucheck.docs RESULTS [--doc docs/gpu.md]``: put a gpu-check's
results into the GPU section of docs/gpu.md (between its begin and end markers).

Only a run on a GPU fills it: the results of a dry run (``--device cpu-async``) are
refused in one line, so no CPU figure is ever shown as a GPU figure.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bagpipe.gpucheck.report import BEGIN, END, docs_section


def fill(doc: str, results: dict) -> str:
    """``doc`` with the text between the markers replaced by ``results``' section."""
    if doc.count(BEGIN) != 1 or doc.count(END) != 1 or doc.index(BEGIN) > doc.index(END):
        raise ValueError(f"the document needs one {BEGIN!r} line and one {END!r} line after it")
    head, rest = doc.split(BEGIN)
    _, tail = rest.split(END)
    return head + BEGIN + "\n" + docs_section(results) + "\n" + END + tail


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bagpipe.gpucheck.docs", description=__doc__)
    p.add_argument("results", type=Path, help="a gpu-check's results folder (its results.json)")
    p.add_argument("--doc", type=Path, default=Path("docs/gpu.md"), help="the document to fill (default: docs/gpu.md)")
    args = p.parse_args(argv)
    try:
        results = json.loads((args.results / "results.json").read_text())
        if results["environment"]["device"] != "cuda":
            raise ValueError(
                f"{args.results}: a dry run on {results['environment']['device']}, not a GPU run: "
                "its figures are not GPU figures"
            )
        args.doc.write_text(fill(args.doc.read_text(), results))
    except (OSError, ValueError, KeyError) as e:
        print(f"gpu-check docs: {e}", file=sys.stderr)
        return 2
    print(f"gpu-check docs: {args.doc} filled from {args.results}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
