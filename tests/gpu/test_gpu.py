"""The GPU path on a GPU (``--device cuda``), and the same checks on the CPU twin where they apply.

Tests marked ``gpu`` need a CUDA GPU and skip without one, saying why. Where a check is
about the copies' ordering rather than the GPU's arithmetic, it is parametrized over
``cuda`` (tier ``gpu``) and ``cpu-async`` (the asynchronous twin, tier ``unit`` or
``integration``), so the CPU suite runs its logic too:

* **exact on the device** (gpu): with torch's deterministic algorithms (on by default),
  ``lookahead`` (memory store), ``lru`` (disk store), ``nocache`` and ``fae`` on cuda end
  with ``--mode full`` on cuda's params_sha256, for every model and every row-wise
  optimizer (the twin's version of this matrix is ``tests/integration/test_exactness.py``);
* **CPU and GPU agree** (gpu, and the twin against the CPU): ``full`` and ``lookahead`` on
  the device end within 1e-4 of ``full`` on the CPU in eval log loss after a short run;
* **staged rows through pinned memory** (both): on cuda the host buffers of a transfer are
  pinned and the staged rows live in GPU memory; rows arrive and return exactly;
* **stream ordering** (both): a copy on a side stream delayed on purpose is not seen by the
  compute stream unless it waits for the copy's event; with the wait it is;
* **a checkpoint written on a GPU loads anywhere** (gpu): ``bagpipe eval`` on the host reads it;
* **distributed on GPUs** (gpu): one trainer on a GPU with one embedding server ends with
  full-on-cuda's digest; two trainers with a GPU each run NCCL (skips below two GPUs) and
  end within 1e-5 of full on cuda;
* **the benchmark** (gpu): ``bagpipe bench modes --quick --device cuda`` runs every mode.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from runs import trained

from bagpipe.cache.slots import SlotCache
from bagpipe.cache.transfer import Transfers
from bagpipe.checkpoint import latest
from bagpipe.config.train import TrainConfig, only_applicable
from bagpipe.device import open_device
from bagpipe.device.cuda import cuda_unavailable_reason

NO_GPU = cuda_unavailable_reason()
needs_gpu = [pytest.mark.gpu, pytest.mark.skipif(NO_GPU is not None, reason=f"needs a CUDA GPU: {NO_GPU}")]
pytestmark = [pytest.mark.timeout(900), pytest.mark.usefixtures("one_thread")]  # tiny models: one thread is faster


def device_params(cpu_tier) -> list:
    """``cuda`` as a gpu test, ``cpu-async`` (the twin) as a test of ``cpu_tier``."""
    return [pytest.param("cuda", marks=needs_gpu, id="cuda"), pytest.param("cpu-async", marks=cpu_tier, id="twin")]


STEPS, BATCH = 60, 128
MODELS = ("dlrm", "deepfm", "wide_deep", "dcn")
OPTIMIZERS = ("sgd", "adagrad", "adam", "partial_rowwise_adam")
ADAM = dict(lr=0.01, embedding_lr=0.02, weight_decay=1e-3, lr_schedule="warmup-poly", lr_warmup_steps=10,
            lr_decay_start=20, lr_decay_steps=30)  # fmt: skip


def cfg(data: str, out, **kw) -> TrainConfig:
    base = dict(data=data, out=str(out), steps=STEPS, batch_size=BATCH, lr=0.05, seed=7, progress=False,
                eval_samples=2048)  # fmt: skip
    if kw.get("optimizer") in ("adam", "partial_rowwise_adam"):
        base |= ADAM
    return TrainConfig.of(**only_applicable(base | kw))  # a matrix may give a mode another's settings


@pytest.fixture(scope="module")
def full_on(tiny_data, tmp_path_factory):
    """``full_on(device, model, optimizer)``: the summary of ``--mode full`` there (cached)."""

    @functools.cache
    def run(device: str, model: str = "dlrm", optimizer: str = "adagrad") -> dict:
        out = tmp_path_factory.mktemp(f"full-{device}-{model}-{optimizer}")
        return trained(cfg(tiny_data, out, mode="full", device=device, model=model, optimizer=optimizer)) | {"out": out}

    return run


# exact on the device ---------------------------------------------------------------------
CACHED = [("lookahead", "memory"), ("lru", "disk"), ("nocache", "memory"), ("fae", "memory")]


@pytest.mark.parametrize("mode,store", CACHED, ids=[m for m, _ in CACHED])
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.gpu
@pytest.mark.skipif(NO_GPU is not None, reason=f"needs a CUDA GPU: {NO_GPU}")
def test_every_cached_mode_on_cuda_equals_full_on_cuda(tiny_data, full_on, tmp_path, model, optimizer, mode, store):
    ref = full_on("cuda", model, optimizer)
    extra = dict(hot_budget_mb=0.05) if mode == "fae" else dict(cache_rows=2000, lookahead=4)
    got = trained(cfg(tiny_data, tmp_path / "run", mode=mode, store=store, device="cuda", model=model,
                    optimizer=optimizer, **extra))  # fmt: skip
    assert got["device"].startswith("cuda:")
    assert got["cache"]["rows_fetched"] > 0
    assert got["params_sha256"] == ref["params_sha256"]


# CPU and GPU agree ---------------------------------------------------------------------------
@pytest.mark.parametrize("device", device_params(pytest.mark.integration))
def test_cpu_and_device_runs_agree_in_eval_log_loss(tiny_data, full_on, tmp_path, device):
    cpu = full_on("cpu")
    on_device = [full_on(device), trained(cfg(tiny_data, tmp_path / "la", mode="lookahead", device=device,
                                            cache_rows=2000, lookahead=4))]  # fmt: skip
    for s in on_device:
        assert s["eval_samples"] == cpu["eval_samples"] > 0
        assert abs(s["eval_logloss"] - cpu["eval_logloss"]) < 1e-4
    assert on_device[0]["params_sha256"] == on_device[1]["params_sha256"]


# staged rows, pinned memory, stream ordering --------------------------------------------------
@pytest.fixture
def opened(request):
    device = open_device(request.param)
    yield device
    device.close()


@pytest.mark.parametrize("opened", device_params(pytest.mark.unit), indirect=True)
def test_staged_rows_go_through_pinned_host_buffers_and_arrive_exactly(opened):
    device = opened
    made: list[torch.Tensor] = []
    host_empty = device.host_empty

    def recorded(shape, dtype=torch.float32):
        made.append(host_empty(shape, dtype))
        return made[-1]

    device.host_empty = recorded  # every host buffer the transfers ask for
    t = Transfers(device)
    cache = SlotCache(64, 8, 2, device.torch)
    w = np.random.default_rng(0).standard_normal((20, 8)).astype(np.float32)
    s = np.random.default_rng(1).standard_normal((20, 2)).astype(np.float32)
    staged = t.stage(w, s)
    assert staged.ready is not None and staged.weights.device == device.torch
    slots = np.arange(40, 60)
    t.install(cache, slots, np.arange(20), staged)
    back = t.download(*cache.take(slots[::-1]))
    got_w, got_s = back.result()
    np.testing.assert_array_equal(got_w, w[::-1])
    np.testing.assert_array_equal(got_s, s[::-1])
    assert len(made) == 4 and all(b.device.type == "cpu" for b in made)
    if device.name == "cuda":
        assert all(b.is_pinned() for b in made) and cache.weights.is_cuda


def delay(device, stream) -> None:
    """Hold ``stream``'s next work back for a while (on the twin every side-stream copy is held until needed)."""
    if device.name == "cuda":
        with torch.cuda.stream(stream.stream):
            torch.cuda._sleep(int(2e8))  # ~0.1 s of GPU cycles


