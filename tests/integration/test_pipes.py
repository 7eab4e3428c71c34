"""``predict`` and ``preprocess`` read pipes: ``--input -``, ``/dev/stdin``, a FIFO.

What this proves, on small synthetic Criteo text (label, 13 integers, 26 hex categories):

* ``bagpipe preprocess criteo --input -`` fed through a real pipe (a child process with
  ``stdin=PIPE``), plain and gzip, writes the dataset the same lines in a file give:
  every shard and vocabulary file byte-identical, meta.json equal but for the input's
  name and size -- with the default fractional ``--split`` (the stream's text kept once
  beside --out, and removed) and in one pass (``--split 1``, hashing: nothing kept);
* the same through a FIFO made with ``os.mkfifo`` (what ``<(zcat x.gz)`` hands over),
  which is opened and read exactly once (a writer that writes once would block a
  second open for ever);
* ``bagpipe predict --input -`` and ``--input FIFO``, plain and gzip, print the
  probabilities the file gives, byte for byte;
* nothing is left beside --out (no spill folder), also when the stream's text does not
  fit there (one line saying where and what to do instead); the same stream named twice
  and an empty one are refused.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from bagpipe.cli import main

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]

LINES = 1500


def criteo_text(n: int, seed: int = 5) -> bytes:
    """``n`` Criteo lines: label, I1..I13 (some empty), C1..C26 from small vocabularies."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        label = str(int(rng.random() < 0.25))
        ints = ["" if rng.random() < 0.1 else str(int(rng.integers(-2, 500))) for _ in range(13)]
        cats = ["" if rng.random() < 0.05 else f"{int(rng.integers(0, 40 + 10 * j)):08x}" for j in range(26)]
        out.append("\t".join([label, *ints, *cats]))
    return ("\n".join(out) + "\n").encode()


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("pipes")
    text = criteo_text(LINES)
    plain, gz = root / "x.tsv", root / "x.tsv.gz"
    plain.write_bytes(text)
    gz.write_bytes(gzip.compress(text))
    return {"text": text, "plain": plain, "gz": gz, "root": root}


def bagpipe(args: list, data: bytes) -> subprocess.CompletedProcess:
    """``python -m bagpipe ARGS`` with ``data`` written into its standard input (a pipe)."""
    return subprocess.run(
        [sys.executable, "-m", "bagpipe", *map(str, args)], input=data, capture_output=True, timeout=300
    )


def fifo_feeding(path: Path, data: bytes) -> threading.Thread:
    """A FIFO at ``path`` and a thread that opens it once, writes ``data`` and closes it."""
    os.mkfifo(path)

    def feed():
        with open(path, "wb") as f:
            f.write(data)

    t = threading.Thread(target=feed, daemon=True)
    t.start()
    return t


def same_dataset(a: Path, b: Path) -> None:
    """Every file of dataset ``a`` equals ``b``'s, meta.json but for its inputs' names and sizes."""
    files_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    assert files_a == files_b
    for rel in files_a:
        if rel.name == "meta.json":
            ma, mb = json.loads((a / rel).read_text()), json.loads((b / rel).read_text())
            for m in (ma, mb):
                m.pop("meta_crc32")  # the sum of what differs
                for entry in m["source"]["inputs"]:
                    entry.pop("path"), entry.pop("bytes")
            assert ma == mb
        elif rel.name != ".bagpipe-files.json":
            assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel
    assert len(files_a) > 3


def beside(out: Path) -> list[str]:
    """What lies next to ``out`` besides it and the inputs (a spill folder left would show)."""
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith("."))


@pytest.mark.parametrize("extra", [[], ["--split", "1", "--max-rows-per-table", "997"]], ids=["split-0.9", "one-pass"])
@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "gzip"])
def test_preprocess_from_a_pipe_equals_the_file(raw, tmp_path, extra, compressed):
    ref = tmp_path / "ref" / "data"
    assert main(["preprocess", "criteo", "--input", str(raw["plain"]), "--out", str(ref), "--no-progress", *extra]) == 0
    out = tmp_path / "piped" / "data"
    data = raw["gz"].read_bytes() if compressed else raw["text"]
    done = bagpipe(["preprocess", "criteo", "--input", "-", "--out", out, "--no-progress", *extra], data)
    assert done.returncode == 0, done.stderr.decode()
    assert f"rows train {LINES if extra else 1350:,}" in done.stdout.decode()
    same_dataset(ref, out)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["source"]["inputs"][0]["path"] == "-" and meta["source"]["inputs"][0]["bytes"] == len(data)
    assert beside(out) == []  # the kept text removed


