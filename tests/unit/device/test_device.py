"""The device seam (``bagpipe/device/``) and the copy path through it (``bagpipe/cache/transfer.py``).

* The asynchronous CPU twin (``--device cpu-async``) behaves as a GPU may: a copy on a
  side stream has not happened when ``copy`` returns (its destination reads NaN), reads
  its source only when it runs, runs once an event recorded after it is waited for
  (by the host, or by the compute stream, or through another stream's wait), keeps each
  stream's order, reorders copies of different streams, and finishes every copy on
  ``close``; an error inside a copy reaches whoever waits.
* :class:`Transfers` moves rows store -> staging -> cache -> host exactly, through the twin
  and through the plain CPU device (where nothing is staged: the store's arrays are
  installed as they are).
* The executors (synchronous, deferred read, pipelined) end with the store holding every
  update, bit for bit, when their copies go through the twin (lookahead plans with
  forced evictions).
* Placement: trainer LOCAL_RANK k takes ``cuda:k`` and has a GPU of its own when k is below
  the GPU count; the trainers' collectives run NCCL only when every trainer has its own
  GPU on ``--device cuda``.
* ``--device cuda`` on a machine without a GPU is a one-line error naming why; the modes
  and options that do not run on a GPU are refused in one line; every ``--device`` name
  has a device.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from bagpipe.cache.executor import DeferredReadExecutor, PlanExecutor
from bagpipe.cache.pipelined import PipelinedExecutor
from bagpipe.cache.slots import SlotCache
from bagpipe.cache.transfer import Transfers
from bagpipe.config.sections import DeviceName
from bagpipe.config.train import TrainConfig
from bagpipe.config.typed import choices
from bagpipe.device import DEVICES, HostDevice, open_device
from bagpipe.device.cuda import cuda_unavailable_reason
from bagpipe.device.placement import place_trainer, trainer_backend
from bagpipe.device.twin import AsyncTwin
from bagpipe.errors import ConfigError
from bagpipe.oracle.lookahead import LookaheadOracle
from bagpipe.store.init import RowInitializer
from bagpipe.store.memory import MemoryStore

pytestmark = pytest.mark.unit

D, S = 4, 1


@pytest.fixture
def twin():
    t = AsyncTwin(hold_s=(0.2, 0.4), seed=1)
    yield t
    t.close()
    assert not t._worker.is_alive()


def ones(n: int, value: float = 1.0) -> torch.Tensor:
    return torch.full((n, D), value)


# the twin ----------------------------------------------------------------------------
def test_a_copy_has_not_happened_when_it_returns_and_has_once_waited_for(twin):
    side = twin.stream()
    src, dst = ones(3, 2.0), twin.empty((3, D), stream=side)
    twin.copy(dst, src, side)
    done = side.record()
    assert torch.isnan(dst).all()  # held back: nobody waits yet
    done.synchronize()
    assert torch.equal(dst, src)


def test_a_copy_reads_its_source_when_it_runs(twin):
    side = twin.stream()
    src, dst = ones(2, 1.0), twin.empty((2, D), stream=side)
    twin.copy(dst, src, side)
    src += 5  # changing the source before the copy's event: the copy sees the change
    side.record().synchronize()
    assert torch.equal(dst, ones(2, 6.0))


def test_the_compute_stream_waiting_runs_the_copies_before_the_event(twin):
    side = twin.stream()
    src, dst = ones(2, 3.0), twin.empty((2, D), stream=side)
    twin.copy(dst, src, side)
    t0 = time.monotonic()
    twin.compute.wait(side.record())
    assert torch.equal(dst, src) and time.monotonic() - t0 < 0.2  # not held for its 0.2-0.4 s


def test_a_stream_waiting_for_another_orders_the_copies_and_without_it_they_race(twin):
    """host -> dev on stream a, dev -> host on stream b: b must wait for a's event."""
    up, down = twin.stream(), twin.stream()
    src, dev, back = ones(2, 4.0), twin.empty((2, D), stream=up), twin.host_empty((2, D))
    twin.copy(dev, src, up)
    down.wait(up.record())
    twin.copy(back, dev, down)
    down.record().synchronize()  # demands b's copy, and through its wait a's
    assert torch.equal(back, src)

    dev2, back2 = twin.empty((2, D), stream=up), twin.host_empty((2, D))
    twin.copy(dev2, src, up)
    twin.copy(back2, dev2, down)  # no wait: b's copy may run first, and reads a NaN device buffer
    down.record().synchronize()
    assert torch.isnan(back2).all()
    up.record().synchronize()
    assert torch.equal(dev2, src)


def test_each_stream_keeps_its_order(twin):
    side = twin.stream()
    dst = twin.empty((1, D), stream=side)
    for v in range(1, 6):
        twin.copy(dst, ones(1, float(v)), side)
    side.record().synchronize()
    assert torch.equal(dst, ones(1, 5.0))


