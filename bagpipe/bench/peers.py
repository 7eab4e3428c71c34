"""``bagpipe bench peers``: TorchRec's DLRM beside bagpipe ``full`` and ``lookahead``.

Every configuration trains the same model on the same data for the same number of
steps, each run in its own process (so peak memory is per run), interleaved over
repetitions (the order rotates from one repetition to the next):

* ``full`` / ``lookahead`` (memory store) / ``lookahead-disk``: ``python -m bagpipe
  train ... --summary-json`` exactly as ``bagpipe bench modes`` launches it (its helpers
  are reused, including the cold copy of the disk table file).
* ``torchrec``: :func:`train_torchrec` in a subprocess (``python -m bagpipe.bench.peers
  worker ...``): TorchRec's ``torchrec.models.dlrm.DLRM`` around an
  ``EmbeddingBagCollection`` (one ``EmbeddingBagConfig`` per table, pooling SUM),
  sharded by ``DistributedModelParallel`` on a one-process gloo group, every table
  ``TABLE_WISE`` on the ``FUSED`` compute kernel (FBGEMM's CPU table-batched embedding
  bags with exact row-wise Adagrad fused into the backward pass); dense parameters step
  with ``torch.optim.Adagrad``. On CPU TorchRec 1.8.0 offers only this kernel for
  sharded tables; ``DENSE`` exists only for ``DATA_PARALLEL`` tables (a full dense
  gradient of every table each step) and is available as ``torchrec-dense`` for
  small sizes. Its caches (``FUSED_UVM_CACHING``) and SSD/key-value tables need CUDA.
  The worker runs with the OpenMP wait policy bagpipe's runs get (``PASSIVE``, which
  ``bagpipe.cli`` sets unless OMP_WAIT_POLICY is given; see :func:`_run_torchrec`);
  ``torchrec-omp-default`` runs it with libgomp's default (spinning) policy.

Same model maths: TorchRec's DLRM (dense arch with ReLU after every layer, pairwise dot
interaction of [dense, e_1..e_F], over arch with a linear last layer) is bagpipe's DLRM
with the interaction outputs in another order. The TorchRec run starts from exactly
bagpipe's initial values: the embedding rows come from bagpipe's ``RowInitializer`` and
the MLP weights are copied from bagpipe's model built with the same seed (the over arch's
first layer with its columns permuted to TorchRec's interaction order). So after the
same steps on the same batches the eval log losses must agree up to float rounding, and
the comparison of samples/s is between two implementations of one computation.

Usage: ``bagpipe bench peers`` (needs ``make peers``); ``--quick`` for a small size.
docs/peers.md explains the configuration and records development figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from bagpipe.bench.report import machine, markdown_table, median_spread, write_results
from bagpipe.errors import ConfigError

BAGPIPE_CONFIGS = {
    # name: (bagpipe --mode, --store)
    "full": ("full", "memory"),
    "lookahead": ("lookahead", "memory"),
    "lookahead-disk": ("lookahead", "disk"),
}
TORCHREC_CONFIGS = {
    # name: (compute kernel, OpenMP wait policy: "bagpipe" = the one bagpipe's runs get,
    # None = OMP_WAIT_POLICY removed from the worker's environment: libgomp's default)
    "torchrec": ("fused", "bagpipe"),
    "torchrec-omp-default": ("fused", None),
    "torchrec-dense": ("dense", "bagpipe"),
}
ALL_CONFIGS = tuple(BAGPIPE_CONFIGS) + tuple(TORCHREC_CONFIGS)
REFERENCE = "torchrec"
GOALS = {"full": 1.0, "lookahead": 0.9, "lookahead-disk": 0.9}
"""Minimum samples/s ratio to TorchRec each bagpipe configuration should reach."""
MAX_GOAL_CACHE_FRACTION = 0.10
DENSE_MAX_ROWS = 4_000_000
EVAL_SAMPLES = 20000  # what bench modes' ``bagpipe train`` runs evaluate on
SEED = 0  # ``bagpipe train``'s default seed, which bench modes' runs use
INSTALL_HINT = "bagpipe bench peers needs TorchRec: run `make peers` (installs fbgemm-gpu-cpu 1.8.0 and torchrec 1.8.0 into .venv)"
LABELS = {
    "full": "bagpipe full",
    "lookahead": "bagpipe lookahead",
    "lookahead-disk": "bagpipe lookahead (disk store)",
    "torchrec": "TorchRec FUSED",
    "torchrec-omp-default": "TorchRec FUSED (default OpenMP wait)",
    "torchrec-dense": "TorchRec DENSE (data parallel)",
}


@dataclass(kw_only=True)
class PeersBench:
    """Settings of the peers scenario (defaults: Criteo Kaggle at full cardinality)."""

    out: str = "bench-out/peers"
    profile: str = "criteo-kaggle"
    scale: float = 1.0
    """Table cardinality factor (1.0: 33.8M rows)."""
    recipe: str = "kaggle"
    """DLRM sizes: kaggle (D 16, dense arch 512-256-64-16, over arch 512-256-1) or debug."""
    batch_size: int = 2048
    lr: float = 0.05
    steps: int = 110
    warmup: int = 10
    reps: int = 2
    configs: tuple[str, ...] = ("full", "lookahead", "lookahead-disk", "torchrec")
    cache_fraction: float = 0.10
    """lookahead's cache as a fraction of all rows (the goal is stated at <= 10%)."""
    lookahead: int = 20
    threads: int = 0

    def __post_init__(self):
        self.configs = tuple(dict.fromkeys(self.configs))
        bad = [c for c in self.configs if c not in ALL_CONFIGS]
        if bad:
            raise ConfigError(f"unknown peers configuration(s) {bad}; choose from {', '.join(ALL_CONFIGS)}")
        if not self.configs:
            raise ConfigError("no configuration to run")
        if self.steps <= self.warmup:
            raise ConfigError("steps must exceed warmup")
        if not 0 < self.cache_fraction <= 1:
            raise ConfigError("cache_fraction must be in (0, 1]")
        if self.reps < 1:
            raise ConfigError("reps must be >= 1")

    @classmethod
    def quick(cls, **kw) -> "PeersBench":
        base = dict(scale=0.01, batch_size=512, recipe="debug", steps=16, warmup=4, reps=1, lookahead=8)
        base.update(kw)
        return cls(**base)


