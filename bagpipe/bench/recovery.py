"""``bagpipe bench recovery``: what checkpoints cost, and how long recovery takes.

For each topology (1 trainer + 2 servers, 2 trainers + 2 servers; every role a process
on this machine) on the same generated data, model and batch:

* **checkpoint cost** — the same run without checkpoints and with ``--checkpoint-every``
  each of ``intervals``, interleaved over repetitions: samples/s and its ratio to the
  run without (mid-run checkpoints are inside the measured time), seconds per
  checkpoint, bytes of a full checkpoint and of an incremental one (the parts' sizes
  from the manifests; every ``compact_every``-th checkpoint is full);
* **recovery** — one run with ``--max-restarts 1`` and checkpoints every
  ``kill_interval`` steps whose server 1 is SIGKILLed at step ``kill_at``: seconds from
  the kill to the first step after the restart (the launcher notices, stops the other
  roles, restarts all, servers restore their rows, the pipeline refills), and the steps
  replayed (those since the checkpoint it restarted from).

Targets (issue: recovery): checkpoints every 500 steps cost at most 5% of throughput,
every 100 at most 15%; kill to training again under 30 s plus the replay.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from bagpipe.bench.config import CachePoint, Throughput
from bagpipe.bench.report import (
    header,
    markdown_table,
    median_spread,
    pyplot,
    save_png,
    throughput,
    write_results,
)
from bagpipe.bench.runner import launch, prepare, train_args, train_command

TOPOLOGIES = {"1x2": (1, 2), "2x2": (2, 2)}


@dataclass(kw_only=True)
class RecoveryBench(CachePoint, Throughput):
    """Checkpoint cost (throughput with checkpoints every N steps vs none, bytes of full and
    incremental checkpoints) and recovery time after a killed embedding server, for 1 and 2
    trainers with 2 embedding servers, every role a process on this machine."""

    name = "recovery"
    QUICK = dict(
        scale=0.01,
        batch_size=256,
        recipe="debug",
        steps=70,
        warmup=5,
        reps=1,
        lookahead=4,
        intervals=(10, 30),
        kill_interval=10,
        kill_at=35,
    )

    steps: int = 1100
    warmup: int = 50
    topologies: tuple[str, ...] = tuple(TOPOLOGIES)
    """Topologies to run: a comma-separated subset of 1x2,2x2."""
    intervals: tuple[int, ...] = (100, 500)
    """--checkpoint-every values compared with no checkpoints."""
    compact_every: int = 10
    """--checkpoint-compact-every of every run (every Nth checkpoint is full)."""
    kill_interval: int = 100
    """--checkpoint-every of the recovery run."""
    kill_at: int = 350
    """Step at which the recovery run's server 1 is killed."""

    def validate(self) -> None:
        super().validate()
        self.check_subset("topologies", tuple(TOPOLOGIES))
        self.check(
            "intervals",
            bool(self.intervals) and all(0 < i < self.steps for i in self.intervals),
            f"must be checkpoint intervals in (0, --steps {self.steps})",
        )
        self.check("compact_every", self.compact_every >= 1, "must be >= 1")
        self.check("kill_interval", self.kill_interval >= 1, "must be >= 1")
        self.check(
            "kill_at",
            self.kill_interval < self.kill_at < self.steps,
            "must be after the first checkpoint and before the end",
        )


def _topology(b: RecoveryBench, topo: str) -> dict:
    t, s = TOPOLOGIES[topo]
    return dict(
        mode="lookahead", lookahead=b.lookahead, trainers=t, servers=s, checkpoint_compact_every=b.compact_every
    )


def _checkpoint_bytes(run_dir: Path) -> tuple[list[int], list[int]]:
    """Bytes of the full and of the incremental checkpoints still in ``run_dir``."""
    full: list[int] = []
    delta: list[int] = []
    for m in (run_dir / "checkpoints").glob("step-*/MANIFEST.json"):
        man = json.loads(m.read_text())
        (full if man["kind"] == "full" else delta).append(sum(p["bytes"] for p in man["parts"]))
    return full, delta


def _heartbeat(run_dir: Path) -> int:
    try:
        return int.from_bytes((run_dir / ".step").read_bytes()[:8], "little")
    except (OSError, ValueError):
        return 0


