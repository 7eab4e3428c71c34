"""``bagpipe bench scale``: tables larger than memory, under a cgroup memory limit.

Each configuration is a ``bagpipe train`` process. The cached modes run on the disk
store inside a fresh memory control group (:mod:`bagpipe.testbed.memlimit`) whose limit
``--memory-limit-mb`` counts the page cache too, so the table file cannot be cached and
a miss is a real device read; each run takes its memory budget from that group (no
``--memory-budget-mb``: the default). ``full`` runs on the memory store with no limit:
the ceiling the others are held to. By default: the Criteo-Kaggle profile at half its
cardinality (16.9M rows), D = 64 with Adagrad's state (a 4.1 GiB table file) under a
1 GiB limit (4.1x), 1,000 steps of batch 2048, a cache of 1% of the rows (so ``lru``
evicts from its ~10th step on); ``--zipf-exponent`` makes a less skewed profile where
reads matter more.

    full            every table in memory, no limit (also the compute-only step time)
    nocache         each batch's rows read and written back, synchronously
    lru             LRU cache of --cache-fraction of the rows, misses read synchronously
    lookahead       the oracle's cache of the same size, L = --lookahead
    lookahead+hot   the same memory: --hot-share of it a hot tier, the rest cache
    reads-only      (--probe: a probe, not training) the lookahead run's misses read step
                    after step from the store under the same limit (:mod:`bagpipe.bench.scenarios.scale.readprobe`)

The table file is written once, every row materialised (its initial value and zero
state); before each run the rows the previous runs could have written (every row of
their batches, in this invocation and the earlier ones that used the same file: their
union is kept beside it) are rewritten to their initial values and the file is dropped from the
page cache, so each run starts cold from the same tables and every mode's
``params_sha256`` must equal ``full``'s. Repetitions interleave the configurations.

While a run lasts, its group's memory.stat (anonymous memory, page cache, dirty,
writeback, mapped) is sampled every ``--sample-s`` seconds into results.json and the
plot; the run's own summary adds its anonymous memory and its group's figures every 10
steps (``memory.by_step``). A run that fails (an OOM kill, an error, a time-out) is
reported as failed with the reason, never as a ratio or a digest. The report's figures
and targets: :mod:`bagpipe.bench.scenarios.scale.report`.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from bagpipe.bench.harness.report import header, write_results
from bagpipe.bench.harness.runner import TrainFailed, launch, prepare
from bagpipe.bench.harness.settings import CachePoint, Loaded, Throughput
from bagpipe.bench.scenarios.modes.scenario import drop_cached, layout_of, materialise_disk_store
from bagpipe.bench.scenarios.scale.report import plot, summarise, thin
from bagpipe.config.modes import MODES
from bagpipe.data.frequency import frequency_store_layout
from bagpipe.data.shards import Dataset
from bagpipe.jsonout import json_text
from bagpipe.optim.names import row_state_dim
from bagpipe.testbed.load import BackgroundLoad
from bagpipe.testbed.memlimit import MemoryGroup, find_memory_controller

CONFIGS = ("full", "nocache", "lru", "lookahead", "lookahead+hot", "fae", "hotline")
PROBE = "reads-only"
SEED = 0  # bagpipe train's default --seed: the initial rows of the table file
TOUCHED = "store-touched-rows.npy"  # every row a run of this table file may have written


@dataclass(kw_only=True)
class ScaleBench(Loaded, CachePoint, Throughput):
    """full (memory store, no limit) against nocache, lru and lookahead (with and without a
    hot tier) on a disk store inside a memory cgroup far smaller than the table file:
    Criteo-Kaggle profile at half cardinality, D = 64 (4.1 GiB of rows and Adagrad
    state) under 1 GiB, DLRM Kaggle MLPs, batch 2048, Adagrad, a 1% cache, 1,000 steps."""

    name = "scale"
    QUICK = dict(
        scale=0.02,
        batch_size=256,
        recipe="debug",
        embedding_dim=16,
        steps=12,
        warmup=3,
        reps=1,
        lookahead=4,
        cache_fraction=0.05,
        memory_limit_mb=1024,
        eval_samples=512,
        threads=1,
        sample_s=0.25,
        configs=CONFIGS[:4],
    )

    scale: float = 0.5
    steps: int = 1000
    warmup: int = 50
    cache_fraction: float = 0.01
    eval_samples: int = 4096
    embedding_dim: int = 64
    """D of every table (bagpipe train --embedding-dim)."""
    zipf_exponent: float = 1.15
    """Skew of the generated data (bagpipe synth's; 1.15: the top 1% of a 10M-row table's
    rows take 90% of its lookups; lower is less skewed: more rows to read)."""
    memory_limit_mb: float = 1024.0
    """The memory group's limit for each cached run, MiB, page cache included (the run's budget)."""
    configs: tuple[str, ...] = CONFIGS
    """Configurations to run: a comma-separated subset of """ + ",".join(CONFIGS) + """ (full runs first)."""
    hot_share: float = 0.75
    """Share of the cache's memory lookahead+hot gives its hot tier (the rest is its cache)."""
    probe: bool = False
    """Also run the reads-only probe (the lookahead run's misses read under the limit, nothing else)."""
    digest: bool = True
    """Compute every run's params_sha256 (reads the whole table at the end of each run, not timed)."""
    sample_s: float = 1.0
    """Seconds between two samples of a run's group memory (memory.stat)."""
    checkpoint_every: int = 0
    """Steps between each run's checkpoints (bagpipe train --checkpoint-every; 0: none)."""
    final_checkpoint: bool = False
    """Write each run's final checkpoint at its end, as a user's run does (its cut and write
    inside the memory limit); the table shows the step of each run's last checkpoint."""
    store_layout: Literal["auto", "identity", "frequency"] = "auto"
    """Row layout of the table file the cached configurations share (bagpipe train
    --store-layout): identity, or frequency -- the rows the train split uses most at its front;
    auto: the one bagpipe train's default picks for a run of --steps over the generated split
    (results.json's config says which)."""

    def validate(self) -> None:
        super().validate()
        self.check_subset("configs", CONFIGS)
        self.check("embedding_dim", self.embedding_dim >= 1, "must be >= 1")
        self.check("memory_limit_mb", self.memory_limit_mb >= 64, "must be >= 64")
        self.check("hot_share", 0 < self.hot_share < 1, "must be in (0, 1)")
        self.check("zipf_exponent", 0.5 <= self.zipf_exponent <= 3, "must be in [0.5, 3]")
        self.check("sample_s", self.sample_s > 0, "must be > 0")
        self.check("checkpoint_every", self.checkpoint_every >= 0, "must be >= 0")


