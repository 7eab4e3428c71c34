"""Synthetic CTR datasets with the access skew of real click logs.

``generate(SynthConfig(profile="criteo-kaggle", samples=1_000_000), "data/ck")`` writes a
dataset in the shard format of :mod:`bagpipe.data.schema` whose tables have the sizes of
the named profile and whose ids follow the skew measured on real data: in every table of
at least :data:`SKEW_MIN_ROWS` rows, the 1% hottest rows receive ~90% of the accesses.

How a sample is made (all of it vectorised over chunks of :data:`CHUNK_SAMPLES`):

* **ids** -- for table t of n rows, a *rank* r in [0, n) is drawn from a truncated
  continuous power law, p(x) ~ x**-s on [1, n + 1), r = floor(x) - 1, by inverse CDF in
  closed form. The exponent s of large tables is calibrated per table so that the
  hottest 1% of ranks carry exactly the share of accesses a 10**7-row table has under
  ``zipf_exponent`` (0.90 for the default 1.15; the Criteo Kaggle 10M-row table thus keeps
  ~1.15, a 100k-row table gets a steeper exponent). Tables below ``SKEW_MIN_ROWS`` rows use
  a mild exponent (:data:`SMALL_TABLE_EXPONENT`) and are near uniform. The rank is then
  scattered by a seeded affine bijection ``id = (a * r + b) mod n`` with gcd(a, n) = 1, so
  hot rows are spread over the table rather than being rows 0..k.
* **dense** -- Criteo-like: ``log1p`` of a zero-inflated, floored log-normal count per
  feature. Avazu: hour of day and day of week (scaled to [0, 1]) of a clock that runs
  over 10 days from the first to the last sample, so the eval split is the last day(s).
* **label** -- a hidden logistic model: each (table, row) has a weight derived from a
  64-bit hash of (seed, table, row) (no per-row arrays, so 10M-row tables cost nothing),
  full size for the hottest 1% of ranks and decaying beyond, so the rows a learner sees
  often carry most of the signal; plus a linear term in the dense features, plus Gaussian
  noise, plus a bias calibrated on a pilot sample to hit the profile's click rate;
  through a sigmoid, then Bernoulli.

Everything is a pure function of the config: the same config gives byte-identical shard
files (chunk k uses the random stream ``(seed, 1, k)``), and the samples do not depend on
``eval_fraction`` or ``rows_per_shard``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

from bagpipe.data.profiles import PROFILES, profile_tables
from bagpipe.data.schema import META_FILE, DatasetMeta, FeatureSpec
from bagpipe.data.shards import DEFAULT_ROWS_PER_SHARD, ShardWriter
from bagpipe.errors import ConfigError
from bagpipe.hashing import splitmix64_
from bagpipe.output_dir import OutputDir

#: Tables with at least this many rows get the Zipf-like skew; smaller ones are near uniform.
SKEW_MIN_ROWS = 10_000
#: Power-law exponent of tables below SKEW_MIN_ROWS (0 would be exactly uniform).
SMALL_TABLE_EXPONENT = 0.3
#: The table size at which ``zipf_exponent`` is applied as is; see :func:`table_exponents`.
REFERENCE_ROWS = 10_000_000
#: Samples generated per step (bounds memory; part of the definition of the output).
CHUNK_SAMPLES = 1 << 16
#: The fraction of rows called "hot" throughout (the 1% of the skew statement).
HOT_FRACTION = 0.01

_PILOT_SAMPLES = 1 << 14
_SPARSE_SIGNAL_STD = 1.6  # std of the summed per-row weights of the hottest rows
_DENSE_SIGNAL_STD = 0.6  # std of the dense linear term
_NOISE_STD = 0.4  # Gaussian noise on the logit
_AVAZU_DAYS = 10


@dataclass(kw_only=True)
class SynthConfig:
    """What :func:`generate` makes."""

    profile: str
    """Dataset family: ``tiny``, ``criteo-kaggle``, ``criteo-1tb`` (multi-hot) or ``avazu`` (see :data:`PROFILES`)."""

    samples: int
    """Total number of samples over both splits (> 0)."""

    scale: float = 1.0
    """Multiplies every table's cardinality (rounded, at least 1 row per table); > 0."""

    seed: int = 0
    """Seeds everything: ids, permutations, hidden model, labels. Same config, same bytes."""

    eval_fraction: float = 0.1
    """The last ``round(samples * eval_fraction)`` samples form split ``eval``, the rest
    ``train``; in [0, 1)."""

    zipf_exponent: float = 1.15
    """Power-law exponent of a 10M-row table; it fixes the top-1% access share (0.90 at
    1.15) that every table of >= 10,000 rows is calibrated to. In [0.5, 3]."""

    rows_per_shard: int = DEFAULT_ROWS_PER_SHARD
    """Samples per shard file (> 0); does not change the samples themselves."""

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise ConfigError(f"unknown profile {self.profile!r} (choose from: {', '.join(PROFILES)})")
        if not _is_int(self.samples) or not 0 < self.samples < 1 << 63:
            raise ConfigError(f"samples must be a positive integer below 2^63, got {self.samples!r}")
        if not _is_real(self.scale) or not self.scale > 0 or not math.isfinite(self.scale):
            raise ConfigError(f"scale must be a finite number > 0, got {self.scale!r}")
        if not _is_int(self.seed) or not 0 <= self.seed < 1 << 63:
            raise ConfigError(f"seed must be an integer in [0, 2^63), got {self.seed!r}")
        if not _is_real(self.eval_fraction) or not 0 <= self.eval_fraction < 1:
            raise ConfigError(f"eval_fraction must be in [0, 1), got {self.eval_fraction!r}")
        if not _is_real(self.zipf_exponent) or not 0.5 <= self.zipf_exponent <= 3:
            raise ConfigError(f"zipf_exponent must be in [0.5, 3], got {self.zipf_exponent!r}")
        if not _is_int(self.rows_per_shard) or self.rows_per_shard <= 0:
            raise ConfigError(f"rows_per_shard must be a positive integer, got {self.rows_per_shard!r}")
        if self.samples - self.num_eval <= 0:
            raise ConfigError(
                f"eval_fraction {self.eval_fraction} of {self.samples} samples leaves no training samples"
            )
        biggest = max(profile_tables(self.profile, self.scale))
        if biggest >= 1 << 40:
            raise ConfigError(f"scale {self.scale} makes a table of {biggest} rows (limit 2**40)")

    @property
    def num_eval(self) -> int:
        return int(round(self.samples * self.eval_fraction))

    @property
    def num_train(self) -> int:
        return self.samples - self.num_eval


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _is_real(x) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


