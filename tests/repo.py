"""Where the tests find the repository, wherever under ``tests/`` they sit.

* ``ROOT``: the repository's root (pyproject.toml, README.md, docs/);
* ``PACKAGE``: the ``bagpipe/`` package folder;
* ``SHARED_DATA``: the real data samples in ``../shared/data`` beside the repository
  (absent on most machines: the tests that need them skip, saying so).
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "bagpipe"
SHARED_DATA = ROOT.parent / "shared" / "data"