def torchrec_available() -> str | None:
    """None when TorchRec and FBGEMM import; otherwise the one-line reason (and the fix).

    The import is tried in a child process: a failed one can leave half-loaded native
    libraries behind, and the driver stays small (a child's ru_maxrss starts from its
    parent's RSS, so a heavy driver would inflate every run's peak RSS).
    """
    import importlib.util

    for name in ("fbgemm_gpu", "torchrec"):
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return f"{INSTALL_HINT} (no module named {name!r})"
    code = "import fbgemm_gpu, torchrec; from torchrec.models.dlrm import DLRM"
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return f"{INSTALL_HINT} (importing torchrec took over 300 s)"
    if proc.returncode != 0:
        lines = [x for x in proc.stderr.strip().splitlines() if x.strip()] or ["import failed"]
        return f"{INSTALL_HINT} ({lines[-1].strip()[:200]})"
    return None


# --------------------------------------------------------------------------- worker


def batch_to_kjt(batch, table_offsets, keys):
    """A bagpipe :class:`Batch` (global rows, feature-major bags) as a KeyedJaggedTensor.

    One key per table; values are ids within the table (global row minus the table's
    offset); the bag offsets are ``Batch.offsets`` as they are (both are feature-major).
    """
    import torch
    from torchrec import KeyedJaggedTensor

    B, F = batch.batch_size, batch.num_features
    starts = batch.offsets[torch.arange(F + 1) * B]  # first lookup of each feature
    counts = starts[1:] - starts[:-1]
    if int(starts[-1]) == F * B:  # one-hot: every feature has B lookups
        base = table_offsets[:-1].repeat_interleave(B)
    else:
        base = table_offsets[:-1].repeat_interleave(counts)
    return KeyedJaggedTensor.from_offsets_sync(keys=keys, values=batch.rows - base, offsets=batch.offsets)