# --------------------------------------------------------------------------- skew


def hot_rows(n: int) -> int:
    """How many rows are "the top 1%" of an n-row table: ceil(0.01 * n)."""
    return max(1, math.ceil(HOT_FRACTION * n))


def power_law_top_share(n: int, s: float, k: int | None = None) -> float:
    """Share of accesses to the k (default: top 1%) hottest of n rows under the sampler.

    Exact for the discretised power law used here: rank r covers x in [r+1, r+2) of
    p(x) ~ x**-s on [1, n+1), so the top k ranks hold F(k+1).
    """
    k = hot_rows(n) if k is None else k
    if abs(1 - s) < 1e-12:
        return math.log(k + 1) / math.log(n + 1)
    e = 1 - s
    return math.expm1(e * math.log(k + 1)) / math.expm1(e * math.log(n + 1))


def table_exponents(table_sizes: list[int], zipf_exponent: float) -> list[float]:
    """The power-law exponent of each table.

    Tables of >= SKEW_MIN_ROWS rows: the exponent whose top-1% share equals that of a
    REFERENCE_ROWS-row table under ``zipf_exponent`` (bisection; the share grows with s).
    Smaller tables: SMALL_TABLE_EXPONENT.
    """
    target = power_law_top_share(REFERENCE_ROWS, zipf_exponent)
    out = []
    for n in table_sizes:
        if n < SKEW_MIN_ROWS:
            out.append(SMALL_TABLE_EXPONENT)
            continue
        lo, hi = 0.01, 20.0
        for _ in range(100):
            mid = 0.5 * (lo + hi)
            if power_law_top_share(n, mid) < target:
                lo = mid
            else:
                hi = mid
        out.append(0.5 * (lo + hi))
    return out


