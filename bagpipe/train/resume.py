"""What a resumed run may continue, checked before anything in the run folder changes.

A run continues from its latest checkpoint only if it would compute what the run
computed: the same data set (its fingerprint), batch size, block size, seed, model,
recipe, embedding dimension, optimizer and learning rate. Everything else may change
on resume (:data:`MAY_CHANGE`): how long to train, how often to evaluate or
checkpoint, threads and progress, and where the rows live (any mode, store or cache
size resumes any other's checkpoint, since checkpoints hold rows in global order).

Every file of the checkpoint resumed (and of the chain it rests on) is checked against
its manifest (size, CRC-32) before anything in the run folder changes. A damaged latest
checkpoint is refused in one line naming the damaged file and offering the newest
intact checkpoint before it (``--resume-from step-NNNNNNNN``), which makes LATEST name
that checkpoint once every check has passed; the damaged one is left on disk.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shlex
from pathlib import Path

import torch

from bagpipe.checkpoint import Checkpoint, CheckpointFolder
from bagpipe.checkpoint.format import LATEST, step_name
from bagpipe.config import to_flat
from bagpipe.config.agreement import RESOLVED
from bagpipe.config.environ import env_int
from bagpipe.config.train import TrainConfig
from bagpipe.data.shards import Dataset
from bagpipe.errors import CheckpointError, ConfigError
from bagpipe.files import RUN_FILES, RUN_RECORDS, atomic_write_text, refuse_unnamable
from bagpipe.phases import RESTART_ENV
from bagpipe.train.rundir import RunDir

log = logging.getLogger(__name__)

#: Settings a resumed run may give other values than the run had.
MAY_CHANGE = (
    "data",
    "out",
    "steps",
    "epochs",
    "eval_every",
    "eval_samples",
    "checkpoint_every",
    "resume",
    "resume_from",
    "summary_json",
    "threads",
    "progress",
    "warmup_steps",
    "final_checkpoint",
    "digest",
    "tensorboard",
    "mode",
    "store",
    "store_dir",
    "store_layout",
    "cache_rows",
    "lookahead",
    "cache_budget_mb",
    "init_from_store",
    "trainers",
    "servers",
    "cache_sync",
    "plans_in_flight",
    "ddp_bucket_mb",
    "rendezvous_timeout",
    "max_restarts",
    "spares",
    "secret_file",
    "checkpoint_compact_every",
    "hot_budget_mb",
    "hot_rows",
    "hot_sample_rate",
)


def elastic_restart() -> bool:
    """Whether this process was restarted after a failure (torchrun's ``--max-restarts``, or
    the local launcher's): then it continues from the run's latest checkpoint, as if given
    --resume, and a run whose training had ended (its final checkpoint written, not yet its
    summary) only finishes (evaluation, digest, summary)."""
    return env_int("TORCHELASTIC_RESTART_COUNT", 0) > 0 or bool(os.environ.get(RESTART_ENV))


#: Settings whose change changes others that were not given (compared, and named, first).
LEADING = ("model", "recipe", "optimizer", "lr_schedule")


def _approximate_sync(value) -> bool:
    return isinstance(value, str) and value.startswith("periodic")


def refused_change(old: dict, new: dict) -> tuple[str, object, object] | None:
    """The first setting (by name) that a run of settings ``old`` may not resume with as
    ``new`` -- (name, old value, new value) -- or None. Every setting outside
    :data:`MAY_CHANGE` must stay; ``cache_sync`` may change between the exact
    synchronisations (partitioned, owner, replicated) but not to or from ``periodic:K``, cDLRM's
    approximation: the resumed run would report as exact a model trained partly
    approximately, or continue an approximate one under another approximation."""
    # the settings that bring others along first (a recipe brings its D and its rate), the
    # derived ones last (embedding_lr follows --lr when not given): the one named is then
    # the one the user changed
    for key in sorted(new, key=lambda k: (k not in LEADING, k in RESOLVED, k)):
        if key not in MAY_CHANGE and old.get(key) != new[key]:
            return key, old.get(key), new[key]
        if key == "cache_sync" and old.get(key, new[key]) != new[key]:
            if _approximate_sync(old.get(key)) or _approximate_sync(new[key]):
                return key, old.get(key), new[key]
    return None


def effective(cfg: TrainConfig) -> dict:
    """``cfg``'s settings as compared on resume: one not given that stands for a value derived
    from others (--embedding-dim: the recipe's D; --embedding-lr: --lr) as that value, so a run
    started without --embedding-dim resumes with --embedding-dim 8 when its recipe's D is 8."""
    flat = to_flat(cfg)
    for name, (_, value) in RESOLVED.items():
        if flat.get(name) is None:
            flat[name] = value(cfg)
    return flat


def resume_point(
    run: RunDir, cfg: TrainConfig, dataset: Dataset, required: bool = True, complete_ok: bool = False
) -> Checkpoint | None:
    """The checkpoint ``cfg`` continues, after checking it may (:func:`check_resume`);
    with --resume-from, LATEST then names it -- the one write, made once every check has
    passed."""
    ckpt = check_resume(run, cfg, dataset, required=required, complete_ok=complete_ok)
    if ckpt is not None and _resume_from(cfg) is not None:
        _name_latest(CheckpointFolder(run.path), ckpt)
    return ckpt


def _resume_from(cfg: TrainConfig) -> str | None:
    """The checkpoint --resume-from names; None: LATEST's (a restart continues LATEST)."""
    return None if elastic_restart() else cfg.run.resume_from


def _summary_steps(run: RunDir) -> int | None:
    """The step a finished run trained to, from its summary.json (None: none, or unreadable)."""
    try:
        steps = json.loads(run.summary_file.read_text()).get("steps")
    except (OSError, ValueError, AttributeError):
        return None
    return steps if isinstance(steps, int) and not isinstance(steps, bool) else None


def check_resume(
    run: RunDir, cfg: TrainConfig, dataset: Dataset, required: bool = True, complete_ok: bool = False
) -> Checkpoint | None:
    """The checkpoint ``cfg`` would continue; raises a one-line error (nothing to resume, a
    finished run, a setting or the data set changed, a damaged checkpoint). Without a
    checkpoint and not ``required`` (an automatic restart before the first one): None.
    ``complete_ok`` (an automatic restart): a checkpoint at the last step is continued
    too -- the run then only finishes. Reads only (the checkpoint's files are checked
    against its manifest): ``bagpipe plan --resume`` refuses with it what train refuses."""
    folder = CheckpointFolder(run.path)
    spec = _resume_from(cfg)
    ckpt = chosen(folder, spec) if spec is not None else intact_latest(folder)
    if ckpt is None:
        if not required:
            return None
        raise CheckpointError(nothing_to_resume(folder))
    if ckpt.step >= cfg.run.steps and not (complete_ok and ckpt.step == cfg.run.steps):
        e = cfg.run.epochs
        length, larger = (
            (f"--steps is {cfg.run.steps}", "--steps (or --epochs)")
            if e is None
            else (f"--epochs {e} is {cfg.run.steps} steps", "--epochs (or --steps)")
        )
        raise ConfigError(
            f"{run.path} is complete: its checkpoint is at step {ckpt.step} and {length}; "
            f"give a larger {larger} to train further"
        )
    ended = _summary_steps(run)
    if ended is not None and ckpt.step < ended and ended >= cfg.run.steps and not complete_ok and spec is None:
        # its last steps after the latest checkpoint (--no-final-checkpoint): trained again, they replaced
        # the finished run's summary figures without a word (newcomer round 23)
        raise ConfigError(
            f"{run.path} is complete: it trained to step {ended:,} (summary.json; its latest checkpoint is step "
            f"{ckpt.step:,}, --no-final-checkpoint) and --steps is {cfg.run.steps:,}; give a larger --steps (or "
            f"--epochs) to train further, or --resume-from {ckpt.step} to train steps {ckpt.step + 1:,}-{ended:,} "
            "again (its summary is then replaced)"
        )
    if not run.config_file.exists():
        raise CheckpointError(f"{run.path}: has a checkpoint but no config.json to check the resumed run against")
    before = run.read_config()
    old = effective(TrainConfig.from_json(before["train"], source=str(run.config_file)))
    new = effective(cfg)
    changed = refused_change(old, new)
    if changed is not None:
        key, was_value, now_value = changed
        raise ConfigError(
            f"cannot resume {run.path}: {key} was {was_value!r}, now {now_value!r} "
            f"(a resumed run keeps every setting that changes what is computed; see docs/runs.md)"
        )
    _refuse_another_runs_store(run, before, cfg)
    was = before.get("dataset", {}).get("fingerprint")
    now = dataset.fingerprint()
    if was is not None and was != now:
        raise ConfigError(
            f"cannot resume {run.path}: the data set differs from the one it was trained on "
            f"(fingerprint {was[:12]}, now {now[:12]} for {dataset.dir})"
        )
    return ckpt


def _refuse_another_runs_store(run: RunDir, before: dict, cfg: TrainConfig) -> None:
    """A resume overwrites its store's rows with its checkpoint's: a ``--store-dir`` that
    holds a store other than the one the run kept (another run's, a user's) is refused, as
    a new run refuses it without ``--init-from-store`` (newcomer round 18: it was
    overwritten, exit 0). The run's own store there, or none, is fine."""
    from bagpipe.store import holds_store

    given = cfg.cache.store_dir
    if cfg.cache.store != "disk" or not cfg.cache.spec.store or not given or not holds_store(given):
        return
    kept = ((before.get("train") or {}).get("cache") or {}).get("store_dir") or str(Path(run.path) / "store")
    if os.path.realpath(kept) == os.path.realpath(given):
        from bagpipe.store.disk import layout_name

        made = layout_name(given)
        if cfg.cache.store_layout not in ("auto", made):
            raise ConfigError(  # it was silently kept while config.json said the other (round 19)
                f"--store-layout {cfg.cache.store_layout}: the store in {given} keeps the layout it was made with "
                f"({made}), and a resume reuses it; give an empty --store-dir to make one in the "
                f"{cfg.cache.store_layout} layout, or leave --store-layout out"
            )
        return
    raise ConfigError(
        f"--store-dir {given} already holds a store, not the one {run.path} kept its rows in ({kept}): a resume "
        "overwrites a store's rows with the checkpoint's; give an empty directory, the run's own store, or "
        "leave --store-dir out"
    )


def _name_latest(folder: CheckpointFolder, ckpt: Checkpoint) -> None:
    """--resume-from: LATEST names ``ckpt`` (the run continues from it), said where it named another."""
    latest = folder.latest_name()
    if latest != ckpt.path.name:
        atomic_write_text(folder.root / LATEST, ckpt.path.name + "\n")
        log.warning(
            f"resuming from {ckpt.path.name} (step {ckpt.step}): {LATEST} now names it"
            + (f"; {latest} is left on disk until this run's checkpoints replace it" if latest else "")
        )


def nothing_to_resume(folder: CheckpointFolder) -> str:
    """Why --resume finds no checkpoint in the run folder, and what to do: a complete
    checkpoint that LATEST does not name is offered (--resume-from); else drop --resume."""
    run = folder.root.parent
    have = folder.complete()
    if have:
        return (
            f"{run}: --resume given but {folder.root / LATEST} is missing; resume from the newest complete "
            f"checkpoint with --resume-from {have[-1]}"
        )
    if records_of_a_run(RunDir(run)):
        return (
            f"{run}: --resume given but the run in this folder saved no checkpoint (it has only its records); "
            "it cannot be continued: choose another --out for a new run, or give --out the run folder that "
            "holds the checkpoint to resume"
        )
    return (
        f"{run}: --resume given but there is no checkpoint in this folder; drop --resume to start a new run "
        "there, or give --out the run folder that holds the checkpoint to resume"
    )


def intact_latest(folder: CheckpointFolder) -> Checkpoint | None:
    """The run's latest checkpoint, every file of it and of its chain checked; a damaged
    one is refused in one line that names the damaged file and offers the newest intact
    checkpoint before it. Reads only."""
    name = folder.latest_name()
    if name is None:
        return None
    folder.check_latest(name)
    try:
        return folder.verified(name)
    except CheckpointError as e:
        prev = folder.intact_before(name)
        offer = (
            f"the previous intact checkpoint is step {prev.step}: resume from it with --resume-from {prev.path.name}"
            if prev is not None
            else "no earlier checkpoint of the run is intact: start it again with another --out"
        )
        raise CheckpointError(
            f"cannot resume {folder.root.parent} from its latest checkpoint {name}: {e}; {offer} "
            "(nothing in the run folder was changed)"
        ) from None


def chosen(folder: CheckpointFolder, spec: str) -> Checkpoint:
    """The checkpoint --resume-from names (a step-NNNNNNNN folder name, its path, or its
    step), every file of it and of its chain checked."""
    text = spec.strip()
    name = step_name(int(text)) if text.isdigit() else Path(text).name
    where = Path(text)
    if not text.isdigit() and len(where.parts) > 1 and where.resolve().parent != folder.root.resolve():
        raise ConfigError(
            f"--resume-from {spec}: not a checkpoint of {folder.root} (a run resumes its own checkpoints)"
        )
    have = folder.complete()
    if name not in have:
        raise ConfigError(
            f"--resume-from {spec}: {folder.root} has no complete checkpoint {name} "
            f"(it has: {', '.join(have) if have else 'none'})"
        )
    return folder.verified(name)


def records_of_a_run(run: RunDir) -> list[str]:
    """The names of a run's own records (config.json, metrics.jsonl, summary.json) that
    ``run`` holds: written only by a run that got past its start, so any of them means the
    folder is another run's."""
    return [name for name in RUN_RECORDS if (run.path / name).exists()]


#: Every entry a run (and the local launcher of a distributed one) writes in its folder:
#: anything else there is a user's own (:func:`not_its_own`).
RUN_ENTRIES = RUN_FILES | {
    "job.json",  # the launcher: the job's settings, read by each role
    "roles.json",  # the launcher: its roles' pids and logs
    "recovery.json",  # the launcher: a restart's phases
    ".phases",  # each role's start-up marks
    ".lock",  # RunLock
    ".step",  # the heartbeat
}


def not_its_own(folder: Path) -> list[str]:
    """The entries of ``folder`` that no run writes (a user's files and folders, ``name/``
    for a folder), sorted; [] for a missing or empty folder or a run's own."""
    try:
        names = sorted(os.listdir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as e:
        if e.errno == errno.ELOOP:  # a loop of symbolic links: no folder at its end
            refuse_unnamable(folder, "--out")
        raise
    return [
        f"{n}/" if (folder / n).is_dir() else n
        for n in names
        if n not in RUN_ENTRIES and not (n.startswith(".") and ".tmp-" in n) and not n.startswith(".bagpipe-probe-")
    ]


def refuse_not_a_run(path: str | os.PathLike) -> None:
    """A new run refuses an existing ``--out`` that holds something no run writes and no
    run's records or checkpoints (a user's folder: data sets, notes), before anything is
    written there; an empty folder is taken."""
    folder = Path(path)
    others = not_its_own(folder)
    run = RunDir(folder)
    if not others or records_of_a_run(run) or (folder / "checkpoints").is_dir():
        return
    shown = ", ".join(others[:4]) + (", ..." if len(others) > 4 else "")
    raise ConfigError(
        f"--out {path} is not empty and is not a bagpipe run folder (it holds {shown}): give a new or empty folder"
    )


def refuse_overwrite(run: RunDir) -> None:
    """A new run (no --resume) refuses a folder that holds another run: its checkpoints, or
    only its records (a run with --no-final-checkpoint, or stopped before its first
    checkpoint), which the new run would otherwise replace without a word; and a folder
    that is not a run's at all (:func:`refuse_not_a_run`). Removing the folder is offered
    only when everything in it is the run's own."""
    refuse_not_a_run(run.path)
    folder = CheckpointFolder(run.path)
    if (run.path / "checkpoints" / "LATEST").exists() or folder.complete():
        raise ConfigError(
            f"{run.path} already holds a run with checkpoints; pass --resume to continue it or choose another --out"
        )
    records = records_of_a_run(run)
    if records:
        others = not_its_own(run.path)
        if others:
            shown = ", ".join(others[:4]) + (", ..." if len(others) > 4 else "")
            raise ConfigError(
                f"{run.path} already holds the records of an earlier run ({', '.join(records)}) that saved no "
                f"checkpoint to continue from, beside files that are not the run's ({shown}); choose another --out "
                "(nothing in it was changed)"
            )
        raise ConfigError(
            f"{run.path} already holds the records of an earlier run ({', '.join(records)}) that saved no "
            f"checkpoint to continue from; choose another --out, or remove that folder to start again there "
            f"(rm -r {shlex.quote(str(run.path))}; nothing in it was changed)"
        )


def restore_dense(
    ckpt: Checkpoint, model: torch.nn.Module, dense_opt: torch.optim.Optimizer, init, state_dim: int
) -> int:
    """Load the dense half of ``ckpt`` (model, dense optimizer, torch RNG) after checking
    its row space is this run's; returns the step to continue from. The rows are the
    topology's to restore (one process reads them all; embedding servers each read theirs)."""
    m = ckpt.manifest
    if (m.num_rows, m.dim, m.state_dim) != (init.num_rows, init.dim, state_dim):
        raise CheckpointError(
            f"{ckpt.path}: holds {m.num_rows:,} rows of dim {m.dim} with {m.state_dim} optimizer values each, "
            f"this run has {init.num_rows:,} rows of dim {init.dim} with {state_dim}"
        )
    try:
        model.load_state_dict(ckpt.dense["model"])
        dense_opt.load_state_dict(ckpt.dense["dense_optimizer"])
    except (RuntimeError, ValueError, KeyError) as e:
        first = str(e).strip().splitlines()[0]
        raise CheckpointError(f"{ckpt.path}: does not match this run's model/optimizer ({first})") from None
    torch.set_rng_state(ckpt.dense["torch_rng"])
    return ckpt.step


def finished(run: RunDir, steps: int) -> bool:
    """Whether the run in ``run`` already ended: its summary is written and its latest
    checkpoint is at ``steps`` (a role restarted after the job's end has nothing to do)."""
    if not run.summary_file.exists():
        return False
    name = CheckpointFolder(run.path).latest_name()
    if name is None:
        return False
    try:
        from bagpipe.checkpoint import Manifest

        return Manifest.load(run.path / "checkpoints" / name).step >= steps
    except CheckpointError:
        return False
