"""`bagpipe synth` makes datasets with the properties the rest of bagpipe relies on.

What this proves:
* skew: in criteo-kaggle data (200k samples, scale 1) the hottest 1% of rows of the large
  tables take 85-95% of their accesses, the hot rows are scattered over the table, and
  the tables below 10,000 rows are near uniform;
* determinism: the same config gives byte-identical shard files, another seed different
  ones, and neither the eval fraction nor the shard size changes the samples;
* the meta is right: table sizes, samples per split, ids in range, dtypes, click rate,
  provenance; ``scale`` changes the cardinalities; bad configs raise ConfigError;
* the CLI writes a dataset and refuses to overwrite one without --overwrite (exit 2, one
  line on stderr);
* the labels are learnable: logistic regression on the ``tiny`` profile reaches eval AUC
  well above 0.5 in 300 Adam steps.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from bagpipe.cli import main
from bagpipe.data.profiles import PROFILES, profile_tables
from bagpipe.data.schema import DatasetMeta
from bagpipe.data.shards import Dataset
from bagpipe.data.synthetic import (
    SKEW_MIN_ROWS,
    SynthConfig,
    generate,
    power_law_top_share,
    table_exponents,
    top_share,
)
from bagpipe.errors import ConfigError

pytestmark = pytest.mark.unit

CRITEO = [
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
]  # fmt: skip


def load_split(path, split: str):
    ds = Dataset(path)
    shards = [ds.shard(split, i) for i in range(len(ds.shard_sizes(split)))]
    return (
        np.concatenate([np.asarray(s.labels) for s in shards]),
        np.concatenate([np.asarray(s.dense) for s in shards]),
        np.concatenate([np.asarray(s.sparse) for s in shards]),
    )


def load_all(path):
    parts = [load_split(path, s) for s in ("train", "eval") if s in DatasetMeta.load(path).splits]
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(3))


def files_of(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def criteo(tmp_path_factory):
    out = tmp_path_factory.mktemp("criteo")
    meta = generate(SynthConfig(profile="criteo-kaggle", samples=200_000, seed=0), out, progress=False)
    return out, meta, load_all(out)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    meta = generate(SynthConfig(profile="tiny", samples=40_000, seed=3), out, progress=False)
    return out, meta


# ----------------------------------------------------------------------------- skew


@pytest.mark.parametrize("name", ["C10", "C24", "C26"])
def test_large_tables_top_one_percent_take_about_ninety_percent(criteo, name):
    _, meta, (_, _, sparse) = criteo
    j = [f.name for f in meta.features].index(name)
    n = meta.features[j].num_rows
    share = top_share(sparse[:, j], n)
    assert 0.85 <= share <= 0.95, f"{name} (n={n}): top-1% share {share:.3f}"


def test_calibrated_exponents_give_the_same_true_share_for_every_large_table():
    sizes = profile_tables("criteo-kaggle")
    exps = table_exponents(sizes, 1.15)
    large = [(n, s) for n, s in zip(sizes, exps) if n >= SKEW_MIN_ROWS]
    assert len(large) == 10
    for n, s in large:
        assert power_law_top_share(n, s) == pytest.approx(0.90, abs=0.01)
    # the 10M-row table keeps (about) the configured exponent
    assert exps[sizes.index(10131227)] == pytest.approx(1.15, abs=0.01)


def test_hot_rows_are_scattered_over_the_table(criteo):
    _, meta, (_, _, sparse) = criteo
    j = [f.name for f in meta.features].index("C24")
    n = meta.features[j].num_rows
    counts = np.bincount(sparse[:, j].astype(np.int64), minlength=n)
    hot = np.argsort(counts)[-math.ceil(0.01 * n) :]
    # not the rows 0..k-1: the hot set spreads over the whole id range
    assert np.mean(hot < math.ceil(0.01 * n)) < 0.05
    assert np.histogram(hot, bins=10, range=(0, n))[0].min() > 0


def test_small_tables_are_near_uniform(criteo):
    _, meta, (_, _, sparse) = criteo
    checked = 0
    for j, f in enumerate(meta.features):
        n = f.num_rows
        if n >= SKEW_MIN_ROWS or n < 100:
            continue
        counts = np.bincount(sparse[:, j].astype(np.int64), minlength=n)
        assert (counts > 0).all(), f"{f.name}: some rows never accessed"
        assert top_share(sparse[:, j], n, 0.10) < 0.25, f.name  # uniform would be 0.10
        checked += 1
    assert checked == 9


# ----------------------------------------------------------------------------- determinism


def test_same_seed_gives_identical_bytes_other_seed_differs(tmp_path):
    def make(name, seed):
        cfg = SynthConfig(profile="tiny", samples=20_000, seed=seed, rows_per_shard=6000)
        generate(cfg, tmp_path / name, progress=False)
        return files_of(tmp_path / name)

    a, b, c = make("a", 5), make("b", 5), make("c", 6)
    assert len(a) > 10 and a.keys() == b.keys()
    assert a == b
    assert a.keys() == c.keys()
    differing = [k for k in a if a[k] != c[k] and not k.endswith("meta.json")]
    assert any(k.endswith("sparse.npy") for k in differing)
    assert any(k.endswith("labels.npy") for k in differing)


def test_eval_fraction_and_shard_size_do_not_change_the_samples(tmp_path):
    base: dict[str, Any] = dict(profile="tiny", samples=70_000, seed=1)  # > one 64k chunk
    generate(SynthConfig(**base, eval_fraction=0.1), tmp_path / "a", progress=False)
    generate(SynthConfig(**base, eval_fraction=0.3, rows_per_shard=10_007), tmp_path / "b", progress=False)
    for x, y in zip(load_all(tmp_path / "a"), load_all(tmp_path / "b")):
        np.testing.assert_array_equal(x, y)


# ----------------------------------------------------------------------------- meta


def test_meta_matches_the_data(tiny):
    out, meta = tiny
    assert meta == DatasetMeta.load(out)
    assert meta.table_sizes == list(PROFILES["tiny"].cardinalities)
    assert meta.dense_names == [f"I{i}" for i in range(1, 14)]
    assert meta.num_samples("train") == 36_000 and meta.num_samples("eval") == 4_000
    assert meta.id_dtype == "int32"
    assert meta.source == {
        "tool": "bagpipe synth", "profile": "tiny", "seed": 3, "scale": 1.0,
        "zipf_exponent": 1.15, "samples": 40_000,
    }  # fmt: skip
    labels, dense, sparse = load_all(out)
    assert labels.dtype == np.float32 and set(np.unique(labels)) == {0.0, 1.0}
    assert 0.18 <= labels.mean() <= 0.32
    assert dense.dtype == np.float32 and dense.shape == (40_000, 13)
    assert (dense >= 0).all() and np.isfinite(dense).all() and dense.std(axis=0).min() > 0.1
    assert sparse.dtype == np.int32 and sparse.shape == (40_000, 8)
    assert (sparse >= 0).all() and (sparse < np.array(meta.table_sizes)).all()


def test_criteo_meta_and_click_rate(criteo):
    _, meta, (labels, _, sparse) = criteo
    assert meta.table_sizes == CRITEO and meta.total_rows == 33_762_577
    assert meta.num_samples("train") == 180_000 and meta.num_samples("eval") == 20_000
    assert [f.name for f in meta.features] == [f"C{i}" for i in range(1, 27)]
    assert (sparse >= 0).all() and (sparse < np.array(CRITEO)).all()
    assert 0.2 <= labels.mean() <= 0.3


def test_avazu_profile(tmp_path):
    cfg = SynthConfig(profile="avazu", samples=30_000, scale=0.01, seed=2)
    meta = generate(cfg, tmp_path, progress=False)
    assert meta.num_features == 21 and meta.dense_names == ["hour_of_day", "day_of_week"]
    assert "device_ip" in [f.name for f in meta.features]
    labels, dense, sparse = load_all(tmp_path)
    assert dense.min() >= 0 and dense.max() <= 1
    assert len(np.unique(dense[:, 0])) == 24 and len(np.unique(dense[:, 1])) == 7
    assert (sparse < np.array(meta.table_sizes)).all()
    assert 0.15 <= labels.mean() <= 0.3


def test_scale_changes_cardinalities(tmp_path):
    assert profile_tables("criteo-kaggle", 0.01) == [max(1, round(n * 0.01)) for n in CRITEO]
    assert min(profile_tables("criteo-kaggle", 1e-4)) == 1
    assert profile_tables("tiny", 2.0) == [2 * n for n in PROFILES["tiny"].cardinalities]
    cfg = SynthConfig(profile="criteo-kaggle", samples=5_000, scale=0.001)
    meta = generate(cfg, tmp_path, progress=False)
    assert meta.table_sizes == profile_tables("criteo-kaggle", 0.001)
    assert meta.source["scale"] == 0.001
    _, _, sparse = load_all(tmp_path)
    assert (sparse < np.array(meta.table_sizes)).all()


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(profile="criteo"),
        dict(samples=0),
        dict(samples=-5),
        dict(samples=2.5),
        dict(scale=0),
        dict(scale=float("nan")),
        dict(seed=-1),
        dict(eval_fraction=1.0),
        dict(eval_fraction=-0.1),
        dict(samples=1, eval_fraction=0.9),
        dict(zipf_exponent=0.1),
        dict(rows_per_shard=0),
    ],
)
def test_bad_config_raises_config_error(kwargs):
    args = dict(profile="tiny", samples=100) | kwargs
    with pytest.raises(ConfigError) as e:
        SynthConfig(**args)
    assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------- CLI


def test_cli_writes_and_refuses_to_overwrite(tmp_path, capsys):
    out = tmp_path / "ds"
    argv = ["synth", "--profile", "tiny", "--samples", "3000", "--seed", "4"]
    argv += ["--out", str(out), "--no-progress"]
    assert main(argv) == 0
    line = capsys.readouterr().out.strip()
    assert "\n" not in line and "2,700 train" in line and "300 eval" in line and str(out) in line
    assert DatasetMeta.load(out).num_samples("train") == 2700
    before = files_of(out)

    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "already holds a dataset" in err and "--overwrite" in err
    assert files_of(out) == before

    assert main(argv + ["--overwrite", "--eval-fraction", "0.5"]) == 0
    assert DatasetMeta.load(out).num_samples("eval") == 1500

    assert main(["synth", "--profile", "tiny", "--samples", "0", "--out", str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err.strip().startswith("bagpipe synth: error: samples")


# ----------------------------------------------------------------------------- learnability


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Mann-Whitney rank formula, ties get their average rank."""
    _, inv, counts = np.unique(scores, return_inverse=True, return_counts=True)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    ranks = (first + (counts + 1) / 2.0)[inv]
    pos = labels == 1
    n_pos, n_neg = pos.sum(), (~pos).sum()
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