def top_share(ids: np.ndarray, num_rows: int, fraction: float = HOT_FRACTION) -> float:
    """Measured share of ``ids`` that hit the ceil(fraction * num_rows) most accessed rows.

    Note this is sample-limited: with fewer samples than ~10x that many rows, the rows
    seen at all are few enough to all count as "top", and the share tends to 1.
    """
    ids = np.asarray(ids).reshape(-1)
    if ids.size == 0:
        return float("nan")
    k = max(1, math.ceil(fraction * num_rows))
    counts = np.bincount(ids.astype(np.int64), minlength=num_rows)
    if k < counts.size:
        counts = np.partition(counts, counts.size - k)[counts.size - k :]
    return float(counts.sum() / ids.size)


# --------------------------------------------------------------------------- hashing


def _hash_uniform(rows: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Deterministic uniform [0, 1) per (key, row); rows (B, F) int64, keys (F,) uint64."""
    h = rows.astype(np.uint64)
    with np.errstate(over="ignore"):
        h *= np.uint64(0xD1B54A32D192ED03)
        h += keys
    h = splitmix64_(h)
    h >>= np.uint64(11)
    return h.astype(np.float64) * (1.0 / (1 << 53))


# --------------------------------------------------------------------------- the plan


@dataclass
class _Plan:
    """Per-dataset constants, all derived from the config."""

    sizes: np.ndarray  # (F,) int64
    exponent: np.ndarray  # (F,) float64
    one_minus_s: np.ndarray  # (F,) float64, never exactly 0
    cdf_norm: np.ndarray  # (F,) 1 - (n+1)**(1-s)
    perm_a: np.ndarray  # (F,) int64, gcd(a, n) = 1
    perm_b: np.ndarray  # (F,) int64
    hash_keys: np.ndarray  # (F,) uint64
    weight_std: np.ndarray  # (F,) float64
    hot: np.ndarray  # (F,) float64: ranks below this carry full weight
    skewed: np.ndarray  # (F,) bool
    dense_p_zero: np.ndarray  # (Dd,)
    dense_mu: np.ndarray
    dense_sigma: np.ndarray
    dense_weight: np.ndarray  # (Dd,)
    clock_dense: bool
    samples: int
    bias: float = 0.0
    bags: np.ndarray | None = None  # (F,) ids per sample of each table; None: one each


def _make_plan(cfg: SynthConfig) -> _Plan:
    prof = PROFILES[cfg.profile]
    sizes = profile_tables(cfg.profile, cfg.scale)
    F = len(sizes)
    rng = np.random.default_rng([cfg.seed, 0])
    exps = np.array(table_exponents(sizes, cfg.zipf_exponent), dtype=np.float64)
    one_minus_s = 1.0 - exps
    one_minus_s[np.abs(one_minus_s) < 1e-9] = 1e-9
    n = np.array(sizes, dtype=np.int64)
    cdf_norm = -np.expm1(one_minus_s * np.log(n.astype(np.float64) + 1.0))
    perm_a = np.empty(F, np.int64)
    perm_b = np.empty(F, np.int64)
    for t, nt in enumerate(sizes):
        # a*r must fit int64 for r < n: keep a < 2**62 / n.
        limit = min(nt, (1 << 62) // nt)
        a = int(rng.integers(max(1, limit // 4), max(2, limit))) if nt > 2 else 1
        while math.gcd(a, nt) != 1:
            a = a + 1 if a + 1 < limit else 1
        perm_a[t] = a
        perm_b[t] = int(rng.integers(0, nt))
    hash_keys = rng.integers(0, 1 << 63, size=F, dtype=np.int64).astype(np.uint64)
    weight_std = np.full(F, _SPARSE_SIGNAL_STD / math.sqrt(F))
    hot = np.array([hot_rows(nt) for nt in sizes], dtype=np.float64)
    skewed = n >= SKEW_MIN_ROWS
    Dd = len(prof.dense_names)
    clock = prof.clock_dense
    plan = _Plan(
        sizes=n,
        exponent=exps,
        one_minus_s=one_minus_s,
        cdf_norm=cdf_norm,
        perm_a=perm_a,
        perm_b=perm_b,
        hash_keys=hash_keys,
        weight_std=weight_std,
        hot=hot,
        skewed=skewed,
        dense_p_zero=rng.uniform(0.05, 0.45, Dd),
        dense_mu=rng.uniform(0.0, 4.0, Dd),
        dense_sigma=rng.uniform(0.5, 1.8, Dd),
        # clock features span [0, 1] (std ~0.3): twice the weight for a similar effect
        dense_weight=rng.normal(0.0, _DENSE_SIGNAL_STD / math.sqrt(Dd), Dd) * (2.0 if clock else 1.0),
        clock_dense=prof.clock_dense,
        samples=cfg.samples,
        bags=np.array(prof.bag_sizes, dtype=np.int64) if prof.bag_sizes else None,
    )
    # Calibrate the bias on a pilot sample (own random stream) so the click rate is prof.ctr.
    pilot_pos = np.linspace(0, cfg.samples - 1, _PILOT_SAMPLES).astype(np.int64)
    z = _features(plan, np.random.default_rng([cfg.seed, 2]), pilot_pos)[2]
    lo, hi = -20.0, 20.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if _sigmoid(z + mid).mean() < prof.ctr:
            lo = mid
        else:
            hi = mid
    plan.bias = 0.5 * (lo + hi)
    return plan


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _features(plan: _Plan, rng: np.random.Generator, positions: np.ndarray):
    """dense (B, Dd) float32, ids (B, F) int64 and the bias-free logit (B,) of samples."""
    B = len(positions)
    # one id column per table, or (multi-hot) bags[t] columns of table t side by side
    c = slice(None) if plan.bags is None else np.repeat(np.arange(len(plan.sizes)), plan.bags)
    sizes = plan.sizes[c]
    # ids: inverse CDF of the truncated power law, then the affine scatter.
    u = rng.random((B, len(sizes)))
    x = np.exp(np.log1p(-u * plan.cdf_norm[c]) / plan.one_minus_s[c])
    rank = x.astype(np.int64) - 1
    np.clip(rank, 0, sizes - 1, out=rank)
    ids = (rank * plan.perm_a[c] + plan.perm_b[c]) % sizes
    # hidden per-row weights: full size for hot ranks, decaying beyond (skewed tables);
    # a bag contributes the mean of its ids' weights.
    w = (_hash_uniform(ids, plan.hash_keys[c]) * 2.0 - 1.0) * (math.sqrt(3.0) * plan.weight_std[c])
    amp = np.where(plan.skewed[c], np.sqrt(np.minimum(1.0, plan.hot[c] / (rank + 1.0))), 1.0)
    if plan.bags is not None:
        amp = amp / plan.bags[c]
    logit = (w * amp).sum(axis=1)
    # dense features
    if plan.clock_dense:
        hours = positions * (24 * _AVAZU_DAYS) // max(1, plan.samples)
        dense = np.stack([(hours % 24) / 23.0, ((1 + hours // 24) % 7) / 6.0], axis=1)
    else:
        Dd = len(plan.dense_mu)
        raw = np.floor(np.exp(plan.dense_mu + plan.dense_sigma * rng.standard_normal((B, Dd))))
        raw *= rng.random((B, Dd)) >= plan.dense_p_zero
        dense = np.log1p(raw)
    dense = dense.astype(np.float32)
    logit += dense.astype(np.float64) @ plan.dense_weight
    logit += _NOISE_STD * rng.standard_normal(B)
    return dense, ids, logit


def _chunk(plan: _Plan, seed: int, index: int, lo: int, hi: int):
    rng = np.random.default_rng([seed, 1, index])
    dense, ids, z = _features(plan, rng, np.arange(lo, hi, dtype=np.int64))
    labels = (rng.random(hi - lo) < _sigmoid(z + plan.bias)).astype(np.float32)
    return labels, dense, ids


# --------------------------------------------------------------------------- generate


def dataset_bytes(num_dense: int, bags, id_bytes: int) -> tuple[int, int]:
    """(bytes a sample takes in the shards, bytes a shard adds besides): a label and the
    dense values (float32), one id per one-hot table, ``k`` ids and an int64 offset per
    multi-hot one (bag size ``k``); each shard file's .npy header, and a multi-hot
    feature's extra offset."""
    multi = [k for k in bags if k > 1]
    per_sample = 4 + 4 * num_dense + id_bytes * (len(bags) - len(multi)) + sum(id_bytes * k + 8 for k in multi)
    return per_sample, 128 * (3 + 2 * len(multi)) + 8 * len(multi)


def _split_bags(features: list[FeatureSpec], bags, ids: np.ndarray):
    """ids (n, sum(bags)) -> the one-hot columns (n, F1) and the multi-hot features'
    (values, lengths), as :meth:`ShardWriter.append` takes them."""
    n = len(ids)
    ends = np.cumsum(bags)
    onehot = [ids[:, e - 1] for f, e in zip(features, ends) if not f.multi_hot]
    multihot = {
        f.name: (np.ascontiguousarray(ids[:, e - k : e]).reshape(-1), np.full(n, k, np.int64))
        for f, e, k in zip(features, ends, bags)
        if f.multi_hot
    }
    return np.stack(onehot, axis=1) if onehot else np.zeros((n, 0), np.int64), multihot or None


def generate(
    cfg: SynthConfig,
    out: str | os.PathLike,
    *,
    overwrite: bool = False,
    progress: bool = True,
) -> DatasetMeta:
    """Write the dataset described by ``cfg`` to directory ``out``; return its meta.

    Refuses a directory that already holds a dataset unless ``overwrite``
    (:class:`bagpipe.errors.DataError`). Memory is bounded by one chunk plus one shard.
    """
    from tqdm import tqdm

    prof = PROFILES[cfg.profile]
    sizes = profile_tables(cfg.profile, cfg.scale)
    bags = prof.bag_sizes or (1,) * len(sizes)
    features = [
        FeatureSpec(name=name, num_rows=n, multi_hot=k > 1) for name, n, k in zip(prof.table_names, sizes, bags)
    ]
    id_dtype = "int32" if max(sizes) < (1 << 31) else "int64"
    output = OutputDir(out, "dataset", META_FILE, overwrite=overwrite)
    output.check()
    per_sample, per_shard = dataset_bytes(len(prof.dense_names), bags, np.dtype(id_dtype).itemsize)
    shards = -(-cfg.num_train // cfg.rows_per_shard) + -(-cfg.num_eval // cfg.rows_per_shard)
    output.check_space(
        cfg.samples * per_sample + shards * per_shard,
        f"{cfg.samples:,} samples x {per_sample} bytes",
        "write fewer --samples",
    )
    plan = _make_plan(cfg)
    n_train = cfg.num_train
    with output:  # a full disk or a stop signal: one line or the interrupt, the target as it was
        writer = ShardWriter(
            output,
            list(prof.dense_names),
            features,
            id_dtype=id_dtype,
            rows_per_shard=cfg.rows_per_shard,
        )
        with (
            writer,
            tqdm(
                total=cfg.samples, unit="samples", unit_scale=True, disable=None if progress else True, desc="synth"
            ) as bar,  # None: a terminal only
        ):
            for index, lo in enumerate(range(0, cfg.samples, CHUNK_SAMPLES)):
                hi = min(lo + CHUNK_SAMPLES, cfg.samples)
                labels, dense, ids = _chunk(plan, cfg.seed, index, lo, hi)
                cut = max(0, min(hi, n_train) - lo)
                for split, part in (("train", slice(0, cut)), ("eval", slice(cut, hi - lo))):
                    if part.stop > part.start:
                        writer.append(split, labels[part], dense[part], *_split_bags(features, bags, ids[part]))
                bar.update(hi - lo)
            source = {
                "tool": "bagpipe synth",
                "profile": cfg.profile,
                "seed": cfg.seed,
                "scale": cfg.scale,
                "zipf_exponent": cfg.zipf_exponent,
                "samples": cfg.samples,
            }
            return writer.close(source=source)