@pytest.mark.parametrize("extra", [[], ["--split", "1", "--max-rows-per-table", "997"]], ids=["split-0.9", "one-pass"])
def test_preprocess_from_a_fifo_reads_it_once_and_equals_the_file(raw, tmp_path, extra):
    ref = tmp_path / "ref" / "data"
    assert main(["preprocess", "criteo", "--input", str(raw["gz"]), "--out", str(ref), "--no-progress", *extra]) == 0
    fifo = tmp_path / "in.fifo"
    feeder = fifo_feeding(fifo, raw["gz"].read_bytes())
    out = tmp_path / "fifo" / "data"
    assert main(["preprocess", "criteo", "--input", str(fifo), "--out", str(out), "--no-progress", *extra]) == 0
    feeder.join(5)
    assert not feeder.is_alive()
    same_dataset(ref, out)
    assert beside(out) == []


def test_preprocess_from_dev_stdin_equals_the_file(raw, tmp_path):
    ref = tmp_path / "ref" / "data"
    assert main(["preprocess", "criteo", "--input", str(raw["plain"]), "--out", str(ref), "--no-progress"]) == 0
    out = tmp_path / "piped" / "data"
    done = bagpipe(["preprocess", "criteo", "--input", "/dev/stdin", "--out", out, "--no-progress"], raw["text"])
    assert done.returncode == 0, done.stderr.decode()
    same_dataset(ref, out)


def test_the_same_stream_twice_and_an_empty_one_are_refused(raw, tmp_path):
    done = bagpipe(["preprocess", "criteo", "--input", "-", "/dev/stdin", "--out", tmp_path / "d"], raw["text"])
    err = done.stderr.decode()
    assert done.returncode == 2 and "/dev/stdin: given twice" in err and len(err.strip().splitlines()) == 1, err
    done = bagpipe(["preprocess", "criteo", "--input", "-", "--out", tmp_path / "d"], b"")
    err = done.stderr.decode()
    assert done.returncode == 2 and "-: empty input (no lines)" in err and len(err.strip().splitlines()) == 1, err
    assert sorted(os.listdir(tmp_path)) == []


def test_a_pipe_that_does_not_fit_beside_out_is_one_line_and_leaves_nothing(raw, tmp_path, small_disk):
    disk = small_disk(tmp_path / "disk", "128k")  # the text is about 400 KB
    out = disk / "data"
    done = bagpipe(["preprocess", "criteo", "--input", "-", "--out", out, "--no-progress"], raw["text"])
    err = done.stderr.decode()
    assert done.returncode == 2 and len(err.strip().splitlines()) == 1, err
    assert f"-: cannot keep the pipe's text in {disk}/.data.spill-" in err and "No space left on device" in err, err
    assert "--split 0 or 1 (one pass, nothing kept)" in err
    assert os.listdir(disk) == []  # neither the kept text nor a partial dataset


@pytest.fixture(scope="module")
def export(raw, tmp_path_factory) -> Path:
    """An export of a DLRM trained a few steps on the synthetic lines."""
    root = tmp_path_factory.mktemp("model")
    data, run, out = root / "data", root / "run", root / "export"
    assert main(["preprocess", "criteo", "--input", str(raw["plain"]), "--out", str(data), "--no-progress"]) == 0
    train = ["train", "--data", str(data), "--out", str(run), "--steps", "8", "--batch-size", "64"]
    assert main([*train, "--no-progress", "--eval-samples", "64", "--threads", "1"]) == 0
    assert main(["export", "--run", str(run), "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "gzip"])
def test_predict_from_a_pipe_and_a_fifo_equals_the_file(raw, export, tmp_path, compressed):
    source = raw["gz"] if compressed else raw["plain"]
    # the file and a pipe into standard input, each in a process of its own (the same threads)
    done = bagpipe(["predict", "--model", export, "--input", source, "--labelled"], b"")
    assert done.returncode == 0, done.stderr.decode()
    expected = done.stdout
    assert len(expected.splitlines()) == LINES
    done = bagpipe(["predict", "--model", export, "--input", "-", "--labelled"], source.read_bytes())
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout == expected
    assert f"scored {LINES:,} of {LINES:,} lines of -" in done.stderr.decode()
    # a FIFO, as <(zcat x.gz) hands it over, in this process
    ref = tmp_path / "ref.txt"
    assert main(["predict", "--model", str(export), "--input", str(source), "--out", str(ref), "--labelled"]) == 0
    expected = ref.read_bytes()
    fifo = tmp_path / "in.fifo"
    feeder = fifo_feeding(fifo, source.read_bytes())
    out = tmp_path / "fifo.txt"
    assert main(["predict", "--model", str(export), "--input", str(fifo), "--out", str(out), "--labelled"]) == 0
    feeder.join(5)
    assert out.read_bytes() == expected