def test_copies_of_different_streams_are_reordered():
    twin = AsyncTwin(hold_s=(0.0, 0.02), seed=3)
    try:
        streams = [twin.stream() for _ in range(3)]
        dsts = []
        for k in range(30):
            dst = twin.empty((1, D), stream=streams[k % 3])
            twin.copy(dst, ones(1, float(k)), streams[k % 3])
            dsts.append(dst)
        for s in streams:
            s.record().synchronize()
        assert [int(d[0, 0]) for d in dsts] == list(range(30))  # every copy ran, into its own buffer
        assert twin.reordered > 0  # some ran before an older copy of another stream
    finally:
        twin.close()


def test_close_runs_every_pending_copy():
    twin = AsyncTwin(hold_s=(5.0, 5.0))
    side = twin.stream()
    dst = twin.empty((2, D), stream=side)
    twin.copy(dst, ones(2, 7.0), side)
    t0 = time.monotonic()
    twin.close()
    assert torch.equal(dst, ones(2, 7.0)) and time.monotonic() - t0 < 3


def test_an_error_inside_a_copy_reaches_the_waiter(twin):
    side = twin.stream()
    twin.copy(twin.empty((2, D), stream=side), ones(3), side)  # shapes differ
    with pytest.raises(RuntimeError):
        side.record().synchronize()


def test_a_side_stream_writing_memory_allocated_for_another_stream_is_refused(twin):
    """CUDA's caching allocator hands a freed block back out to the stream it belongs to as
    soon as that stream's queued work allows: a side copy into the compute stream's memory
    can overwrite a tensor the compute stream's queued kernels still read (NaN on an H200
    at batch 16384). The twin has no allocator, so it refuses the pattern itself."""
    up, down = twin.stream(), twin.stream()
    for dst in (twin.empty((2, D)), twin.empty((2, D), stream=down)):  # the compute stream's, another side's
        with pytest.raises(RuntimeError, match="allocated for another stream"):
            twin.copy(dst, ones(2), up)
    mine = twin.empty((2, D), stream=up)
    twin.copy(mine, ones(2), up)
    twin.compute.wait(up.record())
    twin.copy(twin.host_empty((2, D)), mine, down)  # host buffers belong to no stream
    theirs = twin.empty((2, D))  # the compute stream's, written by `up` once it waited for compute
    up.wait(twin.compute.record())  # recorded after the allocation: compute's earlier work is done first
    twin.copy(theirs, ones(2), up)
    later = twin.empty((2, D))  # allocated after the event `up` waited for: refused again
    with pytest.raises(RuntimeError, match="allocated for another stream"):
        twin.copy(later, ones(2), up)


class _Recording(AsyncTwin):
    """The twin, noting which stream each device buffer was allocated and kept for."""

    def __init__(self) -> None:
        super().__init__(hold_s=(0.0, 0.01))
        self.allocated: list[object] = []
        self.kept: list[tuple[int, object]] = []

    def empty(self, shape, dtype=torch.float32, stream=None):
        self.allocated.append(stream)
        return super().empty(shape, dtype, stream)

    def keep_for(self, t, stream):
        self.kept.append((t.data_ptr(), stream))


def test_staged_rows_are_allocated_for_the_upload_stream_and_kept_for_the_compute_stream():
    device = _Recording()
    try:
        t = Transfers(device)
        cache = SlotCache(4, D, S, device.torch)
        staged = t.stage(np.ones((2, D), np.float32), np.zeros((2, S), np.float32))
        assert device.allocated == [t.upload, t.upload]
        t.install(cache, np.array([0, 3]), np.array([5, 9]), staged)
        assert device.kept == [(staged.weights.data_ptr(), device.compute), (staged.state.data_ptr(), device.compute)]
    finally:
        device.close()


# the copy path -------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["cpu", "cpu-async"])
def test_rows_travel_store_to_cache_to_host_exactly(name):
    device = open_device(name)
    try:
        t = Transfers(device)
        cache = SlotCache(8, D, S, device.torch)
        w = np.arange(12, dtype=np.float32).reshape(3, D)
        s = np.array([[1.5], [2.5], [3.5]], np.float32)
        staged = t.stage(w, s)
        if name == "cpu":  # nothing staged: the store's arrays are what is installed
            assert (
                staged.ready is None and staged.weights.numpy() is not w and np.shares_memory(staged.weights.numpy(), w)
            )
        t.install(cache, np.array([5, 1, 6]), np.array([10, 11, 12]), staged)
        assert cache.slot_rows[[5, 1, 6]].tolist() == [10, 11, 12]
        out = t.download(*cache.take(np.array([6, 5])))
        got_w, got_s = out.result()
        np.testing.assert_array_equal(got_w, w[[2, 0]])
        np.testing.assert_array_equal(got_s, s[[2, 0]])
        assert cache.slot_rows[[5, 6]].tolist() == [-1, -1]
    finally:
        device.close()


