"""Shared fixtures of the bagpipe test suite.

* ``tiny_data``: a session-wide synthetic dataset of the ``tiny`` profile (24,000
  samples: 21,600 train + 2,400 eval, one shard per split), made once with
  :func:`bagpipe.data.synthetic.generate`. Tests must treat it as read-only.
* ``run_cli``: runs ``bagpipe ARGS...`` in-process and returns ``(exit code, stdout,
  stderr)``; an ``argparse`` exit (``--help``, a bad choice) is turned into its code.
* ``small_disk``: ``small_disk(path, size)`` mounts a tmpfs of ``size`` ("256k") at
  ``path`` -- a real filesystem that fills up -- unmounted after the test; the test is
  skipped where none can be mounted (it needs root). ``small_disk.fill(path)`` fills it.

torch's thread count is left at its default here; modules whose models are tiny may
lower it for themselves (and restore it afterwards). The concurrency tests' fixtures
(``every_thread_ends``, ``clusters``) come from ``concurrency.py``, loaded as a plugin.
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from bagpipe.data.synthetic import SynthConfig, generate

pytest_plugins = ["concurrency"]

TINY_SAMPLES = 24_000
TINY_SEED = 1


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> str:
    """Directory of a finished ``tiny`` dataset (read-only, shared by the session)."""
    out = tmp_path_factory.mktemp("data") / "tiny"
    generate(SynthConfig(profile="tiny", samples=TINY_SAMPLES, seed=TINY_SEED), out, progress=False)
    return str(out)


@pytest.fixture
def run_cli(capsys):
    """``run_cli("train", "--data", ...) -> (rc, stdout, stderr)``, in this process."""
    from bagpipe.cli import main

    def run(*args) -> tuple[int, str, str]:
        capsys.readouterr()  # drop anything printed before
        try:
            rc = main([str(a) for a in args])
        except SystemExit as e:  # argparse: --help, --version, usage errors
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        out, err = capsys.readouterr()
        return rc, out, err

    return run


class SmallDisk:
    """``small_disk(path, size)`` mounts a tmpfs; ``small_disk.fill(path)`` fills it."""

    def __init__(self) -> None:
        self.made: list[Path] = []

    def __call__(self, where: Path, size: str) -> Path:
        where.mkdir(parents=True, exist_ok=True)
        if subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True
        ).returncode:
            pytest.skip("cannot mount a small tmpfs here (needs root)")
        self.made.append(where)
        return where

    def fill(self, where: Path) -> None:
        """Fill the filesystem of ``where`` with a file (another program's)."""
        fd = os.open(where / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while True:
                os.write(fd, b"x" * 512)
        except OSError as e:
            assert e.errno == errno.ENOSPC
        finally:
            os.close(fd)


@pytest.fixture
def small_disk() -> Iterator[SmallDisk]:
    disk = SmallDisk()
    yield disk
    for where in disk.made:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.fixture(scope="module")
def one_thread():
    """torch on one intra-op thread for a module whose models are tiny (threads only add
    overhead there, and stall on a busy host); restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


TIERS = ("unit", "integration", "distributed", "gpu")


def pytest_configure(config):
    """A bare GPU machine has pytest but not pytest-timeout (`make gpu-check` installs
    nothing): its ``timeout`` mark is then declared here, so ``--strict-markers`` still
    collects the modules that set one (they run without the per-test bound)."""
    if not config.pluginmanager.hasplugin("timeout"):
        config.addinivalue_line("markers", "timeout(seconds): per-test bound of pytest-timeout (absent: ignored)")


def pytest_collection_modifyitems(config, items):
    """Every test belongs to exactly one tier (tests/README.md); a test without one is a
    collection error, so the tiers stay complete as tests are added."""
    for item in items:
        tiers = [t for t in TIERS if item.get_closest_marker(t) is not None]
        if len(tiers) != 1:
            raise pytest.UsageError(
                f"{item.nodeid}: needs exactly one tier marker of {', '.join(TIERS)}, has {tiers or 'none'}"
            )
