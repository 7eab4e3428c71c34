"""``bagpipe bench convergence``: eval AUC and log loss per step, ``full`` vs ``lookahead``.

The lookahead oracle changes where rows live and when they move, never what is
computed, so the two modes must learn identically: this scenario trains both on the
same data (separate ``bagpipe train`` processes, ``--eval-every`` so metrics.jsonl holds
eval points) and records whether the eval curves are identical point for point and the
final ``params_sha256`` equal. It does so on

(a) generated data (the criteo-kaggle profile at a reduced scale), and
(b) the real Criteo Kaggle sample ``../shared/data/criteo/kaggle_train_head10k.tsv``
    (10,000 labelled lines; 9,000 train / 1,000 eval), preprocessed with
    ``bagpipe preprocess criteo``; skipped with a printed reason when ``../shared/data``
    (next to the repository) is absent.

The lookahead cache is deliberately small (``cache_fraction`` of the rows, at least the
largest batch's unique rows) with a long window, so the oracle must force rows out
early: the curves stay identical anyway. One PNG (``convergence.png``) shows AUC and log
loss vs step, lookahead dashed over full. ``identical`` in results.json is False (and
the command exits 1) if any curve or digest differs.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bagpipe.bench.harness.report import fixed, header, markdown_table, pyplot, save_png, write_results
from bagpipe.bench.harness.runner import (
    data_samples,
    make_data,
    run_train,
    train_args,
    widest_batch,
)
from bagpipe.bench.harness.settings import CachePoint, CriteoSample, TrainBench
from bagpipe.config.modes import mode_spec

#: ``../shared/data`` next to the repository (real data samples, not part of the repo).
#: (this file is REPO/bagpipe/bench/scenarios/convergence/scenario.py: parents[4] is REPO;
#: it said parents[2], REPO/bagpipe, since the scenarios moved a folder down, and skipped the sample)
SHARED_DATA = Path(__file__).resolve().parents[4].parent / "shared" / "data"
CRITEO_SAMPLE = Path("criteo") / "kaggle_train_head10k.tsv"
MODES = ("full", "lookahead")


@dataclass(kw_only=True)
class ConvergenceBench(CachePoint, CriteoSample, TrainBench):
    """Eval AUC / log loss per step, full vs lookahead (must be identical; exit 1 otherwise),
    on generated data and the real Criteo sample in ../shared/data. The lookahead cache
    (--cache-fraction of the rows, at least the largest batch's unique rows) is small and
    its window long, so the oracle must force rows out early."""

    name = "convergence"
    #: Under a minute: the tiny profile and the debug recipe, a few eval points each.
    QUICK = dict(
        recipe="debug",
        profile="tiny",
        scale=1.0,
        steps=60,
        batch_size=128,
        eval_every=10,
        eval_samples=2048,
        criteo_steps=40,
        criteo_eval_every=10,
        lookahead=16,
        cache_fraction=0.05,
        threads=1,
    )

    lookahead: int = 50
    cache_fraction: float = 0.02
    # (a) generated data: --profile, --scale, --steps, --batch-size, --eval-samples
    scale: float = 0.01
    steps: int = 400
    batch_size: int = 512
    eval_samples: int = 8192
    run_timeout_s: float = 1800.0
    eval_every: int = 25
    """Evaluate every N steps on the generated data."""
    # (b) the Criteo Kaggle sample: CriteoSample's --criteo-* options (the whole eval split)

    def validate(self) -> None:
        super().validate()
        self.check("eval_every", self.eval_every >= 1, "must be >= 1")


def _curve(run_dir: Path) -> list[dict]:
    pts = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if "eval_auc" in r:
            pts.append({"step": r["step"], "eval_auc": r["eval_auc"], "eval_logloss": r["eval_logloss"]})
    return pts


def _compare(b: ConvergenceBench, name: str, data: Path, steps: int, batch: int, eval_every: int, out: Path) -> dict:
    from bagpipe.data.schema import DatasetMeta

    total = DatasetMeta.load(data).total_rows
    cache_rows = min(total, b.cache_rows(total, widest_batch(data, batch, steps)))
    # the generated data's eval samples are capped; the Criteo sample's whole eval split is used
    common = dict(
        steps=steps,
        batch_size=batch,
        eval_every=eval_every,
        eval_samples=b.eval_samples if name == "generated" else None,
    )
    res: dict[str, Any] = {
        "dataset": name,
        "data": str(data),
        "total_rows": total,
        "steps": steps,
        "batch_size": batch,
        "eval_every": eval_every,
        "cache_rows": cache_rows,
        "lookahead": b.lookahead,
        "modes": {},
    }
    for mode in MODES:
        run_dir = out / "runs" / f"{name}-{mode}"
        if run_dir.exists():
            shutil.rmtree(run_dir)
        cache = dict(cache_rows=cache_rows, lookahead=b.lookahead) if mode_spec(mode).looks_ahead else {}
        args = train_args(b, data, run_dir, digest=True, mode=mode, **common, **cache)
        print(f"{name}: {mode} ...", flush=True)
        s = run_train(args, run_dir / "summary.json", f"convergence {name}/{mode}", timeout=b.run_timeout_s or None)
        curve = _curve(run_dir)
        res["modes"][mode] = {
            "curve": curve,
            "params_sha256": s["params_sha256"],
            "eval_auc": s["eval_auc"],
            "eval_logloss": s["eval_logloss"],
            "samples_per_s": s["samples_per_s"],
            "seconds": s["seconds"],
            "cache": s.get("cache") or {},
            "command": "bagpipe train " + " ".join(args).replace(str(out) + "/", ""),
        }
        c = s.get("cache") or {}
        extra = f", hit rate {c['hit_rate']:.1%}, {c['forced_evictions']:,} forced evictions" if c else ""
        print(f"    final eval AUC {fixed(s['eval_auc'])}, log loss {fixed(s['eval_logloss'])}{extra}", flush=True)
        shutil.rmtree(run_dir, ignore_errors=True)
    f, la = res["modes"]["full"], res["modes"]["lookahead"]
    res["curves_identical"] = f["curve"] == la["curve"] and len(f["curve"]) > 0
    res["params_identical"] = f["params_sha256"] == la["params_sha256"] and f["params_sha256"] is not None
    res["identical"] = res["curves_identical"] and res["params_identical"]
    print(
        f"    {name}: curves identical {res['curves_identical']}, params_sha256 equal {res['params_identical']}",
        flush=True,
    )
    return res


def _preprocess_criteo(src: Path, dest: Path) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "bagpipe",
        "preprocess",
        "criteo",
        "--input",
        str(src),
        "--out",
        str(dest),
        "--overwrite",
        "--no-progress",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"bagpipe preprocess criteo failed:\n{proc.stderr[-3000:]}")
    return cmd


def run(b: ConvergenceBench) -> dict:
    out = b.out_dir
    out.mkdir(parents=True, exist_ok=True)
    datasets: dict[str, dict] = {}
    commands: list[str] = []

    data = out / "data-generated"
    samples = data_samples(b.batch_size, b.steps)
    make_data(b, data, progress=False)
    commands.append(
        f"bagpipe synth --profile {b.profile} --scale {b.scale:g} --samples {samples} --seed 1 --out data-generated"
    )
    datasets["generated"] = _compare(b, "generated", data, b.steps, b.batch_size, b.eval_every, out)

    skipped = None
    shared = Path(b.shared_data) if b.shared_data else SHARED_DATA
    src = shared / CRITEO_SAMPLE
    if not b.criteo:
        skipped = "turned off (criteo=False)"
    elif not src.exists():
        skipped = f"{src} not found (the real data samples live in ../shared/data next to the repository)"
    if skipped:
        print(f"criteo sample skipped: {skipped}", flush=True)
    else:
        cdata = out / "data-criteo"
        cmd = _preprocess_criteo(src, cdata)
        commands.append("bagpipe " + " ".join(cmd[3:]).replace(str(out) + "/", ""))
        datasets["criteo-kaggle-sample"] = _compare(
            b, "criteo-kaggle-sample", cdata, b.criteo_steps, b.criteo_batch_size, b.criteo_eval_every, out
        )
    shutil.rmtree(out / "runs", ignore_errors=True)
    for d in datasets.values():
        commands += [m["command"] for m in d["modes"].values()]

    rows = []
    for name, d in datasets.items():
        for mode, m in d["modes"].items():
            c = m["cache"]
            rows.append(
                [
                    name,
                    mode,
                    d["steps"],
                    d["batch_size"],
                    f"{fixed(m['eval_auc'])}",
                    f"{fixed(m['eval_logloss'])}",
                    len(m["curve"]),
                    "-" if not c else f"{d['cache_rows']:,} rows, L={d['lookahead']}",
                    "-" if not c else f"{c['forced_evictions']:,}",
                    m["params_sha256"][:16],
                    "yes" if d["identical"] else "**NO**",
                ]
            )
    headers = [
        "dataset",
        "mode",
        "steps",
        "batch",
        "final eval AUC",
        "final eval log loss",
        "eval points",
        "cache",
        "forced evictions",
        "params_sha256",
        "identical curves + params",
    ]
    identical = all(d["identical"] for d in datasets.values())
    table = markdown_table(headers, rows)
    table += "\n\n" + (
        "full and lookahead: every eval point and the final params_sha256 identical on every dataset."
        if identical
        else "**full and lookahead differ** (see results.json)."
    )
    if skipped:
        table += f"\n\nCriteo sample skipped: {skipped}."
    payload = {
        **header(b),
        "datasets": datasets,
        "identical": identical,
        "criteo_skipped": skipped,
        "commands": commands,
        "table": table,
    }
    _plot(out, datasets)
    write_results(out, "convergence", payload, table)
    return payload


def _plot(out: Path, datasets: dict) -> None:
    plt = pyplot()
    n = len(datasets)
    fig, axes = plt.subplots(n, 2, figsize=(11, 3.8 * n), squeeze=False)
    styles = {
        "full": dict(linestyle="-", linewidth=3, alpha=0.5, color="tab:blue", marker="o", markersize=7),
        "lookahead": dict(linestyle="--", linewidth=1.5, color="tab:red", marker="x", markersize=6),
    }
    for row, (name, d) in zip(axes, datasets.items()):
        for mode, m in d["modes"].items():
            steps = [p["step"] for p in m["curve"]]
            label = mode if not mode_spec(mode).store else f"{mode} ({d['cache_rows']:,} rows, L={d['lookahead']})"
            row[0].plot(steps, [p["eval_auc"] for p in m["curve"]], label=label, **styles[mode])
            row[1].plot(steps, [p["eval_logloss"] for p in m["curve"]], label=label, **styles[mode])
        same = "identical" if d["identical"] else "DIFFERENT"
        row[0].set_title(f"{name}: eval AUC ({same})")
        row[1].set_title(f"{name}: eval log loss ({same})")
        for ax in row:
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        row[0].set_ylabel("AUC")
        row[1].set_ylabel("log loss")
    save_png(fig, out / "convergence.png")