@pytest.fixture
def one_thread():
    """A tiny model trains several times faster on one thread than on contended cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_labels_are_learnable(tiny, one_thread):
    out, meta = tiny
    ytr, dtr, itr = (torch.from_numpy(a) for a in load_split(out, "train"))
    yev, dev, iev = (torch.from_numpy(a) for a in load_split(out, "eval"))
    offsets = torch.tensor(np.concatenate([[0], np.cumsum(meta.table_sizes)[:-1]]))
    torch.manual_seed(0)
    emb = torch.nn.EmbeddingBag(meta.total_rows, 1, mode="sum")
    torch.nn.init.zeros_(emb.weight)
    lin = torch.nn.Linear(meta.num_dense, 1)
    opt = torch.optim.Adam([*emb.parameters(), *lin.parameters()], lr=0.05)

    def predict(ids, dense):
        return emb(ids.long() + offsets).squeeze(1) + lin(dense).squeeze(1)

    gen = torch.Generator().manual_seed(0)
    for _ in range(300):
        idx = torch.randint(0, len(ytr), (512,), generator=gen)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(predict(itr[idx], dtr[idx]), ytr[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        score = auc(yev.numpy(), predict(iev, dev).numpy())
    assert score > 0.65, f"eval AUC {score:.3f}"
