"""``bagpipe bench recovery``: what checkpoints cost, and how long recovery takes.

For each topology (1 trainer + 2 servers, 2 trainers + 2 servers; every role a process
on this machine) on the same generated data, model and batch:

* **checkpoint cost** -- the same run without checkpoints and with ``--checkpoint-every``
  each of ``intervals``, interleaved over repetitions: samples/s and its ratio to the
  run without (mid-run checkpoints are inside the measured time: their cuts, while
  their files are written in the background), the seconds training waited per
  checkpoint (the cut) and the seconds each took to write meanwhile;
* **checkpoint size** -- every checkpoint of the runs: its kind, the rows it holds
  (a delta: the rows written since the previous checkpoint; a full one: every row
  written since initialisation) and its bytes, so bytes per row shows that size
  follows the rows trained, not the tables;
* **recovery** -- for each role in ``kill_roles``, one run with ``--max-restarts 1`` and
  checkpoints every ``kill_interval`` steps whose role is SIGKILLed at step ``kill_at``:
  seconds from the kill to the first step after the restart, the steps replayed, and
  where the seconds went (``RUN/recovery.json``'s phases: detection, stopping the other
  roles, process start, imports, rendezvous, data, restore, pipeline refill).

Targets (issue 23): checkpoints every 500 steps cost at most 3% of samples/s, every 100
at most 10%; checkpoint bytes proportional to the rows written since the previous
checkpoint; a SIGKILLed server or trainer training again within 10 s.
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

from bagpipe.bench.harness.report import (
    header,
    markdown_table,
    median_spread,
    percent,
    pyplot,
    save_png,
    throughput,
    write_results,
)
from bagpipe.bench.harness.runner import launch, prepare, train_args, train_command
from bagpipe.bench.harness.settings import CachePoint, Throughput
from bagpipe.phases import PHASES

TOPOLOGIES = {"1x2": (1, 2), "2x2": (2, 2)}
ROLES = ("server 1", "trainer 0", "trainer 1", "oracle")


@dataclass(kw_only=True)
class RecoveryBench(CachePoint, Throughput):
    """Checkpoint cost (throughput with checkpoints every N steps vs none; the bytes of every
    checkpoint against the rows it holds) and recovery time, phase by phase, after a killed
    server or trainer, for 1 and 2 trainers with 2 embedding servers, every role a process
    on this machine."""

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
        kill_roles=("server 1",),
        recovery_tail=10,
        spares=("on",),
    )

    steps: int = 1100
    warmup: int = 50
    topologies: tuple[str, ...] = tuple(TOPOLOGIES)
    """Topologies to run: a comma-separated subset of 1x2,2x2."""
    intervals: tuple[int, ...] = (100, 500)
    """Checkpoint intervals (steps; bagpipe train's checkpoint_every) compared with no checkpoints."""
    compact_every: int = 10
    """--checkpoint-compact-every of every run (every Nth checkpoint is full)."""
    kill_interval: int = 100
    """Checkpoint interval (steps) of the recovery runs."""
    kill_at: int = 350
    """Step at which a recovery run's role is killed."""
    kill_roles: tuple[str, ...] = ("server 1", "trainer 0")
    """Roles killed, one recovery run each per topology (server 1, trainer 0, trainer 1, oracle)."""
    recovery_tail: int = 100
    """Steps a recovery run trains after ``kill_at`` (its --steps is kill_at + this)."""
    spares: tuple[str, ...] = ("on", "off")
    """Recovery runs with the launcher's pre-started spares (on: --spares, the default) and without (off)."""

    def validate(self) -> None:
        super().validate()
        self.check_subset("topologies", tuple(TOPOLOGIES))
        self.check_subset("kill_roles", ROLES)
        self.check_subset("spares", ("on", "off"))
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
        self.check("recovery_tail", self.recovery_tail >= 1, "must be >= 1")


def _topology(b: RecoveryBench, topo: str) -> dict:
    t, s = TOPOLOGIES[topo]
    return dict(
        mode="lookahead", lookahead=b.lookahead, trainers=t, servers=s, checkpoint_compact_every=b.compact_every
    )


def _heartbeat(run_dir: Path) -> int:
    try:
        return int.from_bytes((run_dir / ".step").read_bytes()[:8], "little")
    except (OSError, ValueError):
        return 0


def _recover(b: RecoveryBench, data: Path, run_dir: Path, topo: str, role: str, spares: str, cache_rows: int) -> dict:
    """One run whose ``role`` is killed at ``kill_at``: kill -> first step after the restart."""
    args = train_args(
        b,
        data,
        run_dir,
        cache_rows=cache_rows,
        checkpoint_every=b.kill_interval,
        max_restarts=1,
        spares=spares == "on",
        **_topology(b, topo) | {"steps": b.kill_at + b.recovery_tail},
    )
    proc = subprocess.Popen(train_command(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while _heartbeat(run_dir) < b.kill_at:
            if proc.poll() is not None:
                raise RuntimeError(f"the recovery run ended early: {proc.communicate()[1][-2000:]}")
            time.sleep(0.02)
        pid = {r["role"]: r["pid"] for r in json.loads((run_dir / "roles.json").read_text())}[role]
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
    phases = dict(event.get("phases") or {})
    return {
        "role": role,
        "spares": spares,
        "kill_to_training_s": t_again - t_kill,
        "kill_to_reaped_s": event["died"] - t_kill if "died" in event else None,
        "phases_s": phases,
        "died_at_step": event["died_at_step"],
        "from_checkpoint": event["from_checkpoint"],
        "steps_replayed": event["died_at_step"] - event["from_checkpoint"],
    }


def run(b: RecoveryBench) -> dict:
    out, data, meta = prepare(b)
    cache_rows = b.cache_rows(meta.total_rows, b.batch_size * meta.num_features)
    plan = [(topo, every) for topo in b.topologies for every in (0, *b.intervals)]
    results: dict[str, list[dict]] = {f"{t}/{e}": [] for t, e in plan}
    load = [os.getloadavg()[0]]
    for rep in range(b.reps):
        for topo, every in plan if rep % 2 == 0 else plan[::-1]:  # alternate the order: drift hits all alike
            key = f"{topo}/{every}"
            print(f"[rep {rep + 1}/{b.reps}] {topo}, checkpoint every {every or 'never'} ...", flush=True)
            run_dir = out / "runs" / key.replace("/", "-")
            shutil.rmtree(run_dir, ignore_errors=True)
            s = launch(b, data, run_dir, key, cache_rows=cache_rows, checkpoint_every=every, **_topology(b, topo))
            results[key].append(s)
            c = s.get("checkpoints") or {}
            load.append(os.getloadavg()[0])
            print(
                f"    {s['samples_per_s']:,.0f} samples/s, {c.get('written', 0)} checkpoints, training waited "
                f"{c.get('seconds', 0):.1f} s, written in {c.get('write_seconds', 0):.1f} s (load {load[-1]:.1f})",
                flush=True,
            )
            shutil.rmtree(run_dir, ignore_errors=True)
    recovery: dict[str, list[dict]] = {}
    for topo in b.topologies:
        for role, spares in ((r, sp) for r in b.kill_roles for sp in b.spares):
            if role == "trainer 1" and TOPOLOGIES[topo][0] < 2:
                continue
            print(f"recovery: {topo}, {role} killed at step {b.kill_at}, spares {spares} ...", flush=True)
            run_dir = out / "runs" / f"{topo}-recovery"
            shutil.rmtree(run_dir, ignore_errors=True)
            r = _recover(b, data, run_dir, topo, role, spares, cache_rows)
            recovery.setdefault(topo, []).append(r)
            load.append(os.getloadavg()[0])
            print(
                f"    training again {r['kill_to_training_s']:.1f} s after the kill, {r['steps_replayed']} steps replayed; "
                + ", ".join(f"{k} {v:.2f}" for k, v in r["phases_s"].items()),
                flush=True,
            )
            shutil.rmtree(run_dir, ignore_errors=True)
    payload = summarise(b, results, recovery, cache_rows, load)
    _plot(out, payload)
    write_results(out, "recovery", payload, payload["table"])
    return payload


def _sizes(runs: list[dict]) -> list[dict]:
    """Every committed checkpoint of ``runs``: step, kind, rows, bytes."""
    return [h for r in runs for h in ((r.get("checkpoints") or {}).get("history") or []) if h.get("failed") is None]


def summarise(
    b: RecoveryBench, results: dict[str, list[dict]], recovery: dict, cache_rows: int, load: list[float]
) -> dict:
    rows, out, size_rows = [], {}, []
    for key, runs in results.items():
        topo, every = key.split("/")
        sps, spread = throughput(runs)
        base = median_spread([r["samples_per_s"] for r in results[f"{topo}/0"]])[0]
        stats = [(r.get("checkpoints") or {}) for r in runs]
        n = median_spread([w.get("written", 0) for w in stats])[0]
        waited = median_spread([w.get("seconds", 0.0) / max(w.get("written", 0), 1) for w in stats])[0]
        writing = median_spread([w.get("write_seconds", 0.0) / max(w.get("written", 0), 1) for w in stats])[0]
        hist = _sizes(runs)
        full = [h["bytes"] for h in hist if h["kind"] == "full"]
        delta = [h["bytes"] for h in hist if h["kind"] == "delta"]
        out[key] = {
            "samples_per_s": sps,
            "spread": spread,
            "ratio_to_no_checkpoints": sps / base,
            "checkpoints": n,
            "waited_s_per_checkpoint": waited,
            "write_s_per_checkpoint": writing,
            "full_checkpoint_mib": median_spread(full)[0] / 2**20 if full else None,
            "incremental_checkpoint_mib": median_spread(delta)[0] / 2**20 if delta else None,
            "history": hist,
            "runs": [r["samples_per_s"] for r in runs],
        }
        v = out[key]
        rows.append(
            [
                topo,
                every if every != "0" else "never",
                sps,
                percent(spread),
                f"{sps / base:.3f}x",
                int(n),
                "-" if every == "0" else f"{waited:.2f}",
                "-" if every == "0" else f"{writing:.2f}",
                "-" if v["full_checkpoint_mib"] is None else f"{v['full_checkpoint_mib']:.1f}",
                "-" if v["incremental_checkpoint_mib"] is None else f"{v['incremental_checkpoint_mib']:.1f}",
            ]
        )
        if runs and every != "0":
            for h in _sizes(runs[:1]):
                size_rows.append(
                    [
                        topo,
                        every,
                        h["step"],
                        h["kind"],
                        h["rows"],
                        f"{h['bytes'] / 2**20:.2f}",
                        f"{h['bytes'] / max(h['rows'], 1):.1f}",
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
            "s training waited per checkpoint",
            "s writing per checkpoint (background)",
            "full MiB",
            "incremental MiB",
        ],
        rows,
    )
    table += (
        "\n\nEvery checkpoint of the first repetition (a delta holds the rows written since the previous "
        "checkpoint, a full one every row written since initialisation):\n\n"
        + markdown_table(["topology", "every", "step", "kind", "rows", "MiB", "bytes per row"], size_rows)
    )
    names = [p for p, _ in PHASES]
    rec_rows = [
        [
            topo,
            r["role"],
            r["spares"],
            r["died_at_step"],
            r["from_checkpoint"],
            r["steps_replayed"],
            f"{r['kill_to_training_s']:.1f}",
            *[f"{r['phases_s'].get(p, float('nan')):.2f}" for p in names],
        ]
        for topo, rs in recovery.items()
        for r in rs
    ]
    table += "\n\nRecovery (the role killed with SIGKILL; the launcher restarts every role):\n\n" + markdown_table(
        [
            "topology",
            "killed",
            "spares",
            "at step",
            "from checkpoint",
            "replayed",
            "kill to training again (s)",
            *names,
        ],
        rec_rows,
    )
    table += f"\n\nLoad average (1 min) during the runs: {min(load):.1f}-{max(load):.1f}."
    return {
        **header(b),
        "cache_rows": cache_rows,
        "results": out,
        "recovery": recovery,
        "load_average": load,
        "table": table,
    }


def _plot(out: Path, payload: dict) -> None:
    plt = pyplot()
    res = payload["results"]
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(17, 4.8))
    keys = list(res)
    ax1.bar(
        [k.replace("/0", "/never") for k in keys], [res[k]["ratio_to_no_checkpoints"] for k in keys], color="tab:green"
    )
    ax1.axhline(1.0, color="grey", lw=0.8)
    ax1.set_ylabel("samples/s vs no checkpoints")
    ax1.set_title("checkpoint cost (topology / every N steps)")
    ax1.tick_params(axis="x", rotation=30)
    for kind, color in (("delta", "tab:blue"), ("full", "tab:orange")):
        pts = [(h["rows"], h["bytes"] / 2**20) for k in keys for h in res[k]["history"] if h["kind"] == kind]
        if pts:
            ax2.scatter(*zip(*pts), label=kind, color=color, s=14)
    ax2.set_xlabel("rows in the checkpoint")
    ax2.set_ylabel("MiB")
    ax2.set_title("checkpoint size against rows trained")
    ax2.legend()
    rec = [(f"{t}\n{r['role']}\nspares {r['spares']}", r) for t, rs in payload["recovery"].items() for r in rs]
    bottom = [0.0] * len(rec)
    for name, _ in PHASES:
        vals = [r["phases_s"].get(name, 0.0) for _, r in rec]
        ax3.bar([label for label, _ in rec], vals, bottom=bottom, label=name)
        bottom = [a + v for a, v in zip(bottom, vals)]
    ax3.scatter(
        [label for label, _ in rec],
        [r["kill_to_training_s"] for _, r in rec],
        color="black",
        zorder=3,
        label="kill to training again",
    )
    ax3.set_ylabel("seconds")
    ax3.set_title("recovery, phase by phase")
    ax3.legend(fontsize=7)
    save_png(fig, out / "recovery.png")
