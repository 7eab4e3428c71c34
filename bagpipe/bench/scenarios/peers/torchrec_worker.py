"""One TorchRec training run of ``bagpipe bench peers``, in its own process.

``python -m bagpipe.bench.scenarios.peers.torchrec_worker --data DATA --summary-json FILE ...`` runs
:func:`train_torchrec`: TorchRec's ``torchrec.models.dlrm.DLRM`` around an
``EmbeddingBagCollection`` (one ``EmbeddingBagConfig`` per table, pooling SUM), sharded
by ``DistributedModelParallel`` on a one-process gloo group, every table ``TABLE_WISE``
on the ``FUSED`` compute kernel (or ``DATA_PARALLEL`` on ``DENSE``), starting from exactly
bagpipe's initial values (embedding rows from bagpipe's ``RowInitializer``, MLP weights
copied from bagpipe's DLRM built with the same seed). Its summary is shaped like
``bagpipe train``'s. :mod:`bagpipe.bench.scenarios.peers.scenario` (the driver) explains the comparison.
Needs TorchRec and FBGEMM (``make peers``); they are imported only in here.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

from bagpipe.errors import ConfigError
from bagpipe.jsonout import json_text

EVAL_SAMPLES = 20000  # what bench modes' ``bagpipe train`` runs evaluate on


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


def _copy_dense_init(tr_dlrm, bp_dlrm) -> None:
    """Give TorchRec's DLRM the MLP weights of bagpipe's DLRM (same seed, same maths)."""
    import torch
    from torch import nn

    from bagpipe.export.naming import interaction_permutation

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
        perm = interaction_permutation(bp_dlrm.interaction.num_vectors)
        w = src_top[0].weight
        dst_top[0].weight.copy_(torch.cat([w[:, :D], w[:, D:].index_select(1, perm)], dim=1))


def _table_shards(sharded_ebc) -> dict:
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

    from bagpipe.budget.watch import RssSampler
    from bagpipe.data.prefetch import Prefetched
    from bagpipe.data.shards import Dataset
    from bagpipe.data.stream import BatchStream
    from bagpipe.models import build_model, recipe
    from bagpipe.train.evaluate import no_eval, scores
    from bagpipe.train.summary import LOSS_WINDOW, StepMeter, Summary

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
        EmbeddingBagConfig(
            name=f"t{i}", embedding_dim=D, num_embeddings=n, feature_names=[keys[i]], pooling=PoolingType.SUM
        )
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
    plan_desc = {
        name: {"sharding": p.sharding_type, "kernel": p.compute_kernel}
        for mod in plan.plan.values()
        for name, p in mod.items()
    }
    setup_s = time.perf_counter() - t_setup

    def prepare(step: int):
        b = stream.batch(step)
        return b, batch_to_kjt(b, table_offsets, keys)

    meter = StepMeter(start=0, warmup=warmup, batch_size=batch_size)  # bagpipe's own step meter
    times = meter.times
    rss = RssSampler()
    loader = Prefetched(prepare(i) for i in range(steps))
    dmp.train()
    step = 0
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
            step += 1
            meter.record(step, float(loss.detach()))
    finally:
        loader.close()
    meter.stop()
    peak_anon = rss.stop()

    # evaluation exactly as bagpipe's loop does it: eval split in file order, capped
    ev = no_eval()
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
        ev = scores(y, p)
    import importlib.metadata as md

    summary = Summary.of(
        mode=f"torchrec-{kernel}",
        model="dlrm (torchrec.models.dlrm.DLRM)",
        optimizer="adagrad",
        batch_size=batch_size,
        steps=step,
        timing=meter.result(),
        train_logloss=float(np.mean(meter.losses[-LOSS_WINDOW:])) if meter.losses else None,
        evaluation=ev,
        params_sha256=None,
        peak_anon_rss_mb=peak_anon,
        total_rows=int(sum(sizes)),
        embedding_dim=D,
    ).to_json()
    summary.update(
        setup_s=setup_s,
        train_losses=meter.losses,
        plan=plan_desc,
        torchrec=md.version("torchrec"),
        fbgemm_gpu=md.version("fbgemm-gpu-cpu") if _has_dist("fbgemm-gpu-cpu") else md.version("fbgemm-gpu"),
        torch_threads=torch.get_num_threads(),
        omp_wait_policy=os.environ.get("OMP_WAIT_POLICY"),
    )
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
    p = argparse.ArgumentParser(
        prog="python -m bagpipe.bench.scenarios.peers.torchrec_worker",
        description="one TorchRec training run (internal)",
    )
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
        a.data,
        kernel=a.kernel,
        recipe_name=a.recipe,
        batch_size=a.batch_size,
        lr=a.lr,
        steps=a.steps,
        warmup=a.warmup,
        seed=a.seed,
        eval_samples=a.eval_samples,
        threads=a.threads,
    )
    Path(a.summary_json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.summary_json).write_text(json_text(s, indent=2))
    return 0


if __name__ == "__main__":
    from bagpipe import lifeline

    lifeline.watch("torchrec worker")  # started by bench: ends with it
    os.environ.setdefault("TORCHREC_DISABLE_LOGGING", "1")
    sys.exit(_worker_main(sys.argv[1:]))
