"""A trained model outside training: ``bagpipe export``, ``bagpipe predict``, ``bagpipe.load``.

* On the real Criteo sample (``../shared/data``; skipped when absent): preprocess, train
  DLRM, export; ``bagpipe predict`` on the raw eval lines reproduces ``bagpipe eval``'s
  log loss on the same lines within 1e-6; every exported table equals the checkpoint's
  rows bit for bit (several files: whole tables packed per shard, rows streamed in small
  chunks), and so do the dense parameters after loading; the TorchRec names compute
  TorchRec's DLRM (a plain re-implementation of its forward over the exported tensors
  gives bagpipe's logits); ``bagpipe.load`` scores raw lines and ids alike; a bad input
  line is reported as ``FILE:LINE: problem`` (or skipped, writing ``nan``).
* On synthetic data (no raw format): a DeepFM export keeps bagpipe's names, and the
  loaded model evaluates exactly as the run did.
* Each bad use is a one-line error naming the problem.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from repo import SHARED_DATA
from runs import last_checkpoint

import bagpipe
from bagpipe.data.shards import Dataset
from bagpipe.export import tensorfile
from bagpipe.export.write import export_run
from bagpipe.train.evaluate import evaluate

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]

CRITEO = SHARED_DATA / "criteo" / "kaggle_train_head10k.tsv"
TRAIN = ("--steps", 60, "--batch-size", 128, "--lr", 0.01, "--no-progress", "--eval-samples", 0)


def read_json(path) -> dict:
    return json.loads(Path(path).read_text())


def assert_one_line_error(result: tuple[int, str, str], fragment: str) -> None:
    """``result``: ``run_cli``'s (exit code, stdout, stderr)."""
    rc, _, err = result
    assert rc == 2 and fragment in err and len(err.strip().splitlines()) == 1, err


@pytest.fixture(scope="module")
def criteo(tmp_path_factory):
    """(dataset, run, export) of DLRM trained with Adam on the preprocessed Criteo sample."""
    if not CRITEO.exists():
        pytest.skip(f"the real Criteo sample is not there: {CRITEO}")
    from bagpipe.cli import main

    root = tmp_path_factory.mktemp("criteo")
    data, run, out = root / "data", root / "run", root / "export"
    assert main(["preprocess", "criteo", "--input", str(CRITEO), "--out", str(data), "--no-progress"]) == 0
    assert main(["train", "--data", str(data), "--out", str(run), "--optimizer", "adam", *map(str, TRAIN)]) == 0
    # ~0.3 MB per file and 1,000-row chunks: several files, every big table in several chunks
    export_run(run, out, shard_bytes=300_000, chunk_rows=1000)
    return data, run, out


def test_predict_reproduces_eval_logloss(criteo, run_cli, tmp_path):
    data, run, out = criteo
    eval_lines = CRITEO.read_text().splitlines(keepends=True)[-1000:]  # the eval split: the last 10% of the lines
    raw = tmp_path / "eval.tsv"
    raw.write_text("".join(eval_lines))
    rc, stdout, err = run_cli("predict", "--model", out, "--input", raw, "--labelled", "--out", tmp_path / "p.txt")
    assert rc == 0, err
    probs = np.loadtxt(tmp_path / "p.txt")
    assert len(probs) == 1000 and np.all((probs > 0) & (probs < 1))
    rc, ev_out, err = run_cli("eval", "--run", run, "--data", data, "--json")
    assert rc == 0, err
    ev = json.loads(ev_out)
    assert ev["eval_samples"] == 1000
    labels = np.array([int(line.split("\t", 1)[0]) for line in eval_lines])
    from bagpipe.train.metrics import log_loss

    assert abs(log_loss(labels, probs.astype(np.float32)) - ev["eval_logloss"]) < 1e-6
    assert f"eval logloss {ev['eval_logloss']:.4f}" in stdout and "scored 1,000 of 1,000 lines" in stdout