def _interaction_permutation(n: int):
    """Index q (into bagpipe's strict-lower-triangle order) for each of TorchRec's
    strict-upper-triangle interaction outputs over the same n vectors."""
    import torch

    lr, lc = torch.tril_indices(n, n, offset=-1)
    pos = {(int(i), int(j)): k for k, (i, j) in enumerate(zip(lr, lc))}
    ur, uc = torch.triu_indices(n, n, offset=1)
    return torch.tensor([pos[(int(j), int(i))] for i, j in zip(ur, uc)], dtype=torch.long)


def _copy_dense_init(tr_dlrm, bp_dlrm) -> None:
    """Give TorchRec's DLRM the MLP weights of bagpipe's DLRM (same seed, same maths)."""
    import torch
    from torch import nn

    def linears(m):
        return [x for x in m.modules() if isinstance(x, nn.Linear)]

    src_bottom, dst_bottom = linears(bp_dlrm.bottom), linears(tr_dlrm.dense_arch)
    src_top, dst_top = linears(bp_dlrm.top), linears(tr_dlrm.over_arch)
    if len(src_bottom) != len(dst_bottom) or len(src_top) != len(dst_top):
        raise RuntimeError("TorchRec's DLRM layers do not match bagpipe's DLRM")
    with torch.no_grad():
        for s, d in zip(src_bottom + src_top, dst_bottom + dst_top):
            if s.weight.shape != d.weight.shape:
                raise RuntimeError(f"layer shapes differ: {tuple(s.weight.shape)} vs {tuple(d.weight.shape)}")
            d.weight.copy_(s.weight)
            d.bias.copy_(s.bias)
        # over arch input: [x (D), dots]; the dots come in another order
        D = bp_dlrm.bottom[-2].out_features
        perm = _interaction_permutation(bp_dlrm.interaction.num_vectors)
        w = src_top[0].weight
        dst_top[0].weight.copy_(torch.cat([w[:, :D], w[:, D:].index_select(1, perm)], dim=1))


def _table_shards(sharded_ebc) -> list:
    """The local (whole-table, table-wise on one rank) weight tensor of each table, in table order."""
    out = {}
    for name, t in sharded_ebc.state_dict().items():
        if name.endswith(".weight"):
            shards = t.local_shards() if hasattr(t, "local_shards") else None
            out[name.split(".")[-2]] = shards[0].tensor if shards else t
    return out


def _load_bagpipe_rows(tables: dict, table_sizes: list[int], dim: int, seed: int) -> None:
    """Overwrite every table with bagpipe's deterministic initial rows (chunked)."""
    import torch

    from bagpipe.store.init import RowInitializer

    init = RowInitializer(table_sizes, dim, seed)
    chunk = 1 << 20
    for i, n in enumerate(table_sizes):
        dst = tables[f"t{i}"]
        if tuple(dst.shape) != (n, dim):
            raise RuntimeError(f"table t{i}: local shard {tuple(dst.shape)}, expected {(n, dim)}")
        base = int(init.offsets[i])
        for a in range(0, n, chunk):
            b = min(a + chunk, n)
            dst[a:b].copy_(torch.from_numpy(init.range(base + a, base + b)))


