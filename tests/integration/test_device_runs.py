"""Training runs on the device seam, on a CPU: what the GPU path's ordering rests on.

* The asynchronous twin (``--device cpu-async``) catches a missing wait: a run whose step
  installs staged rows without waiting for their copy, or whose write-back thread writes a
  host buffer without waiting for its copy, ends with a ``params_sha256`` that differs from
  ``--mode full``'s (NaN reaches the rows), while the same run with the wait ends equal
  (``tests/integration/test_exactness.py``) -- and on the plain CPU device, where copies are done on return, the same dropped wait
  changes nothing (which is why the twin exists).
* The paths the exactness matrix (``tests/integration/test_exactness.py``, which runs every cached mode
  through the twin) does not reach: ``fae`` (its hot rows are loaded through staged copies
  and written back at the end through downloads) equals ``full``; ``hotline`` (the deferred
  read executor stages on its reader thread) on the twin equals ``hotline`` on the plain
  CPU, bit for bit; a run on the twin with evaluations and checkpoints mid-run resumes to
  the uninterrupted digest.
* The summary names the device; ``--device cuda`` without a GPU is one line and exit 2
  from ``bagpipe train`` and from ``bagpipe bench modes``.
"""

from __future__ import annotations

import functools
import json

import pytest
import torch
from runs import trained

import bagpipe.cache.transfer as transfer
from bagpipe.config.train import TrainConfig, only_applicable
from bagpipe.device.cuda import cuda_unavailable_reason
from bagpipe.train.guards import Diverged
from bagpipe.train.loop import train

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]

STEPS, BATCH = 60, 64


def cfg(data: str, out, **kw) -> TrainConfig:
    base = dict(data=data, out=str(out), steps=STEPS, batch_size=BATCH, lr=0.05, seed=7, progress=False,
                eval_samples=512, cache_rows=1500, lookahead=4)  # fmt: skip
    return TrainConfig.of(**only_applicable(base | kw))  # every mode is given the cache settings


@pytest.fixture(scope="module")
def full(tiny_data, tmp_path_factory):
    @functools.cache
    def run(model: str = "dlrm") -> dict:
        return trained(cfg(tiny_data, tmp_path_factory.mktemp(f"full-{model}"), mode="full", model=model))

    return run


def install_without_waiting(self, cache, slots, rows, staged):
    """Transfers.install with its wait dropped: the rows are installed as they are now."""
    cache.install(slots, rows, staged.weights, staged.state)


def result_without_waiting(self):
    """Download.result with its wait dropped: the host buffers are read as they are now."""
    return self.weights.numpy(), self.state.numpy()


DROPPED = {"install": (transfer.Transfers, "install", install_without_waiting),
           "write-back": (transfer.Download, "result", result_without_waiting)}  # fmt: skip


@pytest.mark.parametrize("mode", ["lookahead", "nocache"])
@pytest.mark.parametrize("wait", list(DROPPED))
def test_the_twin_catches_a_missing_wait(tiny_data, tmp_path, monkeypatch, wait, mode):
    """Rows the twin has not copied yet read NaN: without the install's wait they reach the
    step at once, without the write-back's wait they reach the store and come back later;
    either way the loss stops being finite and the run stops naming the step (with the wait,
    these runs equal --mode full: tests/integration/test_exactness.py)."""
    monkeypatch.setattr(*DROPPED[wait])
    first = "at step 1: " if wait == "install" else ""
    with pytest.raises(Diverged, match=f"training diverged {first}.*the loss is nan"):
        train(cfg(tiny_data, tmp_path / "without", mode=mode, device="cpu-async"))


def test_a_dropped_wait_is_harmless_where_copies_are_synchronous(tiny_data, full, tmp_path, monkeypatch):
    for target in DROPPED.values():
        monkeypatch.setattr(*target)
    got = trained(cfg(tiny_data, tmp_path / "run", mode="lookahead", device="cpu"))
    assert got["params_sha256"] == full()["params_sha256"]


def test_fae_on_the_twin_equals_full(tiny_data, full, tmp_path):
    got = trained(cfg(tiny_data, tmp_path / "fae", mode="fae", hot_budget_mb=0.02, device="cpu-async"))
    assert got["cache"]["hot"]["rows"] > 0
    assert got["params_sha256"] == full()["params_sha256"]


def test_hotline_on_the_twin_equals_hotline_on_the_cpu(tiny_data, tmp_path):
    a, b = (trained(cfg(tiny_data, tmp_path / d, mode="hotline", hot_budget_mb=0.02, device=d, optimizer="sgd"))
            for d in ("cpu", "cpu-async"))  # fmt: skip
    assert a["params_sha256"] == b["params_sha256"] and a["cache"]["rows_fetched"] > 0


def test_evaluations_checkpoints_and_resume_on_the_twin(tiny_data, full, tmp_path):
    run = tmp_path / "run"
    settings = dict(mode="lookahead", device="cpu-async", eval_every=20, checkpoint_every=20)
    half = trained(cfg(tiny_data, run, steps=40, **settings))
    assert half["device"].startswith("cpu-async")
    resumed = trained(cfg(tiny_data, run, resume=True, **settings))
    assert resumed["steps_this_run"] == STEPS - 40
    assert resumed["params_sha256"] == full()["params_sha256"]
    evals = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in evals if "eval_auc" in r] == [20, 40, 60]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: --device cuda runs")
def test_train_on_cuda_without_a_gpu_is_one_line(tiny_data, tmp_path, run_cli):
    rc, out, err = run_cli("train", "--data", tiny_data, "--out", tmp_path / "r", "--steps", 2, "--device", "cuda")
    assert rc == 2
    assert err.strip() == f"bagpipe train: error: --device cuda: {cuda_unavailable_reason()}; use --device cpu"
    assert not (tmp_path / "r").exists()  # nothing half-made


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: --device cuda runs")
def test_bench_modes_on_cuda_without_a_gpu_is_one_line(tmp_path, run_cli):
    rc, out, err = run_cli("bench", "modes", "--quick", "--device", "cuda", "--out", tmp_path / "b")
    assert rc == 2
    assert err.strip() == f"bagpipe bench: error: --device cuda: {cuda_unavailable_reason()}; use --device cpu"
    assert not (tmp_path / "b").exists()