def _recover(b: RecoveryBench, data: Path, run_dir: Path, topo: str, cache_rows: int) -> dict:
    """One run whose server 1 is killed at ``kill_at``: kill -> first step after restart."""
    args = train_args(
        b, data, run_dir, cache_rows=cache_rows, checkpoint_every=b.kill_interval, max_restarts=1, **_topology(b, topo)
    )
    proc = subprocess.Popen(train_command(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while _heartbeat(run_dir) < b.kill_at:
            if proc.poll() is not None:
                raise RuntimeError(f"the recovery run ended early: {proc.communicate()[1][-2000:]}")
            time.sleep(0.02)
        pid = {r["role"]: r["pid"] for r in json.loads((run_dir / "roles.json").read_text())}["server 1"]
        t_kill = time.time()
        os.kill(pid, signal.SIGKILL)
        beat = run_dir / ".step"
        log = run_dir / "recovery.json"
        while not log.exists() or beat.stat().st_mtime <= json.loads(log.read_text())[-1]["time"]:
            if proc.poll() is not None:
                raise RuntimeError(f"the recovery run ended without training again: {proc.communicate()[1][-2000:]}")
            time.sleep(0.02)
        t_again = beat.stat().st_mtime
        _, err = proc.communicate(timeout=3600)
    finally:
        if proc.poll() is None:
            proc.kill()
    if proc.returncode != 0:
        raise RuntimeError(f"the recovery run failed: {err[-2000:]}")
    event = json.loads(log.read_text())[-1]
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "kill_to_training_s": t_again - t_kill,
        "died_at_step": event["died_at_step"],
        "from_checkpoint": event["from_checkpoint"],
        "steps_replayed": event["died_at_step"] - event["from_checkpoint"],
        "params_sha256": summary["params_sha256"],
    }


def run(b: RecoveryBench) -> dict:
    out, data, meta = prepare(b)
    cache_rows = b.cache_rows(meta.total_rows, b.batch_size * meta.num_features)
    plan = [(topo, every) for topo in b.topologies for every in (0, *b.intervals)]
    results: dict[str, list[dict]] = {f"{t}/{e}": [] for t, e in plan}
    for rep in range(b.reps):
        for topo, every in plan if rep % 2 == 0 else plan[::-1]:  # alternate the order: drift hits all alike
            key = f"{topo}/{every}"
            print(f"[rep {rep + 1}/{b.reps}] {topo}, checkpoint every {every or 'never'} ...", flush=True)
            run_dir = out / "runs" / key.replace("/", "-")
            shutil.rmtree(run_dir, ignore_errors=True)
            s = launch(b, data, run_dir, key, cache_rows=cache_rows, checkpoint_every=every, **_topology(b, topo))
            s["checkpoint_bytes"] = _checkpoint_bytes(run_dir)
            results[key].append(s)
            c = s.get("checkpoints") or {}
            print(
                f"    {s['samples_per_s']:,.0f} samples/s, {c.get('written', 0)} checkpoints, {c.get('seconds', 0):.1f} s",
                flush=True,
            )
            shutil.rmtree(run_dir, ignore_errors=True)
    recovery = {}
    for topo in b.topologies:
        print(f"recovery: {topo}, server 1 killed at step {b.kill_at} ...", flush=True)
        run_dir = out / "runs" / f"{topo}-recovery"
        shutil.rmtree(run_dir, ignore_errors=True)
        recovery[topo] = _recover(b, data, run_dir, topo, cache_rows)
        print(
            f"    training again {recovery[topo]['kill_to_training_s']:.1f} s after the kill, "
            f"{recovery[topo]['steps_replayed']} steps replayed",
            flush=True,
        )
        shutil.rmtree(run_dir, ignore_errors=True)
    payload = summarise(b, results, recovery, cache_rows)
    _plot(out, payload)
    write_results(out, "recovery", payload, payload["table"])
    return payload


def summarise(b: RecoveryBench, results: dict[str, list[dict]], recovery: dict, cache_rows: int) -> dict:
    rows, out = [], {}
    for key, runs in results.items():
        topo, every = key.split("/")
        sps, spread = throughput(runs)
        base = median_spread([r["samples_per_s"] for r in results[f"{topo}/0"]])[0]
        written = [(r.get("checkpoints") or {}) for r in runs]
        n = median_spread([w.get("written", 0) for w in written])[0]
        secs = median_spread([w.get("seconds", 0.0) / max(w.get("written", 0), 1) for w in written])[0]
        full = [x for r in runs for x in r["checkpoint_bytes"][0]]
        delta = [x for r in runs for x in r["checkpoint_bytes"][1]]
        out[key] = {
            "samples_per_s": sps,
            "spread": spread,
            "ratio_to_no_checkpoints": sps / base,
            "checkpoints": n,
            "seconds_per_checkpoint": secs,
            "full_checkpoint_mib": median_spread(full)[0] / 2**20 if full else None,
            "incremental_checkpoint_mib": median_spread(delta)[0] / 2**20 if delta else None,
            "runs": [r["samples_per_s"] for r in runs],
        }
        v = out[key]
        rows.append(
            [
                topo,
                every if every != "0" else "never",
                sps,
                f"{spread:.0%}",
                f"{sps / base:.3f}x",
                int(n),
                "-" if every == "0" else f"{secs:.2f}",
                "-" if v["full_checkpoint_mib"] is None else f"{v['full_checkpoint_mib']:.1f}",
                "-" if v["incremental_checkpoint_mib"] is None else f"{v['incremental_checkpoint_mib']:.1f}",
            ]
        )
    table = markdown_table(
        [
            "topology",
            "checkpoint every",
            "samples/s",
            "spread",
            "vs none",
            "checkpoints",
            "s per checkpoint",
            "full MiB",
            "incremental MiB",
        ],
        rows,
    )
    rec_rows = [
        [topo, r["died_at_step"], r["from_checkpoint"], r["steps_replayed"], f"{r['kill_to_training_s']:.1f}"]
        for topo, r in recovery.items()
    ]
    table += "\n\nRecovery (server 1 killed with SIGKILL, the launcher restarts every role):\n\n" + markdown_table(
        ["topology", "killed at step", "restarted from checkpoint", "steps replayed", "kill to training again (s)"],
        rec_rows,
    )
    return {**header(b), "cache_rows": cache_rows, "results": out, "recovery": recovery, "table": table}


def _plot(out: Path, payload: dict) -> None:
    plt = pyplot()
    res = payload["results"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    keys = list(res)
    ax1.bar(
        [k.replace("/0", "/never") for k in keys], [res[k]["ratio_to_no_checkpoints"] for k in keys], color="tab:green"
    )
    ax1.axhline(1.0, color="grey", lw=0.8)
    ax1.set_ylabel("samples/s vs no checkpoints")
    ax1.set_title("checkpoint cost (topology / every N steps)")
    ax1.tick_params(axis="x", rotation=30)
    rec = payload["recovery"]
    ax2.bar(list(rec), [r["kill_to_training_s"] for r in rec.values()], color="tab:red")
    ax2.set_ylabel("seconds from SIGKILL to the first step after restart")
    ax2.set_title("recovery of a killed embedding server")
    save_png(fig, out / "recovery.png")