def test_tables_and_dense_round_trip_bit_for_bit(criteo):
    from safetensors import safe_open

    data, run, out = criteo
    m = read_json(out / "model.json")
    weights = last_checkpoint(run).reader().arrays()[0]
    files = {t["file"] for t in m["tables"]}
    assert len(files) >= 3 and m["dense"]["naming"] == "torchrec"
    index = read_json(out / "model.safetensors.index.json")["weight_map"]
    for t in m["tables"]:
        assert t["key"] == f"sparse_arch.embedding_bag_collection.embedding_bags.{t['name']}.weight"
        rows = np.asarray(weights[t["row_offset"] : t["row_offset"] + t["num_embeddings"]])
        with safe_open(str(out / t["file"]), "pt") as f:
            assert np.array_equal(f.get_tensor(t["key"]).numpy(), rows)
        assert np.array_equal(tensorfile.open_tensor(out / t["file"], t["key"]), rows)
        assert index[t["key"]] == t["file"]
    assert sum(t["num_embeddings"] for t in m["tables"]) == len(weights)
    assert (out / "vocab" / "vocab.json").exists() and m["preprocessing"]["format"] == "criteo"
    model = bagpipe.load(out)
    saved = last_checkpoint(run).dense["model"]
    assert model.net.state_dict().keys() == saved.keys()
    assert all(torch.equal(model.net.state_dict()[k], v) for k, v in saved.items())


def torchrec_dlrm(t: dict[str, torch.Tensor], dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
    """torchrec.models.dlrm.DLRM's forward written out over its state_dict (no TorchRec needed):
    DenseArch MLP, concatenation with the pooled features, dots of the strict upper
    triangle, OverArch MLP and its final Linear."""
    x, i = dense, 0
    while f"dense_arch.model._mlp.{i}._linear.weight" in t:
        x = F.relu(
            F.linear(x, t[f"dense_arch.model._mlp.{i}._linear.weight"], t[f"dense_arch.model._mlp.{i}._linear.bias"])
        )
        i += 1
    combined = torch.cat([x.unsqueeze(1), pooled], dim=1)
    n = combined.shape[1]
    rows, cols = torch.triu_indices(n, n, offset=1)
    z = torch.cat([x, torch.bmm(combined, combined.transpose(1, 2))[:, rows, cols]], dim=1)
    i = 0
    while f"over_arch.model.0._mlp.{i}._linear.weight" in t:
        z = F.relu(
            F.linear(z, t[f"over_arch.model.0._mlp.{i}._linear.weight"], t[f"over_arch.model.0._mlp.{i}._linear.bias"])
        )
        i += 1
    return F.linear(z, t["over_arch.model.1.weight"], t["over_arch.model.1.bias"]).squeeze(1)


def test_torchrec_names_compute_torchrec_dlrm(criteo):
    from safetensors.torch import load_file

    _, _, out = criteo
    model = bagpipe.load(out)
    g = torch.Generator().manual_seed(0)
    dense = torch.randn(5, len(model.dense_names), generator=g)
    pooled = torch.randn(5, len(model.features), model.config.embedding_dim, generator=g)
    with torch.no_grad():
        ours = model.net(dense, pooled)
    theirs = torchrec_dlrm(load_file(str(out / "dense.safetensors")), dense, pooled)
    torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-6)


def test_load_takes_the_exports_model_json_and_names_a_run_folder(criteo):
    """bagpipe.load(EXPORT/model.json) said "no model.json"; load(RUN) did not say to export first."""
    _, run, out = criteo
    assert bagpipe.load(out / "model.json", verify=False).manifest == bagpipe.load(out, verify=False).manifest
    with pytest.raises(bagpipe.errors.DataError, match=r"a run folder, not an export: `bagpipe export --run "):
        bagpipe.load(run)