def touched_rows(data: Path, batch_size: int, steps: int, seed: int) -> np.ndarray:
    """Every row of the first ``steps`` training batches (ascending): what a run can write."""
    from bagpipe.data.shards import Dataset
    from bagpipe.data.stream import BatchStream

    stream = BatchStream(Dataset(data), "train", batch_size, seed=seed)
    seen = np.zeros(stream.dataset.meta.total_rows, dtype=bool)
    for k in range(steps):
        seen[stream.batch(k).rows.numpy()] = True
    return np.flatnonzero(seen)


def restore_rows(store_dir: Path, meta, dim: int, state_dim: int, rows: np.ndarray) -> None:
    """Rewrite ``rows`` of the table file to their initial values and zero state, at their
    home slots (the row log then holds none of them), then drop the file from the page cache."""
    from bagpipe.store.disk import DiskStore
    from bagpipe.store.init import RowInitializer

    init = RowInitializer(meta.table_sizes, dim, SEED)
    with DiskStore(init, state_dim, store_dir, create=False) as store:
        for a in range(0, len(rows), 1 << 18):
            r = rows[a : a + (1 << 18)]
            store.load(r, init.rows(r), np.zeros((len(r), state_dim), np.float32))  # at home, out of the row log
        store.drop_page_cache()


def settings(b: ScaleBench, cache_rows: int, row_bytes: int) -> dict[str, dict]:
    """Each configuration's ``bagpipe train`` options."""
    hot_rows = int(b.hot_share * cache_rows)
    la = dict(mode="lookahead", lookahead=b.lookahead)
    hot_mb = hot_rows * row_bytes / 2**20
    ends = dict(checkpoint_every=b.checkpoint_every or None, final_checkpoint=b.final_checkpoint)
    each: dict[str, dict] = {
        "full": dict(mode="full", store="memory"),
        "nocache": dict(mode="nocache"),
        "lru": dict(mode="lru", cache_rows=cache_rows),
        "lookahead": dict(la, cache_rows=cache_rows),
        "lookahead+hot": dict(la, cache_rows=cache_rows - hot_rows, hot_budget_mb=hot_mb),
        # FAE and Hotline: the hot tier of lookahead+hot, the cold rows read every batch
        "fae": dict(mode="fae", hot_budget_mb=hot_mb),
        "hotline": dict(mode="hotline", hot_budget_mb=hot_mb),
    }
    return {k: {**v, **ends} for k, v in each.items()}