def train_torchrec(
    data: str,
    *,
    kernel: str = "fused",
    recipe_name: str = "kaggle",
    batch_size: int = 2048,
    lr: float = 0.05,
    steps: int = 60,
    warmup: int = 10,
    seed: int = 0,
    eval_samples: int = EVAL_SAMPLES,
    threads: int = 0,
    block_size: int = 4096,
) -> dict:
    """Train TorchRec's DLRM on a bagpipe dataset; returns a summary shaped like ``bagpipe train``'s."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, PoolingType
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.distributed.types import ShardingType
    from torchrec.models.dlrm import DLRM
    from torchrec.optim import RowWiseAdagrad
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    from bagpipe.data.shards import Dataset
    from bagpipe.data.stream import BatchStream
    from bagpipe.models import build_model, recipe
    from bagpipe.train.metrics import RssSampler, current_rss_mb, log_loss, peak_rss_mb, roc_auc

    if kernel not in ("fused", "dense"):
        raise ConfigError(f"kernel must be fused or dense, got {kernel!r}")
    if threads:
        torch.set_num_threads(threads)
    t_setup = time.perf_counter()
    dataset = Dataset(data)
    meta = dataset.meta
    stream = BatchStream(dataset, "train", batch_size, seed=seed, block_size=block_size)
    mcfg = recipe("dlrm", recipe_name)
    D = mcfg.embedding_dim
    sizes = [int(n) for n in meta.table_sizes]
    nf = meta.num_features
    keys = [f"f{i}" for i in range(nf)]

    # bagpipe's model with the run's seed: the MLP weights both start from
    torch.manual_seed(seed)
    bp_model = build_model(mcfg, meta.num_dense, nf)

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    tables = [
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=D, num_embeddings=n, feature_names=[keys[i]], pooling=PoolingType.SUM)
        for i, n in enumerate(sizes)
    ]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    model = DLRM(
        embedding_bag_collection=ebc,
        dense_in_features=meta.num_dense,
        dense_arch_layer_sizes=list(mcfg.bottom_mlp),
        over_arch_layer_sizes=[*mcfg.top_mlp, 1],
        dense_device=torch.device("cpu"),
    )
    if kernel == "fused":
        # the embedding optimizer runs inside FBGEMM's backward (EXACT_ROWWISE_ADAGRAD)
        apply_optimizer_in_backward(RowWiseAdagrad, model.sparse_arch.parameters(), {"lr": lr, "eps": 1e-8})
        sharding, ck = ShardingType.TABLE_WISE.value, EmbeddingComputeKernel.FUSED.value
    else:
        sharding, ck = ShardingType.DATA_PARALLEL.value, EmbeddingComputeKernel.DENSE.value
    constraints = {t.name: ParameterConstraints(sharding_types=[sharding], compute_kernels=[ck]) for t in tables}
    sharders = [EmbeddingBagCollectionSharder()]
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu"), constraints=constraints)
    plan = planner.plan(model, sharders)
    # one process: no data-parallel (DDP) wrapper around the dense part, nothing to all-reduce
    dmp = DistributedModelParallel(
        model, device=torch.device("cpu"), plan=plan, sharders=sharders, init_data_parallel=kernel == "dense"
    )
    inner = dmp.module  # unwrapped of DMP (and DDP)
    _copy_dense_init(inner, bp_model)
    del bp_model
    _load_bagpipe_rows(_table_shards(inner.sparse_arch.embedding_bag_collection), sizes, D, seed)

    emb_params = [p for n, p in dmp.named_parameters() if "embedding_bag" in n]
    dense_params = [p for n, p in dmp.named_parameters() if "embedding_bag" not in n]
    dense_opt = torch.optim.Adagrad(dense_params, lr=lr)
    emb_opt = RowWiseAdagrad(emb_params, lr=lr, eps=1e-8) if kernel == "dense" else None
    table_offsets = torch.from_numpy(stream.table_offsets.copy())
    plan_desc = {name: {"sharding": p.sharding_type, "kernel": p.compute_kernel} for mod in plan.plan.values() for name, p in mod.items()}
    setup_s = time.perf_counter() - t_setup

    def prepare(step: int):
        b = stream.batch(step)
        return b, batch_to_kjt(b, table_offsets, keys)

    times = dict(forward=0.0, backward=0.0, optimizer=0.0)
    losses: list[float] = []
    rss = RssSampler()
    from bagpipe.train.backends import Prefetched

    loader = Prefetched(prepare(i) for i in range(steps))
    dmp.train()
    t_start = time.perf_counter()
    t_measure, at_warmup, step = None, dict(times), 0
    try:
        for batch, kjt in loader:
            t0 = time.perf_counter()
            logits = dmp(batch.dense, kjt).squeeze(1)
            loss = F.binary_cross_entropy_with_logits(logits, batch.labels)
            t1 = time.perf_counter()
            dense_opt.zero_grad(set_to_none=True)
            if emb_opt is not None:
                emb_opt.zero_grad()
            loss.backward()  # FUSED: the embedding rows step here
            t2 = time.perf_counter()
            dense_opt.step()
            if emb_opt is not None:
                emb_opt.step()
            t3 = time.perf_counter()
            times["forward"] += t1 - t0
            times["backward"] += t2 - t1
            times["optimizer"] += t3 - t2
            losses.append(float(loss.detach()))
            step += 1
            if step == warmup:
                t_measure, at_warmup = time.perf_counter(), dict(times)
    finally:
        loader.close()
    t_end = time.perf_counter()
    peak_anon = rss.stop()
    measured = step - warmup
    elapsed = t_end - (t_measure if t_measure is not None else t_start)

    # evaluation exactly as bagpipe's loop does it: eval split in file order, capped
    ev = {"eval_logloss": None, "eval_auc": None, "eval_samples": 0}
    if dataset.has_split("eval"):
        dmp.eval()
        labels, probs, seen = [], [], 0
        with torch.no_grad():
            for b in BatchStream(dataset, "eval", batch_size, shuffle=False, drop_last=False).batches():
                logits = dmp(b.dense, batch_to_kjt(b, table_offsets, keys)).squeeze(1)
                labels.append(b.labels.numpy())
                probs.append(torch.sigmoid(logits).numpy())
                seen += b.batch_size
                if eval_samples and seen >= eval_samples:
                    break
        y, p = np.concatenate(labels), np.concatenate(probs)
        if eval_samples:
            y, p = y[:eval_samples], p[:eval_samples]
        ev = {"eval_logloss": log_loss(y, p), "eval_auc": roc_auc(y, p), "eval_samples": int(len(y))}
    import importlib.metadata as md

    summary = {
        "mode": f"torchrec-{kernel}",
        "model": "dlrm (torchrec.models.dlrm.DLRM)",
        "optimizer": "adagrad",
        "steps": step,
        "samples": step * batch_size,
        "batch_size": batch_size,
        "seconds": t_end - t_start,
        "setup_s": setup_s,
        "measured_steps": measured,
        "samples_per_s": measured * batch_size / max(elapsed, 1e-9),
        "train_logloss": float(np.mean(losses[-50:])) if losses else None,
        "train_losses": losses,
        **ev,
        "peak_rss_mb": peak_rss_mb(),
        "peak_anon_rss_mb": peak_anon,
        "rss_mb": current_rss_mb(),
        "total_rows": int(sum(sizes)),
        "embedding_dim": D,
        "time_per_step_ms": {k: 1000 * (times[k] - at_warmup[k]) / max(measured, 1) for k in times},
        "plan": plan_desc,
        "torchrec": md.version("torchrec"),
        "fbgemm_gpu": md.version("fbgemm-gpu-cpu") if _has_dist("fbgemm-gpu-cpu") else md.version("fbgemm-gpu"),
        "torch_threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
    }
    dist.destroy_process_group()
    return summary


def _has_dist(name: str) -> bool:
    import importlib.metadata as md

    try:
        md.version(name)
        return True
    except md.PackageNotFoundError:
        return False


def _worker_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bagpipe.bench.peers worker", description="one TorchRec training run (internal)")
    p.add_argument("--data", required=True)
    p.add_argument("--kernel", default="fused", choices=("fused", "dense"))
    p.add_argument("--recipe", default="kaggle")
    p.add_argument("--batch-size", type=int, default=2048)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-samples", type=int, default=EVAL_SAMPLES)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--summary-json", required=True)
    a = p.parse_args(argv)
    import warnings

    warnings.filterwarnings("ignore")
    s = train_torchrec(
        a.data, kernel=a.kernel, recipe_name=a.recipe, batch_size=a.batch_size, lr=a.lr, steps=a.steps,
        warmup=a.warmup, seed=a.seed, eval_samples=a.eval_samples, threads=a.threads,
    )
    Path(a.summary_json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.summary_json).write_text(json.dumps(s, indent=2))
    return 0


# --------------------------------------------------------------------------- driver


def _run_torchrec(b: PeersBench, data: Path, run_dir: Path, kernel: str, omp_wait_policy: str | None) -> dict:
    """One TorchRec run in its own process.

    OpenMP wait policy: ``bagpipe train`` runs with ``OMP_WAIT_POLICY=PASSIVE`` (its CLI
    sets it unless the environment has one), so by default the TorchRec worker gets the
    same value: both systems run under the same OpenMP settings. This matters a lot for
    TorchRec: FBGEMM's CPU backward opens several short OpenMP regions per table, and
    with libgomp's default (spinning) policy on a 2-core machine that has anything else
    running each can stall for a scheduler time slice (7-70 ms per table batch instead
    of ~2 ms). ``torchrec-omp-default`` (``omp_wait_policy=None``) shows that case.
    """
    summary = run_dir / "summary.json"
    env = dict(os.environ)
    if omp_wait_policy is None:
        env.pop("OMP_WAIT_POLICY", None)
    else:
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # what bagpipe.cli gives `bagpipe train`
    cmd = [
        sys.executable, "-m", "bagpipe.bench.peers", "worker", "--data", str(data), "--kernel", kernel,
        "--recipe", b.recipe, "--batch-size", str(b.batch_size), "--lr", str(b.lr), "--steps", str(b.steps),
        "--warmup", str(b.warmup), "--seed", str(SEED), "--eval-samples", str(EVAL_SAMPLES),
        "--threads", str(b.threads), "--summary-json", str(summary),
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"torchrec/{kernel} failed:\n{proc.stderr[-3000:]}")
    s = json.loads(summary.read_text())
    s["wall_s"] = time.perf_counter() - t0
    return s


def _modes_settings(b: PeersBench, cache_rows_configs: tuple[str, ...]):
    """The ModesBench whose ``_run_train`` launches bagpipe exactly as ``bench modes`` does."""
    from bagpipe.bench.modes import ModesBench

    return ModesBench(
        out=b.out, profile=b.profile, scale=b.scale, model="dlrm", recipe=b.recipe, batch_size=b.batch_size,
        optimizer="adagrad", lr=b.lr, steps=b.steps, warmup=b.warmup, reps=b.reps, stores=("memory",),
        modes=cache_rows_configs or ("full",), cache_fraction=b.cache_fraction, lookahead=b.lookahead, threads=b.threads,
    )


def _make_data(b: PeersBench, data: Path) -> bool:
    """The data set bench modes generates for the same settings (same rule, same seed);
    True when it had to be (re)generated."""
    from bagpipe.data.synthetic import SynthConfig, generate

    samples = int(b.batch_size * (b.steps + 2) / 0.9) + 1
    meta_file = data / "meta.json"
    if meta_file.exists():
        src = json.loads(meta_file.read_text()).get("source", {})
        if src.get("samples") == samples and src.get("scale") == b.scale and src.get("profile", b.profile) == b.profile:
            return False
    generate(SynthConfig(profile=b.profile, samples=samples, scale=b.scale, seed=1), str(data), overwrite=True)
    return True


def run(b: PeersBench) -> dict:
    missing = torchrec_available() if any(c in TORCHREC_CONFIGS for c in b.configs) else None
    if missing:
        raise ConfigError(missing)
    from bagpipe.bench.modes import _fresh_cold_copy, _materialise_disk_store, _run_train
    from bagpipe.data.schema import DatasetMeta
    from bagpipe.models import recipe

    out = Path(b.out)
    out.mkdir(parents=True, exist_ok=True)
    data = out / "data"
    if _make_data(b, data):
        shutil.rmtree(out / "store-template", ignore_errors=True)  # rows of another data set
    meta = DatasetMeta.load(data)
    total = meta.total_rows
    if "torchrec-dense" in b.configs and total > DENSE_MAX_ROWS:
        raise ConfigError(f"torchrec-dense makes a dense gradient of every row each step; it is for tables of at most "
                          f"{DENSE_MAX_ROWS:,} rows (these have {total:,}: pass e.g. --scale 0.1)")
    cache_rows = max(int(b.cache_fraction * total), b.batch_size * meta.num_features)
    mb = _modes_settings(b, tuple(sorted({BAGPIPE_CONFIGS[c][0] for c in b.configs if c in BAGPIPE_CONFIGS})))
    template = out / "store-template"
    if "lookahead-disk" in b.configs:  # the table file as it would exist on disk, written once
        dim = recipe("dlrm", b.recipe).embedding_dim
        _materialise_disk_store(template, meta, dim, state_dim=1, seed=SEED)
    os.sync()  # flush the data set / table file now, not in the background of the first measured runs

    results: dict[str, list[dict]] = {c: [] for c in b.configs}
    n = len(b.configs)
    for rep in range(b.reps):
        order = b.configs[rep % n:] + b.configs[: rep % n]  # rotate so no configuration always runs first
        for cfg in order:
            print(f"[rep {rep + 1}/{b.reps}] {LABELS[cfg]} ...", flush=True)
            run_dir = out / "runs" / f"{cfg}-{rep}"
            if run_dir.exists():
                shutil.rmtree(run_dir)
            if cfg in BAGPIPE_CONFIGS:
                mode, store = BAGPIPE_CONFIGS[cfg]
                store_dir = None
                if store == "disk":  # a fresh copy whose pages are dropped: rows come from the device
                    store_dir = out / "store-run"
                    _fresh_cold_copy(template, store_dir)
                s = _run_train(mb, data, run_dir, mode, store, store_dir, cache_rows)
            else:
                s = _run_torchrec(b, data, run_dir, *TORCHREC_CONFIGS[cfg])
            results[cfg].append(s)
            print(f"    {s['samples_per_s']:,.0f} samples/s, eval log loss {s['eval_logloss']:.5f}, "
                  f"peak anon RSS {s['peak_anon_rss_mb']:.0f} MiB", flush=True)
            shutil.rmtree(run_dir, ignore_errors=True)
    shutil.rmtree(out / "store-run", ignore_errors=True)
    payload = summarise(b, results, total, cache_rows)
    _plot(out, payload)
    write_results(out, "peers", payload, payload["table"] + "\n\n" + payload["notes"])
    return payload


def summarise(b: PeersBench, results: dict[str, list[dict]], total_rows: int, cache_rows: int) -> dict:
    ref = results.get(REFERENCE, [])
    ref_sps = median_spread([r["samples_per_s"] for r in ref])[0] if ref else float("nan")
    ref_loss = median_spread([r["eval_logloss"] for r in ref])[0] if ref else float("nan")
    ref_rss = median_spread([r["peak_anon_rss_mb"] for r in ref])[0] if ref else float("nan")
    rows, out = [], {}
    for key, runs in results.items():
        sps, spread = median_spread([r["samples_per_s"] for r in runs])
        loss = median_spread([r["eval_logloss"] for r in runs])[0]
        anon = median_spread([r["peak_anon_rss_mb"] for r in runs])[0]
        peak = median_spread([r["peak_rss_mb"] for r in runs])[0]
        held = cache_rows if key.startswith("lookahead") else total_rows
        ratio = sps / ref_sps
        goal = GOALS.get(key)
        if goal is None:
            verdict = "reference" if key == REFERENCE else "-"
        elif ratio != ratio:
            verdict = "n/a"
        else:
            ok = ratio >= goal and (key == "full" or held / total_rows <= MAX_GOAL_CACHE_FRACTION)
            verdict = f"{'met' if ok else 'NOT met'} (>= {goal:.1f}x)"
        out[key] = {
            "label": LABELS[key], "samples_per_s": sps, "spread": spread, "ratio_to_torchrec": ratio,
            "goal_ratio": goal, "goal_met": None if goal is None or ratio != ratio else verdict.startswith("met"),
            "eval_logloss": loss, "eval_logloss_minus_torchrec": loss - ref_loss,
            "eval_auc": median_spread([r["eval_auc"] for r in runs])[0],
            "rows_in_trainer": held, "rows_in_trainer_fraction": held / total_rows,
            "peak_anon_rss_mb": anon, "peak_rss_mb": peak, "anon_rss_ratio_to_torchrec": anon / ref_rss,
            "time_per_step_ms": {k: median_spread([r["time_per_step_ms"][k] for r in runs])[0] for k in runs[0]["time_per_step_ms"]},
            "runs": [r["samples_per_s"] for r in runs],
            "eval_logloss_runs": [r["eval_logloss"] for r in runs],
            "cache": runs[0].get("cache", {}),
            "plan": runs[0].get("plan"),
            "omp_wait_policy": runs[0].get("omp_wait_policy"),
        }
        rows.append([LABELS[key], sps, f"{spread:.0%}", _fmt(ratio, "{:.2f}x"), verdict, f"{loss:.5f}",
                     _fmt(loss - ref_loss, "{:+.1e}"), f"{held / total_rows:.0%}", anon, _fmt(anon / ref_rss, "{:.0%}"), peak])
    headers = ["configuration", "samples/s", "spread", "vs TorchRec", "goal", "eval log loss", "vs TorchRec",
               "rows in trainer", "peak anon RSS MiB", "vs TorchRec", "peak RSS MiB"]
    table = markdown_table(headers, rows)
    ref_run = ref[0] if ref else {}
    notes = (
        f"{b.steps} steps ({b.warmup} warm-up steps left out of samples/s) of DLRM `{b.recipe}` at batch {b.batch_size}, "
        f"Adagrad lr {b.lr}, on {total_rows:,} rows ({b.profile}, scale {b.scale}); median of {b.reps} interleaved "
        f"repetition(s), spread = (max - min) / median. lookahead: cache of {cache_rows:,} rows "
        f"({cache_rows / total_rows:.1%}), L = {b.lookahead}. TorchRec {ref_run.get('torchrec', '?')} / "
        f"fbgemm-gpu-cpu {ref_run.get('fbgemm_gpu', '?')}: DistributedModelParallel on one gloo process, tables "
        "TABLE_WISE on the FUSED kernel (exact row-wise Adagrad in the backward), "
        f"OMP_WAIT_POLICY={ref_run.get('omp_wait_policy') or 'unset'}; same initial values as bagpipe."
    )
    return {
        "scenario": "peers", "config": asdict(b), "machine": machine(), "total_rows": total_rows,
        "cache_rows": cache_rows, "cache_fraction_of_rows": cache_rows / total_rows, "results": out,
        "table": table, "notes": notes,
    }


def _fmt(x: float, spec: str) -> str:
    return "n/a" if x != x else spec.format(x)


def _plot(out: Path, payload: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(payload["results"])
    res = payload["results"]
    labels = [textwrap.fill(res[k]["label"], 16) for k in keys]
    colors = ["tab:orange" if k.startswith("torchrec") else "tab:green" for k in keys]
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(max(15, 3.6 * len(keys)), 5))
    sps = np.array([res[k]["samples_per_s"] for k in keys])
    lo = np.array([min(res[k]["runs"]) for k in keys])
    hi = np.array([max(res[k]["runs"]) for k in keys])
    ax1.bar(labels, sps, color=colors, yerr=[sps - lo, hi - sps], capsize=4)
    for i, k in enumerate(keys):
        ax1.text(i, hi[i], _fmt(res[k]["ratio_to_torchrec"], "{:.2f}x"), ha="center", va="bottom", fontsize=8)
    ax1.set_ylabel("samples/s (median, min-max)")
    ax1.set_title("throughput (ratio to TorchRec FUSED)")
    parts = ["wait_embeddings", "forward", "backward", "optimizer", "writeback"]
    bottom = np.zeros(len(keys))
    for p in parts:
        vals = np.array([res[k]["time_per_step_ms"].get(p, 0.0) for k in keys])
        if vals.any():
            ax2.bar(labels, vals, bottom=bottom, label=p)
            bottom += vals
    ax2.set_ylabel("ms per step (trainer thread)")
    ax2.set_title("time per step (TorchRec: row updates inside backward)")
    ax2.set_ylim(0, max(bottom.max(), 1e-9) * 1.35)
    ax2.legend(fontsize=7, ncol=3, loc="upper center")
    ax3.bar(labels, [res[k]["peak_anon_rss_mb"] for k in keys], color=colors)
    for i, k in enumerate(keys):
        ax3.text(i, res[k]["peak_anon_rss_mb"], f"{res[k]['rows_in_trainer_fraction']:.0%}\nrows", ha="center", va="bottom", fontsize=8)
    ax3.set_ylabel("peak anonymous RSS (MiB)")
    ax3.set_ylim(0, max(res[k]["peak_anon_rss_mb"] for k in keys) * 1.2)
    ax3.set_title("memory per training process")
    ax1.set_ylim(0, max(hi.max(), 1e-9) * 1.12)
    for ax in (ax1, ax2, ax3):
        ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(out / "peers.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        os.environ.setdefault("TORCHREC_DISABLE_LOGGING", "1")
        sys.exit(_worker_main(sys.argv[2:]))
    print("usage: bagpipe bench peers [--quick] (this module's entry point is internal: worker ...)", file=sys.stderr)
    sys.exit(2)