class _Trainer:
    """The update a step applies, on the cache and on a plain reference table."""

    def __init__(self, init: RowInitializer):
        self.w = init.range(0, init.num_rows)
        self.s = np.zeros((init.num_rows, S), np.float32)

    def step(self, ex: PlanExecutor, plan) -> None:
        ex.install()
        idx = torch.from_numpy(plan.slots)
        ex.cache.weights[idx] += float(plan.step + 1)
        ex.cache.state[idx] += 1.0
        self.w[plan.rows] += np.float32(plan.step + 1)
        self.s[plan.rows] += np.float32(1)


@pytest.mark.parametrize("kind", [PlanExecutor, DeferredReadExecutor, PipelinedExecutor])
def test_every_executor_through_the_twin_leaves_the_store_exact(kind):
    init = RowInitializer([40, 30], D, seed=3)
    rng = np.random.default_rng(0)
    p = 1.0 / np.arange(1, init.num_rows + 1)
    from bagpipe.data.batch import Batch

    def batch(rows: np.ndarray) -> Batch:
        n = len(rows)
        return Batch(torch.zeros(n), torch.zeros(n, 1), torch.from_numpy(rows), torch.arange(n + 1), 1)

    batches = [(k, batch(rng.choice(init.num_rows, size=12, p=p / p.sum()))) for k in range(30)]
    cache_rows, L = 12, 3
    oracle = LookaheadOracle(init.num_rows, cache_rows, L)
    plans = list(oracle.plans(iter(batches)))
    assert oracle.stats.forced_evictions > 0
    twin = AsyncTwin(hold_s=(0.0, 0.01), seed=5)
    store = MemoryStore(init, S)
    ex = kind(store, SlotCache(cache_rows, D, S), iter(plans), depth=L + 1, transfers=Transfers(twin))
    ref = _Trainer(init)
    try:
        for plan in ex:
            ref.step(ex, plan)
            ex.after_step(plan)
        ex.drain()
        ex.write_cached()
        ex.close()
    finally:
        ex.close(abandon=True)
        twin.close()
    assert twin.copies > 0
    w, s = store.read_range(0, init.num_rows)
    np.testing.assert_array_equal(w, ref.w)
    np.testing.assert_array_equal(s, ref.s)


# placement and configuration -------------------------------------------------------------
def test_a_trainer_takes_gpu_local_rank_and_owns_it_below_the_gpu_count():
    assert place_trainer("cuda", 0, 2) == place_trainer("cuda", 0, 2)
    p0, p1, p2 = (place_trainer("cuda", k, 2) for k in range(3))
    assert (p0.index, p0.own, p1.index, p1.own) == (0, True, 1, True)
    assert (p2.index, p2.own) == (0, False)  # a third trainer on a 2-GPU machine shares GPU 0
    assert place_trainer("cpu", 1, 8).index is None and place_trainer("cpu-async", 0, 0).tag == "shared"


def test_nccl_only_when_every_trainer_has_its_own_gpu():
    own = [place_trainer("cuda", k, 2).tag for k in range(2)]
    assert trainer_backend(own) == "nccl"
    assert trainer_backend(own + [place_trainer("cuda", 2, 2).tag]) == "gloo"
    assert trainer_backend([place_trainer("cpu", k, 2).tag for k in range(2)]) == "gloo"


def test_every_device_name_opens_a_device():
    names = choices(DeviceName)
    assert names is not None
    assert set(DEVICES) == set(names)
    for name in ("cpu", "cpu-async"):
        d = open_device(name)
        try:
            assert d.name == name and d.torch == torch.device("cpu")
        finally:
            d.close()
    assert isinstance(open_device("cpu"), HostDevice)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: cuda opens")
def test_cuda_without_a_gpu_is_one_line_naming_why():
    with pytest.raises(ConfigError) as e:
        open_device("cuda")
    msg = str(e.value)
    assert msg == f"--device cuda: {cuda_unavailable_reason()}; use --device cpu" and "\n" not in msg


@pytest.mark.parametrize(
    "settings,says",
    [
        (
            dict(mode="hotline"),
            "--device cuda runs --mode full or nocache or lru or lookahead or fae, got --mode hotline",
        ),
        (dict(mode="full", skip_stale=True), "--skip-stale runs on --device cpu"),
    ],
)
def test_what_does_not_run_on_a_gpu_is_refused_in_one_line(settings, says, tmp_path):
    with pytest.raises(ConfigError) as e:
        TrainConfig.of(data=str(tmp_path), out=str(tmp_path / "r"), device="cuda", **settings)
    assert says in str(e.value) and "\n" not in str(e.value)