def last_checkpoint_step(run_dir: Path) -> int | None:
    """The step of the run's newest committed checkpoint (the one its LATEST names), or None."""
    from bagpipe.checkpoint import CheckpointFolder

    try:
        name = CheckpointFolder(run_dir).latest_name()
        return int(name.rpartition("-")[2]) if name else None
    except (OSError, ValueError):
        return None


def _why(e: TrainFailed, report: dict) -> str:
    """One line: why a run failed."""
    if report.get("oom_kills"):
        return f"OOM-killed (group peak {report['peak_mb']:,.0f} MiB of {report['limit_mb']:,.0f})"
    last = [line for line in e.stderr.strip().splitlines() if line.strip()]
    return f"exit {e.returncode}: " + (last[-1][:300] if last else "no message")


def run(b: ScaleBench) -> dict:
    from bagpipe.models import recipe  # noqa: F401 - fails early on a bad model/recipe pair

    controller, where = find_memory_controller()
    if controller is None:
        why = f"bench scale: skipped: no memory cgroup can be used here ({where})"
        print(why, flush=True)
        payload = {**header(b), "skipped": why, "table": why}
        write_results(b.out_dir, "scale", payload, why)
        return payload
    print(f"memory limit through the {where}", flush=True)
    out, data, meta = prepare(b)
    dim = b.embedding_dim
    state_dim = row_state_dim(b.optimizer, dim)
    row_bytes = 4 * (dim + state_dim)
    total = meta.total_rows
    cache_rows = b.cache_rows(total, b.batch_size * meta.num_features)
    store_dir = out / "store"
    header_file = store_dir / "header.json"
    if b.store_layout == "auto":  # as bagpipe train's default picks it (the table and results.json name it)
        b = dataclasses.replace(b, store_layout=layout_of("disk", b.steps, b.batch_size, data))
    layout = frequency_store_layout(Dataset(data)) if b.store_layout == "frequency" else None
    if header_file.exists():
        h = json.loads(header_file.read_text())
        if (h.get("dim"), h.get("state_dim"), h.get("table_sizes")) != (dim, state_dim, meta.table_sizes):
            shutil.rmtree(store_dir)  # a table file of other tables
        elif (h.get("layout") or {}).get("crc32") != (layout.crc32() if layout is not None else None):
            shutil.rmtree(store_dir)  # a table file in another row layout
    touched_file = out / TOUCHED
    if header_file.exists() and not touched_file.exists():
        shutil.rmtree(store_dir)  # an earlier invocation's rows, which ones unknown: start over
    fresh = not header_file.exists()
    materialise_disk_store(store_dir, meta, dim, state_dim, seed=SEED, layout=layout)
    table_bytes = total * row_bytes
    limit = int(b.memory_limit_mb * 2**20)
    print(
        f"table file {table_bytes / 2**30:.2f} GiB ({total:,} rows x {row_bytes} B) under a "
        f"{b.memory_limit_mb:g} MiB limit ({table_bytes / limit:.1f}x); cache {cache_rows:,} rows",
        flush=True,
    )
    touched = touched_rows(data, b.batch_size, b.steps + b.lookahead + 1, SEED)
    if not fresh:  # an earlier invocation's runs (other batches, other steps) wrote these too
        touched = np.union1d(touched, np.load(touched_file))
    np.save(touched_file, touched)  # before any run can write them
    opts = settings(b, cache_rows, row_bytes)
    configs = [c for c in CONFIGS if c in b.configs]
    results: dict[str, list[dict]] = {c: [] for c in configs}
    probes: list[dict] = []
    dirty = not fresh  # a table file of an earlier invocation may hold its rows
    with BackgroundLoad(b.background_load) as load:
        if b.background_load:
            print(f"background load: {b.background_load} CPU-bound process(es) {load.pids}", flush=True)
        for rep in range(b.reps):
            for key in configs:
                print(f"[rep {rep + 1}/{b.reps}] {key} ...", flush=True)
                run_dir = out / "runs" / key.replace("+", "-")
                shutil.rmtree(run_dir, ignore_errors=True)
                if key == "full":
                    try:
                        s = launch(b, data, run_dir, key, digest=b.digest, embedding_dim=dim, **opts[key])
                        s["status"] = "ok"
                    except TrainFailed as e:
                        s = {"status": "failed", "why": _why(e, {})}
                else:
                    if dirty:
                        restore_rows(store_dir, meta, dim, state_dim, touched)
                    drop_cached(store_dir)
                    dirty = True
                    s = limited_run(b, controller, limit, data, run_dir, key, store_dir, dim, opts[key])
                s["last_checkpoint_step"] = last_checkpoint_step(run_dir)
                results[key].append(s)
                print("    " + _line(s), flush=True)
                shutil.rmtree(run_dir, ignore_errors=True)
            if b.probe and "lookahead" in configs:  # a configuration of this scenario (the probe reads as it does)
                print(f"[rep {rep + 1}/{b.reps}] {PROBE} ...", flush=True)
                drop_cached(store_dir)  # the probe only reads: the file stays as the last run left it
                probes.append(run_probe(b, controller, limit, out, data, store_dir, cache_rows, dim, state_dim))
    bitwise = {k: MODES[opts[k]["mode"]].bitwise for k in configs}
    payload = summarise(b, results, probes, total, cache_rows, table_bytes, where, bitwise)
    if b.background_load:
        payload["table"] = f"With {b.background_load} CPU-bound background process(es) running.\n\n" + payload["table"]
    plot(out, payload)
    write_results(out, "scale", payload, payload["table"])
    return payload