@pytest.mark.parametrize("opened", device_params(pytest.mark.unit), indirect=True)
def test_the_compute_stream_sees_a_side_copy_only_after_waiting_for_it(opened):
    device = opened
    up = device.stream()
    src = device.host_empty((1024, 16))
    src.copy_(torch.arange(1024 * 16, dtype=torch.float32).view(1024, 16))

    def upload():
        dst = device.empty((1024, 16))
        dst.zero_()  # on the compute stream: before the copy (the side stream waits for it)
        up.wait(device.compute.record())
        delay(device, up)
        device.copy(dst, src, up)
        return dst, up.record()

    dst, ready = upload()
    early = dst.clone()  # no wait: the copy has not run yet
    device.compute.wait(ready)
    late = dst.clone()
    assert not torch.equal(early.cpu(), src) and torch.equal(late.cpu(), src)


# checkpoints, distributed, benchmark (GPU only) -------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(NO_GPU is not None, reason=f"needs a CUDA GPU: {NO_GPU}")
def test_a_checkpoint_written_on_a_gpu_is_evaluated_on_the_host(tiny_data, tmp_path, run_cli):
    out = tmp_path / "run"
    s = trained(cfg(tiny_data, out, mode="lookahead", device="cuda", cache_rows=2000, lookahead=4))
    ck = latest(out)
    assert ck is not None and all(v.device.type == "cpu" for v in ck.dense["model"].values())
    rc, stdout, err = run_cli("eval", "--run", out, "--data", tiny_data, "--json", "--max-samples", 2048,
                              "--batch-size", BATCH)  # fmt: skip
    assert rc == 0, err
    assert json.loads(stdout)["eval_logloss"] == pytest.approx(s["eval_logloss"], abs=1e-4)  # the host's kernels