def test_load_scores_raw_lines_and_ids_alike(criteo):
    _, _, out = criteo
    model = bagpipe.load(out)
    lines = CRITEO.read_text().splitlines()[-8:]
    from_lines = model.predict_lines(lines, labelled=True)
    fmt = model.raw_format(labelled=True)
    from bagpipe.preprocess.vocab import map_ids

    raw, bad = fmt.parse_block(("\n".join(lines) + "\n").encode(), 8, fmt.layout("x", b""), stop_at_bad=True)
    ids, _ = map_ids(fmt, model.mapping(), raw)
    from_ids = model.predict(fmt.transform_dense(raw.dense), ids.T)
    assert not bad and from_lines.shape == (8,)
    np.testing.assert_allclose(from_lines, from_ids, rtol=1e-6)
    one = model.predict_lines(lines[0], labelled=True)  # a string is one line, not its characters
    assert one.shape == (1,)
    np.testing.assert_allclose(one, from_lines[:1], rtol=1e-6)  # (another batch: float rounding)
    three = model.predict_lines("".join(ln + "\n" for ln in lines[:3]), labelled=True)
    np.testing.assert_allclose(three, from_lines[:3], rtol=1e-6)
    with pytest.raises(bagpipe.errors.ParseError, match=r"<lines>:2: the item holds a line break"):
        model.predict_lines([lines[0], lines[1] + "\n" + lines[2]], labelled=True)  # 2 items, 3 lines
    with pytest.raises(bagpipe.errors.DataError, match=r"table C1: ids must be in \[0, "):
        model(np.zeros((1, 13)), np.full((1, 26), 10**9))
    with pytest.raises(bagpipe.errors.ParseError, match=r"<lines>:2: label 'x' is not 0 or 1"):
        model.predict_lines([lines[0], "x" + lines[1][1:]], labelled=True)


def test_bad_lines_are_reported_by_line_number(criteo, run_cli, tmp_path):
    _, _, out = criteo
    lines = CRITEO.read_text().splitlines(keepends=True)[-5:]
    lines[2] = "\t".join(lines[2].split("\t")[:-3]) + "\n"  # 37 fields
    raw = tmp_path / "bad.tsv"
    raw.write_text("".join(lines))
    assert_one_line_error(
        run_cli("predict", "--model", out, "--input", raw, "--labelled", "--out", tmp_path / "p.txt"),
        f"{raw}:3: expected 40 tab-separated fields, got 37",
    )
    assert list(tmp_path.glob("*p.txt")) == []  # no partial output
    rc, stdout, err = run_cli(
        "predict", "--model", out, "--input", raw, "--labelled", "--on-error", "skip", "--out", tmp_path / "p.txt"
    )
    assert rc == 0, err
    written = (tmp_path / "p.txt").read_text().splitlines()
    assert len(written) == 5 and written[2] == "nan" and "nan" not in written[:2] + written[3:]
    assert "scored 4 of 5 lines" in stdout and f"{raw}:3:" in stdout


def test_synthetic_deepfm_export_keeps_bagpipe_names_and_evaluates_as_the_run(tiny_data, tmp_path, run_cli):
    run, out = tmp_path / "run", tmp_path / "export"
    rc, _, err = run_cli(
        "train",
        "--data",
        tiny_data,
        "--out",
        run,
        "--model",
        "deepfm",
        "--steps",
        30,
        "--batch-size",
        128,
        "--no-progress",
    )
    assert rc == 0, err
    rc, stdout, err = run_cli("export", "--run", run, "--out", out)
    assert rc == 0 and "dense layers with bagpipe names" in stdout and "no preprocessing vocabulary" in stdout, err
    model = bagpipe.load(out)
    s = read_json(run / "summary.json")
    ev = evaluate(model.net, model.lookup, Dataset(tiny_data), 128)  # the run evaluated with its --batch-size
    assert ev["eval_logloss"] == s["eval_logloss"] and ev["eval_auc"] == s["eval_auc"]
    with pytest.raises(bagpipe.errors.DataError, match="trained on data without a raw format"):
        model.predict_lines(["1\t2"])
    # one-line errors of the commands
    assert_one_line_error(run_cli("export", "--run", run, "--out", out), "already holds an export (pass --overwrite")
    assert run_cli("export", "--run", run, "--out", out, "--overwrite")[0] == 0
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    assert_one_line_error(run_cli("export", "--run", run, "--out", tmp_path / "other"), "holds no export")
    assert_one_line_error(
        run_cli("export", "--run", run, "--out", tmp_path / "e2", "--shard-mb", 0), "--shard-mb must be > 0"
    )
    assert_one_line_error(run_cli("export", "--run", tmp_path, "--out", tmp_path / "e3"), "not a bagpipe run directory")
    assert_one_line_error(
        run_cli("export", "--run", run, "--out", tmp_path / "e4", "--data", tmp_path / "nowhere"),
        "the run's dataset is not there",
    )
    assert_one_line_error(run_cli("predict", "--model", out, "--input", run / "config.json"), "without a raw format")
    assert_one_line_error(
        run_cli("predict", "--model", tmp_path, "--input", run / "config.json"), "not a finished bagpipe export"
    )