def limited_run(
    b: ScaleBench, controller, limit: int, data: Path, run_dir: Path, key: str, store_dir: Path, dim: int, opts: dict
) -> dict:
    """One cached configuration in its own memory group, its memory sampled; a failed run's
    record says why (``status``, ``why``)."""
    failure: TrainFailed | None = None
    with MemoryGroup(controller, limit, "bagpipe-scale") as group:
        sampler = group.sample(b.sample_s)
        try:
            s = launch(
                b,
                data,
                run_dir,
                key,
                preexec_fn=group.enter,
                digest=b.digest,
                embedding_dim=dim,
                store="disk",
                store_dir=store_dir,
                init_from_store=True,
                **opts,
            )
            s["status"] = "ok"
        except TrainFailed as e:
            s = {"status": "failed"}
            failure = e
        series = sampler.stop()
        report = group.report()
    if failure is not None:
        s["why"] = _why(failure, report)
    s["memory_group"] = report | {"max": sampler.maxima()}
    s["memory_series"] = thin(series)
    return s


def _line(s: dict) -> str:
    g = s.get("memory_group")
    if s["status"] != "ok":
        return f"FAILED: {s['why']}"
    io = s.get("io_per_step") or {}
    return f"{s['samples_per_s']:,.0f} samples/s, {io.get('read_bytes', 0) / 2**20:.1f} MiB read/step" + (
        f", group peak {g['peak_mb']:.0f} MiB of {g['limit_mb']:.0f}, max dirty {g['max'].get('dirty', 0):.0f} MiB"
        if g
        else ""
    )


def run_probe(
    b: ScaleBench,
    controller,
    limit: int,
    out: Path,
    data: Path,
    store_dir: Path,
    cache_rows: int,
    dim: int,
    state_dim: int,
) -> dict:
    """The reads-only probe (:mod:`bagpipe.bench.scenarios.scale.readprobe`) in its own process and memory group."""
    spec = {
        "data": str(data),
        "store_dir": str(store_dir),
        "batch_size": b.batch_size,
        "steps": b.steps,
        "warmup": b.warmup,
        "cache_rows": cache_rows,
        "lookahead": b.lookahead,
        "dim": dim,
        "state_dim": state_dim,
        "seed": SEED,
    }
    spec_file, result_file = out / "probe-settings.json", out / "probe-result.json"
    spec_file.write_text(json_text(spec))
    with MemoryGroup(controller, limit, "bagpipe-scale-probe") as group:
        proc = subprocess.run(
            [sys.executable, "-m", "bagpipe.bench.scenarios.scale.readprobe", str(spec_file), str(result_file)],
            capture_output=True,
            text=True,
            preexec_fn=group.enter,
            timeout=b.run_timeout_s or None,
        )
        if proc.returncode != 0:
            raise TrainFailed(PROBE, proc.returncode, proc.stderr)
        res = json.loads(result_file.read_text()) | {"memory_group": group.report()}
    print(f"    {res['ms_per_step']:.0f} ms/step for {res['fetched_rows_per_step']:,.0f} rows", flush=True)
    return res