def bagpipe(*args, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bagpipe.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def distributed(data: str, out, trainers: int) -> dict:
    r = bagpipe("train", "--data", data, "--out", out, "--steps", STEPS, "--batch-size", BATCH, "--lr", 0.05,
                "--seed", 7, "--eval-samples", 2048, "--no-progress", "--mode", "lookahead", "--cache-rows", 2000,
                "--lookahead", 4, "--trainers", trainers, "--servers", 1, "--device", "cuda")  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads((out / "summary.json").read_text())


@pytest.mark.gpu
@pytest.mark.skipif(NO_GPU is not None, reason=f"needs a CUDA GPU: {NO_GPU}")
def test_one_trainer_on_a_gpu_with_a_server_equals_full_on_the_gpu(tiny_data, full_on, tmp_path):
    s = distributed(tiny_data, tmp_path / "d", trainers=1)
    assert s["device"].startswith("cuda:0") and s["distributed"]["trainer_backend"] == "none"
    assert s["params_sha256"] == full_on("cuda")["params_sha256"]


@pytest.mark.gpu
@pytest.mark.skipif(NO_GPU is not None or torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_two_trainers_with_a_gpu_each_use_nccl(tiny_data, full_on, tmp_path):
    out = tmp_path / "d"
    s = distributed(tiny_data, out, trainers=2)
    assert s["distributed"]["trainer_backend"] == "nccl"
    ref = latest(full_on("cuda")["out"])
    got = latest(out)
    assert ref is not None and got is not None
    w, s_ = got.reader().arrays()
    rw, rs = ref.reader().arrays()
    for a, b in (
        (w, rw),
        (s_, rs),
        *((got.dense["model"][k].numpy(), v.numpy()) for k, v in ref.dense["model"].items()),
    ):
        assert np.abs(a.astype(np.float64) - b).max() <= 1e-5 * max(float(np.abs(b).max()), 1e-12)


@pytest.mark.gpu
@pytest.mark.skipif(NO_GPU is not None, reason=f"needs a CUDA GPU: {NO_GPU}")
def test_bench_modes_runs_on_cuda(tmp_path):
    r = bagpipe("bench", "modes", "--quick", "--device", "cuda", "--out", tmp_path / "b")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((tmp_path / "b" / "results.json").read_text())["results"]
    assert set(res) == {"full/memory", "nocache/memory", "lru/memory", "lookahead/memory"}