def test_a_vocabulary_other_than_the_runs_is_refused_and_check_names_its_change(criteo, run_cli, tmp_path):
    """The data set's fingerprint covered meta.json and the shards, not vocab/: a data set
    whose shards matched but whose vocabulary differed was exported without a word, and
    half the predictions of raw lines changed (newcomer round 6)."""
    import shutil

    data, run, _ = criteo
    meta = read_json(data / "meta.json")
    assert any(k.startswith("vocab/") for k in meta["files"])  # preprocess records the vocabulary's sums
    changed = tmp_path / "data"
    shutil.copytree(data, changed)
    keys = changed / "vocab" / "C1.keys.npy"
    k = np.load(keys)
    k[0] ^= 1  # another key for row 0: every shard and meta.json unchanged
    np.save(keys, k)
    assert_one_line_error(
        run_cli("export", "--run", run, "--data", changed, "--out", tmp_path / "e"),
        f"{keys}: changed since the data set was written",
    )
    assert not (tmp_path / "e").exists()
    rc, out, err = run_cli("check", changed)
    assert rc == 2 and f"{keys}: damaged data set file" in out and "the vocabulary has problems" in err
    rc, out, _ = run_cli("check", data)
    assert rc == 0 and "shards and the vocabulary ok" in out
    # preprocessed from other lines: another vocabulary, so another fingerprint
    lines = CRITEO.read_text().splitlines(keepends=True)[:2000]
    for name, text in (("a", lines), ("b", [ln.replace("05db9164", "00000000") for ln in lines])):
        (tmp_path / f"{name}.tsv").write_text("".join(text))
        assert run_cli("preprocess", "criteo", "--input", tmp_path / f"{name}.tsv", "--out", tmp_path / name,
                       "--no-progress")[0] == 0  # fmt: skip
    fa, fb = (Dataset(tmp_path / n).fingerprint() for n in "ab")
    assert fa != fb


def test_predict_out_dev_stdout_into_a_pipe_or_a_file_writes_every_line_in_order(criteo, tmp_path):
    """--out /dev/stdout into a pipe was a traceback (a temporary file under /proc/PID/fd);
    into `> file` a second open of the file let the summary line overwrite predictions."""
    import os
    import subprocess
    import sys

    _, _, out = criteo
    lines = tmp_path / "l.tsv"
    lines.write_text("".join(CRITEO.read_text().splitlines(keepends=True)[-50:]))
    cmd = [sys.executable, "-m", "bagpipe.cli", "predict", "--model", str(out), "--input", str(lines), "--labelled"]
    piped = subprocess.run([*cmd, "--out", "/dev/stdout"], capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0, piped.stderr
    assert piped.stderr.splitlines()[-1].startswith("scored 50 of 50 lines")  # beside the predictions, not in them
    probs = [float(x) for x in piped.stdout.splitlines()]
    assert len(probs) == 50 and all(0 < p < 1 for p in probs)
    with open(tmp_path / "o.txt", "w") as f:  # the shell's `> o.txt`
        assert subprocess.run([*cmd, "--out", "/dev/stdout"], stdout=f, timeout=120).returncode == 0
    written = (tmp_path / "o.txt").read_text().splitlines()
    assert written == piped.stdout.splitlines()  # every prediction, in order, and nothing else
    assert not os.path.isfile("/dev/stdout") or os.path.islink("/dev/stdout")  # never replaced by a file


def test_predict_refuses_another_format(criteo, run_cli, tmp_path):
    _, _, out = criteo
    assert_one_line_error(
        run_cli("predict", "--model", out, "--format", "avazu", "--input", CRITEO),
        "was trained on criteo data, not avazu",
    )


@pytest.mark.parametrize("command", ["export", "predict", "plot"])
def test_new_commands_teach_with_examples(run_cli, command):
    rc, stdout, _ = run_cli(command, "--help")
    assert rc == 0 and "Examples:" in stdout and f"bagpipe {command} " in stdout
