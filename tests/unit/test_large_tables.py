"""The pieces that let bagpipe train tables larger than memory (issue 15), each in isolation.

* The lookahead oracle's window-sized row map (:class:`WindowMap`, used when a per-row
  map would exceed ``DENSE_MAP_BYTES``) gives exactly the plans of the per-row map --
  every field of every plan, over random batch sequences with a cache so small the oracle
  must force rows out -- and holds far fewer entries than the table has rows.
* The ``criteo-1tb`` profile has MLPerf DLRM-DCNv2's 26 cardinalities (204.2M rows) and
  multi-hot bag sizes (214 ids a sample); a generated sample of it stores the multi-hot
  tables as multi-hot features whose every bag has its size, and the batches carry them.
* The ``dcn-mlperf`` recipe is MLPerf's DLRM-DCNv2 (D = 128, bottom 512-256-128, three
  rank-512 cross layers over the 27 vectors, top 1024-1024-512-256-1: counted parameter by
  parameter); another model with it is one line naming the fix.
* A cgroup memory limit holds: a child that touches more memory than its group's limit
  is killed and the group reports the OOM kill and a peak within the limit (skipped, with
  the reason, where no memory cgroup can be made).
* The disk store's hinted read path (``MADV_WILLNEED`` rounds) returns exactly the
  written rows when a read spans several hint rounds.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from bagpipe.data.batch import Batch
from bagpipe.errors import ConfigError
from bagpipe.oracle.plan import same_plan

pytestmark = pytest.mark.unit


def _batch(rows: np.ndarray) -> Batch:
    n = len(rows)
    return Batch(
        labels=torch.zeros(n),
        dense=torch.zeros(n, 1),
        rows=torch.from_numpy(rows),
        offsets=torch.arange(n + 1),
        num_features=1,
    )


@pytest.mark.parametrize("retain", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_window_map_plans_equal_the_per_row_map(seed, retain, monkeypatch):
    import bagpipe.oracle.lookahead as la

    rng = np.random.default_rng(seed)
    num_rows = 5000
    batches = [(k, _batch(rng.zipf(1.3, size=200).astype(np.int64) % num_rows)) for k in range(60)]
    cache = 1 + max(len(np.unique(b.rows.numpy())) for _, b in batches)  # forces evictions with L = 6

    def plans(dense_limit):
        monkeypatch.setattr(la, "DENSE_MAP_BYTES", dense_limit)
        o = la.LookaheadOracle(num_rows, cache, 6, retain=retain)
        return o, list(o.plans(batches))

    dense, a = plans(1 << 40)
    window, b = plans(0)
    assert isinstance(dense.latest, la.DenseMap) and isinstance(window.latest, la.WindowMap)
    assert len(a) == len(b) == 60
    assert all(same_plan(x, y) for x, y in zip(a, b))
    # the small cache made the oracle force rows out (retaining: write back rows it had kept)
    assert (dense.stats.retained_evictions if retain else dense.stats.forced_evictions) > 0
    assert len(window.latest.rows) < num_rows // 2 and window.latest.nbytes < dense.latest.nbytes


def test_criteo_1tb_profile_is_mlperf_dcnv2():
    from bagpipe.data.profiles import PROFILES, profile_tables

    p = PROFILES["criteo-1tb"]
    assert len(p.cardinalities) == len(p.bag_sizes) == 26 and max(p.cardinalities) == 40_000_000
    assert sum(profile_tables("criteo-1tb")) == 204_184_588
    assert sum(p.bag_sizes) == 214 and p.bag_sizes[20] == 100


def test_criteo_1tb_sample_is_multi_hot(tmp_path):
    from bagpipe.data.shards import Dataset
    from bagpipe.data.stream import BatchStream
    from bagpipe.data.synthetic import PROFILES, SynthConfig, generate

    generate(SynthConfig(profile="criteo-1tb", samples=600, scale=1e-4, seed=3), tmp_path / "d", progress=False)
    ds = Dataset(tmp_path / "d")
    bags = PROFILES["criteo-1tb"].bag_sizes
    assert [f.multi_hot for f in ds.meta.features] == [k > 1 for k in bags]
    b = BatchStream(ds, "train", 32, seed=0).batch(0)
    lengths = np.diff(b.offsets.numpy()).reshape(26, 32)  # bag j: feature j // B of sample j % B
    assert (lengths == np.array(bags)[:, None]).all()
    assert b.rows.numel() == 32 * 214 and int(b.rows.max()) < ds.meta.total_rows


def test_dcn_mlperf_recipe():
    from bagpipe.models import build_model, recipe

    cfg = recipe("dcn", "dcn-mlperf")
    assert (cfg.embedding_dim, cfg.bottom_mlp, cfg.top_mlp, cfg.cross_layers, cfg.cross_rank, cfg.dcn_stacked) == (
        128,
        (512, 256, 128),
        (1024, 1024, 512, 256),
        3,
        512,
        True,
    )
    model = build_model(cfg, 13, 26)
    K = 27 * 128
    bottom = (13 * 512 + 512) + (512 * 256 + 256) + (256 * 128 + 128)
    cross = 3 * (K * 512 + 512 * K + K)
    top = (K * 1024 + 1024) + (1024 * 1024 + 1024) + (1024 * 512 + 512) + (512 * 256 + 256) + (256 + 1)
    assert sum(p.numel() for p in model.parameters()) == bottom + cross + top
    out = model(torch.randn(4, 13), torch.randn(4, 26, 128))
    assert out.shape == (4,) and torch.isfinite(out).all()


def test_dcn_mlperf_recipe_brings_mlperfs_optimizer_unless_given():
    from bagpipe.config.train import TrainConfig, load_config

    base = dict(data="d", out="o", steps=1, model="dcn", recipe="dcn-mlperf")
    cfg = TrainConfig.of(**base)
    assert (cfg.optim.optimizer, cfg.optim.lr) == ("adagrad", 0.005)
    assert load_config(None, base).optim.lr == 0.005  # the command line's path
    assert TrainConfig.of(**base, lr=0.01).optim.lr == 0.01
    assert TrainConfig.of(**base, optimizer="sgd").optim.lr == 0.05  # another optimizer: the default rate
    assert TrainConfig.of(data="d", out="o", steps=1).optim.lr == 0.05  # the debug recipe: the default rate


def test_dcn_mlperf_recipe_is_dcn_only():
    from bagpipe.models import recipe

    with pytest.raises(ConfigError, match="recipe dcn-mlperf is MLPerf's DLRM-DCNv2: use it with model dcn, not dlrm"):
        recipe("dlrm", "dcn-mlperf")


def test_memory_limit_holds():
    from bagpipe.testbed.memlimit import MemoryGroup, find_memory_controller

    controller, why = find_memory_controller()
    if controller is None:
        pytest.skip(why)
    with MemoryGroup(controller, 64 << 20, "bagpipe-test") as group:
        touch = "b = bytearray(256 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1"
        proc = subprocess.run([sys.executable, "-c", touch], preexec_fn=group.enter, capture_output=True)
        report = group.report()
    assert proc.returncode == -9  # SIGKILL from the OOM killer
    assert report["oom_kills"] >= 1 and 0 < report["peak_mb"] <= 64


def test_hinted_reads_across_rounds(tmp_path):
    import bagpipe.store.disk as disk
    from bagpipe.store.diskio import PAGE, DiskIO
    from bagpipe.store.init import RowInitializer

    init = RowInitializer([3000, 7000], 8, seed=1)
    rng = np.random.default_rng(0)
    io = DiskIO(threads=3, hint_bytes=100 * PAGE)  # several hint rounds (of 100 rows) per read and write
    with disk.DiskStore(init, 1, tmp_path / "s", io=io) as store:
        rows = rng.choice(10_000, 900, replace=False)
        w = rng.standard_normal((900, 8)).astype(np.float32)
        st = rng.standard_normal((900, 1)).astype(np.float32)
        store.write(rows, w, st)
        store.drop_page_cache()
        perm = rng.permutation(900)
        rw, rs = store.read(rows[perm])
        assert np.array_equal(rw, w[perm]) and np.array_equal(rs, st[perm])
        other = np.setdiff1d(np.arange(10_000), rows)[:500]
        ow, os_ = store.read(other)
        assert np.array_equal(ow, init.rows(other)) and not os_.any()
