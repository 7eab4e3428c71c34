"""``bagpipe bench peers``: TorchRec's DLRM beside bagpipe ``full`` and ``lookahead``.

Every configuration trains the same model on the same data for the same number of
steps, each run in its own process (so peak memory is per run), interleaved over
repetitions (the order rotates from one repetition to the next):

* ``full`` / ``lookahead`` (memory store) / ``lookahead-disk``: ``python -m bagpipe
  train ... --summary-json`` exactly as ``bagpipe bench modes`` launches it
  (:func:`bagpipe.bench.scenarios.modes.scenario.run_mode`, including the cold copy of the disk table file).
* ``torchrec``: :func:`~bagpipe.bench.scenarios.peers.torchrec_worker.train_torchrec` in a subprocess
  (``python -m bagpipe.bench.scenarios.peers.torchrec_worker ...``): TorchRec's
  ``torchrec.models.dlrm.DLRM`` around an ``EmbeddingBagCollection`` (one
  ``EmbeddingBagConfig`` per table, pooling SUM), sharded by ``DistributedModelParallel``
  on a one-process gloo group, every table ``TABLE_WISE`` on the ``FUSED`` compute
  kernel (FBGEMM's CPU table-batched embedding bags with exact row-wise Adagrad fused
  into the backward pass); dense parameters step with ``torch.optim.Adagrad``. On CPU
  TorchRec 1.8.0 offers only this kernel for sharded tables; ``DENSE`` exists only for
  ``DATA_PARALLEL`` tables (a full dense gradient of every table each step) and is
  available as ``torchrec-dense`` for small sizes. Its caches (``FUSED_UVM_CACHING``) and SSD/key-value tables need CUDA.
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

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bagpipe.bench.harness.report import (
    header,
    markdown_table,
    median,
    percent,
    pyplot,
    save_png,
    stacked_step_times,
    step_times,
    throughput,
    write_results,
)
from bagpipe.bench.harness.runner import prepare
from bagpipe.bench.harness.settings import CachePoint, Throughput
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
SEED = 0  # ``bagpipe train``'s default seed, which bench modes' runs use
INSTALL_HINT = (
    "bagpipe bench peers needs TorchRec: run `make peers` (installs fbgemm-gpu-cpu 1.8.0 and torchrec 1.8.0 into .venv)"
)
LABELS = {
    "full": "bagpipe full",
    "lookahead": "bagpipe lookahead",
    "lookahead-disk": "bagpipe lookahead (disk store)",
    "torchrec": "TorchRec FUSED",
    "torchrec-omp-default": "TorchRec FUSED (default OpenMP wait)",
    "torchrec-dense": "TorchRec DENSE (data parallel)",
}


@dataclass(kw_only=True)
class PeersBench(CachePoint, Throughput):
    """TorchRec's DLRM (FUSED kernel; needs `make peers`) beside bagpipe full and lookahead
    (memory and disk stores) on the same data, model, batch and optimizer (DLRM, Adagrad);
    defaults: Criteo Kaggle at full cardinality. docs/peers.md explains the configuration."""

    name = "peers"
    QUICK = dict(scale=0.01, batch_size=512, recipe="debug", steps=16, warmup=4, reps=1, lookahead=8)

    steps: int = 110
    cache_fraction: float = 0.10
    """lookahead's cache as a fraction of all rows (the goal is stated at <= 10%)."""
    modes: tuple[str, ...] = ("full", "lookahead", "lookahead-disk", "torchrec")
    """Configurations to run: a comma-separated subset of full,lookahead,lookahead-disk,torchrec,
    torchrec-omp-default,torchrec-dense."""

    def validate(self) -> None:
        super().validate()
        self.modes = tuple(dict.fromkeys(self.modes))
        self.check_subset("modes", ALL_CONFIGS)
        self.check("model", self.model == "dlrm", "must be dlrm (TorchRec's DLRM is the peer)")
        self.check(
            "optimizer", self.optimizer == "adagrad", "must be adagrad (TorchRec's FUSED row-wise Adagrad is the peer)"
        )


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
        sys.executable,
        "-m",
        "bagpipe.bench.scenarios.peers.torchrec_worker",
        "--data",
        str(data),
        "--kernel",
        kernel,
        "--recipe",
        b.recipe,
        "--batch-size",
        str(b.batch_size),
        "--lr",
        str(b.lr),
        "--steps",
        str(b.steps),
        "--warmup",
        str(b.warmup),
        "--seed",
        str(SEED),
        "--eval-samples",
        str(b.eval_samples),
        "--threads",
        str(b.threads),
        "--summary-json",
        str(summary),
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=b.run_timeout_s or None)
    if proc.returncode != 0:
        raise RuntimeError(f"torchrec/{kernel} failed:\n{proc.stderr[-3000:]}")
    s = json.loads(summary.read_text())
    s["wall_s"] = time.perf_counter() - t0
    return s


def run(b: PeersBench) -> dict:
    missing = torchrec_available() if any(c in TORCHREC_CONFIGS for c in b.modes) else None
    if missing:
        raise ConfigError(missing)
    from bagpipe.bench.scenarios.modes.scenario import make_templates, run_mode
    from bagpipe.models import recipe

    out, data, meta = prepare(b)
    total = meta.total_rows
    if "torchrec-dense" in b.modes and total > DENSE_MAX_ROWS:
        raise ConfigError(
            f"torchrec-dense makes a dense gradient of every row each step; it is for tables of at most "
            f"{DENSE_MAX_ROWS:,} rows (these have {total:,}: pass e.g. --scale 0.1)"
        )
    cache_rows = b.cache_rows(total, b.batch_size * meta.num_features)
    if "lookahead-disk" in b.modes:  # the table file as it would exist on disk, written once
        dim = recipe("dlrm", b.recipe).embedding_dim
        # in the row layout bagpipe train's default picks for these runs (bench modes' "disk")
        make_templates(("disk",), b.steps, b.batch_size, out, data, meta, dim, state_dim=1, seed=SEED)
    os.sync()  # flush the data set / table file now, not in the background of the first measured runs

    results: dict[str, list[dict]] = {c: [] for c in b.modes}
    n = len(b.modes)
    for rep in range(b.reps):
        order = b.modes[rep % n :] + b.modes[: rep % n]  # rotate so no configuration always runs first
        for cfg in order:
            print(f"[rep {rep + 1}/{b.reps}] {LABELS[cfg]} ...", flush=True)
            run_dir = out / "runs" / f"{cfg}-{rep}"
            if run_dir.exists():
                shutil.rmtree(run_dir)
            if cfg in BAGPIPE_CONFIGS:  # a disk store starts from a cold copy: rows come from the device
                s = run_mode(b, data, out, run_dir, *BAGPIPE_CONFIGS[cfg], cache_rows)
            else:
                s = _run_torchrec(b, data, run_dir, *TORCHREC_CONFIGS[cfg])
            results[cfg].append(s)
            print(
                f"    {s['samples_per_s']:,.0f} samples/s, eval log loss {s['eval_logloss']:.5f}, "
                f"peak anon RSS {s['peak_anon_rss_mb']:.0f} MiB",
                flush=True,
            )
            shutil.rmtree(run_dir, ignore_errors=True)
    shutil.rmtree(out / "store-run", ignore_errors=True)
    payload = summarise(b, results, total, cache_rows)
    _plot(out, payload)
    write_results(out, "peers", payload, payload["table"] + "\n\n" + payload["notes"])
    return payload


def summarise(b: PeersBench, results: dict[str, list[dict]], total_rows: int, cache_rows: int) -> dict:
    ref = results.get(REFERENCE, [])
    ref_sps, ref_loss, ref_rss = (median(ref, k) for k in ("samples_per_s", "eval_logloss", "peak_anon_rss_mb"))
    rows, out = [], {}
    for key, runs in results.items():
        sps, spread = throughput(runs)
        loss, anon, peak = (median(runs, k) for k in ("eval_logloss", "peak_anon_rss_mb", "peak_rss_mb"))
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
            "label": LABELS[key],
            "samples_per_s": sps,
            "spread": spread,
            "ratio_to_torchrec": ratio,
            "goal_ratio": goal,
            "goal_met": None if goal is None or ratio != ratio else verdict.startswith("met"),
            "eval_logloss": loss,
            "eval_logloss_minus_torchrec": loss - ref_loss,
            "eval_auc": median(runs, "eval_auc"),
            "rows_in_trainer": held,
            "rows_in_trainer_fraction": held / total_rows,
            "peak_anon_rss_mb": anon,
            "peak_rss_mb": peak,
            "anon_rss_ratio_to_torchrec": anon / ref_rss,
            "time_per_step_ms": step_times(runs),
            "runs": [r["samples_per_s"] for r in runs],
            "eval_logloss_runs": [r["eval_logloss"] for r in runs],
            "cache": runs[0].get("cache") or {},
            "plan": runs[0].get("plan"),
            "omp_wait_policy": runs[0].get("omp_wait_policy"),
        }
        rows.append(
            [
                LABELS[key],
                sps,
                percent(spread),
                _fmt(ratio, "{:.2f}x"),
                verdict,
                f"{loss:.5f}",
                _fmt(loss - ref_loss, "{:+.1e}"),
                f"{held / total_rows:.0%}",
                anon,
                _fmt(anon / ref_rss, "{:.0%}"),
                peak,
            ]
        )
    headers = [
        "configuration",
        "samples/s",
        "spread",
        "vs TorchRec",
        "goal",
        "eval log loss",
        "vs TorchRec",
        "rows in trainer",
        "peak anon RSS MiB",
        "vs TorchRec",
        "peak RSS MiB",
    ]
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
        **header(b),
        "total_rows": total_rows,
        "cache_rows": cache_rows,
        "cache_fraction_of_rows": cache_rows / total_rows,
        "results": out,
        "table": table,
        "notes": notes,
    }


def _fmt(x: float, spec: str) -> str:
    return "n/a" if x != x else spec.format(x)


def _plot(out: Path, payload: dict) -> None:
    plt = pyplot()
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
    bottom = stacked_step_times(ax2, labels, [res[k]["time_per_step_ms"] for k in keys], skip_empty=True)
    ax2.set_title("time per step (TorchRec: row updates inside backward)")
    ax2.set_ylim(0, max(bottom.max(), 1e-9) * 1.35)
    ax2.legend(fontsize=7, ncol=3, loc="upper center")
    ax3.bar(labels, [res[k]["peak_anon_rss_mb"] for k in keys], color=colors)
    for i, k in enumerate(keys):
        ax3.text(
            i,
            res[k]["peak_anon_rss_mb"],
            f"{res[k]['rows_in_trainer_fraction']:.0%}\nrows",
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax3.set_ylabel("peak anonymous RSS (MiB)")
    ax3.set_ylim(0, max(res[k]["peak_anon_rss_mb"] for k in keys) * 1.2)
    ax3.set_title("memory per training process")
    ax1.set_ylim(0, max(hi.max(), 1e-9) * 1.12)
    for ax in (ax1, ax2, ax3):
        ax.tick_params(axis="x", labelsize=7)
    save_png(fig, out / "peers.png")
