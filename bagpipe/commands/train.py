"""``bagpipe train``."""

from __future__ import annotations

import argparse

DESCRIPTION = """\
Train a CTR model on a bagpipe dataset: one epoch of its train split, unless --steps N
or --epochs E says how long (E x train samples // batch size steps).

Modes (--mode) compute the same thing and differ only in where embedding rows live:
  full       every table in this process's memory: the reference every mode matches
  nocache    rows in a store; each step fetches its rows and writes them back
  lru        rows in a store; a cache of --cache-rows with least-recently-used eviction
  lookahead  rows in a store; the oracle reads --lookahead batches ahead and plans every
             fetch and eviction, prefetching in the background (the product)
  fae        FAE: hot rows in this process, cold rows read from the store each batch
  hotline    Hotline: as fae, but each batch's all-hot inputs compute while its cold
             rows are read, then the rest (two micro-batches, one optimizer step)
All modes but hotline end with the same params_sha256 on one process (hotline: the same
maths summed in another order, equal to within float rounding: its summary says "exact":
false and why in "not_exact", as does a run started from a store's tables, --init-from-store).

Hot rows (--hot-budget-mb M, or --hot-rows FILE from `bagpipe profile`): the most
accessed rows that fit M MiB stay in this process for the whole run, and nocache, lru
and lookahead plan only the other rows; still exact. fae and hotline default to FAE's
256 MiB. --fae-schedule split trains the all-hot inputs in batches of their own, as
FAE does: this changes the data order (an approximation).

Approximations (off unless asked for; the run is then marked "exact": false):
--skip-stale (Slipstream: inputs whose hot rows have stopped changing are left out of
training; full, or lookahead with a hot tier), --cache-sync periodic:K (cDLRM: trainers
average their copies of shared rows every K steps). See docs/approximations.md.

Distributed (--trainers N --servers S): N data-parallel trainers (each on 1/N of every
global batch of --batch-size samples), S embedding servers holding the rows and their
optimizer state, and one oracle process, all started here on loopback; the result
matches --mode full within float tolerance. Logs per role go to RUN/logs/. Across
machines start the same roles with torchrun and `bagpipe worker` (docs/distributed.md).

On a GPU (--device cuda): the model and the cache (--mode full: every table) live on the
GPU, the store in host memory or on disk, and rows are copied on side streams while the
steps compute; every cached mode still ends bitwise equal to --mode full on the GPU. A
distributed trainer takes GPU LOCAL_RANK (NCCL between trainers with a GPU each). See
docs/gpu.md.

Settings can come from a TOML file (--config): each key is an option's name with
underscores (--batch-size is batch_size), at the top level or inside the table of its
group below ([data], [arch], [optim], [cache], [hot], [memory], [dist], [approx],
[device], [run]); command-line options override the file.

Examples:
  bagpipe train --data data/tiny --model dlrm --steps 300 --out runs/full
  bagpipe train --data data/tiny --model dlrm --steps 300 --out runs/la \\
      --mode lookahead --cache-rows 20000 --lookahead 8
  bagpipe train --data data/tiny --model dlrm --steps 300 --out runs/auto \\
      --mode lookahead --cache-budget-mb 0.5
  bagpipe train --data data/tiny --model dlrm --steps 300 --out runs/hot \\
      --mode lookahead --cache-rows 5000 --hot-budget-mb 0.05
  bagpipe train --data data/tiny --model dlrm --steps 300 --out runs/fae --mode fae
  bagpipe train --data data/tiny --model dlrm --steps 300 --out runs/dist \\
      --mode lookahead --trainers 2 --servers 2
  bagpipe train --data data/tiny --model dlrm --steps 300 --out runs/skip --skip-stale
  bagpipe train --config run.toml --resume
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from bagpipe.config import add_options
    from bagpipe.config.argtypes import given_once, path
    from bagpipe.config.train import TrainConfig

    p.add_argument(
        "--config",
        type=path,
        action=given_once("one settings file is read; merge them into one (command-line options win over it)"),
        metavar="FILE",
        help="TOML file with settings (command-line options win); its relative paths (data, out, ...) are "
        "relative to the working directory, not to the file's folder",
    )
    add_options(p, TrainConfig)


def run(args: argparse.Namespace) -> int:
    from bagpipe.config import given
    from bagpipe.config.train import TrainConfig, load_config

    settings = given(args, TrainConfig)
    cfg = load_config(args.config, settings)
    check_out_folders(cfg)
    if not cfg.run.resume:  # before the run's lock is written into a user's folder
        from bagpipe.train.resume import refuse_not_a_run

        refuse_not_a_run(cfg.run.out)
    recipe_rate_note(cfg, lr_given="lr" in settings or lr_in_file(args.config))
    check_summary_json(cfg)
    summary_json = cfg.run.summary_json
    from bagpipe.files import standard_fd

    if summary_json is not None and standard_fd(summary_json) == 1:
        # `--summary-json /dev/stdout > s.json`: stdout gets the summary's JSON and nothing
        # else; the run's own lines go to stderr meanwhile
        import contextlib
        import dataclasses
        import json
        import sys
        from pathlib import Path

        from bagpipe.jsonout import json_text

        quiet = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, summary_json=None))
        with contextlib.redirect_stdout(sys.stderr):
            rc = _run(quiet)
        summary = Path(cfg.run.out) / "summary.json"
        if rc in (0, 1) and summary.is_file():  # 1: the final checkpoint was lost, the summary is right
            print(json_text(json.loads(summary.read_text()), indent=2), flush=True)
        return rc
    return _run(cfg)


def _run(cfg) -> int:
    from bagpipe.train.loop import train

    one = None
    if cfg.distributed:
        from bagpipe.distributed.launch import launch

        launch(cfg)
    else:
        one = train_until_stopped(cfg, train)
        if isinstance(one, int):
            return one  # stopped: said in one line
        assert one is not None  # one process reports
        print(summary_line(one))  # the launcher already echoed trainer 0's line
    print(f"run directory: {cfg.run.out}")
    lost = None if one is None else final_checkpoint_lost(one, cfg.run.out)
    if lost:  # the run's last word: its folder cannot continue from its last step
        import sys

        print(f"bagpipe train: error: {lost}", file=sys.stderr)
        return 1
    return 0


def train_until_stopped(cfg, train):
    """``train(cfg)``, where a stop signal (SIGTERM, SIGHUP from ``kill``, ``timeout``, a
    scheduler) unwinds the run as Ctrl-C does (:func:`bagpipe.lifeline.stop_cleanly`: the
    store closed, an unfinished checkpoint removed, the run's locks released), then says in
    one line where the run can continue from; returns the exit code then (128 + the
    signal, 130 for Ctrl-C), else what ``train`` returned."""
    import sys

    from bagpipe.lifeline import restore, stop_cleanly

    handlers = stop_cleanly()
    try:
        return train(cfg)
    except KeyboardInterrupt as e:
        from bagpipe.checkpoint.folder import stopped_by, where_to_continue

        signum = getattr(e, "signum", None)
        print(f"bagpipe train: {stopped_by(e)}; {where_to_continue(cfg.run.out)}", file=sys.stderr)
        return 128 + signum if signum is not None else 130
    finally:
        restore(handlers)


def final_checkpoint_lost(summary: dict, out: str) -> str | None:
    """One line when the run's final checkpoint could not be written (a full disk): which
    step is the last intact checkpoint and how to get the lost steps back; None otherwise.
    The run's summary and digest are still right (its rows are in its tables), but its
    folder cannot continue from its last step, so the command exits 1 (docs/runs.md)."""
    ck = summary.get("checkpoints") or {}
    steps = summary.get("steps")
    failed = [h for h in ck.get("history") or [] if h.get("step") == steps and h.get("failed")]
    if not failed:
        return None
    last = ck.get("last_step")
    kept = (
        f"the last intact checkpoint is step {last} in {out}/checkpoints: free some space, then train again "
        f"with --resume (it retrains steps {last + 1}..{steps})"
        if last
        else f"{out} has no checkpoint: free some space and train it again"
    )
    return f"the final checkpoint (step {steps}) was not written ({failed[-1]['failed']}); {kept}"


def lr_in_file(file) -> bool:
    """Whether the TOML file ``file`` (None: no file) gives the learning rate."""
    if not file:
        return False
    from bagpipe.config.options import flatten, read_toml
    from bagpipe.config.train import TrainConfig

    raw = read_toml(file)
    if set(raw) == {"train"} and isinstance(raw["train"], dict):
        raw = raw["train"]
    return "lr" in flatten(TrainConfig, raw, str(file))


def recipe_rate_note(cfg, *, lr_given: bool) -> None:
    """One line on stderr when the run trains at the default --lr because its recipe's
    rate, tuned for another optimizer, was dropped for the --optimizer given
    (:func:`bagpipe.config.train.with_recipe_settings`)."""
    import sys

    from bagpipe.models.config import RECIPE_OPTIMIZER

    known = RECIPE_OPTIMIZER.get(cfg.arch.recipe)
    o = cfg.optim
    if lr_given or not known or o.optimizer == known["optimizer"]:
        return
    usual = "; adam usually wants about 1e-3" if "adam" in o.optimizer else ""
    print(
        f"note: --optimizer {o.optimizer}: the {cfg.arch.recipe} recipe's rate ({known['optimizer']} "
        f"{known['lr']:g}) does not apply, so the run trains at the default --lr {o.lr:g} (tuned for adagrad)"
        f"{usual}: give --lr",
        file=sys.stderr,
        flush=True,
    )


def check_out_folders(cfg) -> None:
    """Refuse, in one line and before anything is written, a run folder (``--out``) or a
    store folder (``--store-dir``) that is ``-`` (train writes a folder, not standard
    output), is the data set, lies inside it, or is or lies anywhere inside another data
    set or an export (``bagpipe export``'s model.json; :func:`bagpipe.files.enclosing_output`):
    the run's files (config.json, checkpoints, a disk store) would be mixed with the shards
    or the export's files, and ``preprocess --overwrite`` (``export --overwrite``) would
    refuse to replace it."""
    import os
    from pathlib import Path

    from bagpipe.errors import ConfigError
    from bagpipe.files import enclosing_output, refuse_inside_output, refuse_unnamable
    from bagpipe.output_dir import inside

    for flag, given in (("--out", cfg.run.out), ("--store-dir", cfg.cache.store_dir)):
        if not given:
            continue
        if str(given) == "-":  # predict --out - is standard output; a run or a store is a folder
            raise ConfigError(
                "--out -: train writes a run folder (config.json, checkpoints/, summary.json), not standard output; "
                "give a folder, e.g. --out runs/a"
                if flag == "--out"
                else "--store-dir -: the disk store is a folder, not standard output; give a folder or leave it out"
            )
        refuse_unnamable(given, flag)
        if inside(given, cfg.data.data):
            what = "is" if os.path.realpath(given) == os.path.realpath(cfg.data.data) else "lies inside"
            raise ConfigError(
                f"{flag} {given} {what} --data {cfg.data.data}: the run would write its files among the "
                f"data set's; choose another {flag}"
            )
        if (Path(given) / "meta.json").is_file() and (Path(given) / "train").is_dir():
            raise ConfigError(
                f"{flag} {given} holds a data set (meta.json and train/): the run would write its files among "
                f"its shards; choose another {flag}"
            )
        if (Path(given) / "model.json").is_file():
            raise ConfigError(
                f"{flag} {given} holds an export (model.json): the run would write its files among the export's; "
                f"choose another {flag}"
            )
        found = enclosing_output(given)
        own_words = found is not None and (found[1] == Path(os.path.realpath(given)) or found[0] == "checkpoint")
        if not (flag == "--store-dir" and own_words):  # check_store_dir says those in its own words
            refuse_inside_output(given, flag, "the run's files")  # a store's own folder is the --store-dir itself
    if cfg.cache.store_dir:
        check_store_dir(cfg.cache.store_dir, cfg.run.out)
    if cfg.run.tensorboard:
        check_tensorboard_dir(cfg.run.tensorboard, cfg.run.out, cfg.cache.store_dir, cfg.data.data, cfg.run.resume)


#: The folders of a run whose files are all its own: a store there would mix with them.
RUN_OWN_FOLDERS = ("checkpoints", "logs", "events")


def check_store_dir(given: str, out: str) -> None:
    """Refuse, in one line, a ``--store-dir`` that is this run's folder or lies in its
    checkpoints (the run's lock, config.json and checkpoint parts would mix with the
    store's files, and the run's own lock answered as "another run"), or that is
    another run's folder or lies in its checkpoints, logs or events. A store in another
    run's RUN/store, or in a folder of the user's own inside a run folder, is allowed."""
    import os
    from pathlib import Path

    from bagpipe.errors import ConfigError
    from bagpipe.files import runs_above
    from bagpipe.output_dir import inside

    flag = f"--store-dir {given}"
    if os.path.realpath(out) == os.path.realpath(given):
        raise ConfigError(
            f"{flag} is this run's --out: the store's files would be written among the run's (config.json, "
            f"checkpoints/); leave --store-dir out (the run keeps its store in {Path(out) / 'store'}) or choose "
            "a folder of its own"
        )
    for sub in RUN_OWN_FOLDERS:
        if inside(given, Path(out) / sub):
            raise ConfigError(
                f"{flag} lies inside this run's {Path(out) / sub}, which holds only the run's own files; "
                f"leave --store-dir out (the run keeps its store in {Path(out) / 'store'}) or choose a folder outside it"
            )
    for folder, part in runs_above(given):
        if part is None:
            raise ConfigError(
                f"{flag} is the run folder {folder} (config.json, checkpoints/): the store's files and lock would "
                "be written among that run's; choose a folder of its own"
            )
        if part in RUN_OWN_FOLDERS:
            raise ConfigError(
                f"{flag} lies inside {folder / part}, which holds only the run {folder}'s own files; "
                "choose a folder of its own"
            )


TENSORBOARD_EVENTS = "events.out.tfevents."
"""The name TensorBoard's event files start with: what a folder of TensorBoard logs holds."""


def check_tensorboard_dir(given: str, out: str, store_dir: str | None, data: str, resume: bool = False) -> None:
    """Refuse, in one line and before anything is written, a ``--tensorboard`` folder that
    is a file or lies under one, that is or lies inside the data set, another data set or
    an export, that is this run's --out, its store or lies in its checkpoints/logs, that is
    another run's folder or lies in its own folders, or that holds anything but TensorBoard
    event files (a folder of the user's): TensorBoard's writer made its folders anywhere
    and put its event file among any files (newcomer round 17; a file was a traceback
    after the run had started). A folder of TensorBoard logs, a new folder and one of the
    user's own inside a run folder (RUN/tb) are used. A folder that already holds event
    files is taken only by a resumed run (its own): TensorBoard shows the event files of one
    folder as one run, so a second run's curves were drawn into the first's (round 18); a
    folder inside a disk store, and a dangling symbolic link, are refused too."""
    import os
    from pathlib import Path

    from bagpipe.errors import ConfigError
    from bagpipe.files import RUN_FILES, refuse_inside_output, refuse_unnamable, runs_above
    from bagpipe.output_dir import inside

    flag = f"--tensorboard {given}"
    example = f"e.g. --tensorboard {Path(out) / 'tb'}"
    refuse_unnamable(given, "--tensorboard")
    above = next((p for p in (Path(given), *Path(given).parents) if os.path.lexists(p)), None)
    if above is not None and Path(above).is_symlink() and not Path(above).exists():
        raise ConfigError(
            f"{flag}: {above} is a symbolic link to {os.readlink(above)}, which does not exist; create that folder "
            f"or give another --tensorboard ({example})"
        )
    if above is not None and not Path(above).is_dir():
        where = "is a file" if Path(above) == Path(given) else f"lies under the file {above}"
        raise ConfigError(f"{flag} {where}: TensorBoard writes a folder of event files; give a folder ({example})")

    def relation(folder: str) -> str:
        return "is" if os.path.realpath(given) == os.path.realpath(folder) else "lies inside"

    if inside(given, data):
        raise ConfigError(
            f"{flag} {relation(data)} --data {data}: the event files would be mixed with the data set's; {example}"
        )
    refuse_inside_output(given, "--tensorboard", "the event files")
    own = [(f"this run's {sub}/", str(Path(out) / sub)) for sub in ("checkpoints", "logs", "store")]
    own += [("this run's --store-dir", store_dir)] if store_dir else []
    if os.path.realpath(given) == os.path.realpath(out):  # a folder of its own inside the run (RUN/tb) is fine
        raise ConfigError(f"{flag} is this run's --out: the event files would be mixed with the run's files; {example}")
    for what, mine in own:
        if inside(given, mine):
            raise ConfigError(
                f"{flag} {relation(mine)} {what} ({mine}): the event files would be mixed with its files; {example}"
            )
    real = Path(os.path.realpath(given))
    from bagpipe.store import holds_store

    store = next((f for f in (real, *real.parents) if holds_store(f)), None)
    if store is not None:
        raise ConfigError(
            f"{flag} {relation(str(store))} the disk store {store}: the event files would be mixed with its files, "
            f"and the store could not be opened again; {example}"
        )
    for run, part in runs_above(real):
        if part is None or part in RUN_FILES:
            where = "is the run folder" if part is None else f"lies inside {run / part} of the run"
            raise ConfigError(
                f"{flag} {where} {run if part is None else ''}".rstrip()
                + f": the event files would be mixed with that run's files; {example}"
            )
    if real.is_dir():
        events = [p.name for p in real.iterdir() if p.name.startswith(TENSORBOARD_EVENTS)]
        if events and not resume:
            raise ConfigError(
                f"{flag} already holds the event files of another run ({events[0]}): TensorBoard shows one folder's "
                f"event files as one run, so the curves of both would be drawn as one; give each run a folder of "
                f"its own (e.g. --tensorboard {Path(given) / Path(out).name})"
            )

        def runs_folder(p: Path) -> bool:  # a TensorBoard folder of several runs: one subfolder each
            return p.is_dir() and all(q.name.startswith(TENSORBOARD_EVENTS) for q in p.iterdir())

        foreign = sorted(
            p.name for p in real.iterdir() if not p.name.startswith(TENSORBOARD_EVENTS) and not runs_folder(p)
        )
        if foreign:
            shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
            raise ConfigError(
                f"{flag} holds files that are not TensorBoard event files ({shown}): the run's event file would be "
                f"mixed with them; give a new or empty folder, or one of TensorBoard logs ({example})"
            )


def check_summary_json(cfg) -> None:
    """Refuse, in one line and before anything is trained, a ``--summary-json PATH`` that
    the run could not write or that would replace a file that is not this run's, or that
    lies inside a data set (``--data`` too) or an export: a folder,
    a path under a file, a path inside the run folder other than RUN/summary.json (one of
    the run's own files, config.json or a checkpoint's, which may not exist yet), or an
    existing file -- another run's summary, or anything else -- unless it is this run's
    own (RUN/summary.json, or the path a resumed run's earlier start wrote its summary
    to). A device (``/dev/stdout``) is written directly."""
    import json
    import os
    from pathlib import Path

    from bagpipe.errors import ConfigError
    from bagpipe.files import check_can_write_in, refuse_inside_output, refuse_unnamable
    from bagpipe.output_dir import inside
    from bagpipe.train.resume import elastic_restart

    given = cfg.run.summary_json
    if not given:
        return
    path = Path(given)
    flag = f"--summary-json {given}"
    refuse_unnamable(given, "--summary-json")
    if path.is_dir():
        raise ConfigError(f"{flag}: is a directory; give the file to write (e.g. {path / 'summary.json'})")
    refuse_inside_output(given, "--summary-json", "the summary")  # --data too: a data set
    run = Path(cfg.run.out)
    own = os.path.realpath(run / "summary.json")
    if inside(path, run) and os.path.realpath(path) != own:
        raise ConfigError(
            f"{flag}: lies inside --out {run}, among the files the run writes (config.json, metrics.jsonl, "
            f"checkpoints/), and would replace one: leave --summary-json out (the run writes {run / 'summary.json'}) "
            "or choose a path outside --out"
        )
    above = next((p for p in path.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise ConfigError(f"{flag}: {above} is a file, not a folder; choose another path")
    if not path.exists() and not path.is_symlink():
        if above is not None:  # the folders below it are made when the summary is written
            check_can_write_in(above, flag)
        return
    from bagpipe.files import is_standard_stream

    if not path.is_file() or is_standard_stream(path):
        return  # a device, a pipe, this process's stdout (`> file`): written directly, nothing replaced
    real = os.path.realpath(path)
    if real == own:
        return  # the run's own summary
    if cfg.run.resume or elastic_restart():
        try:
            earlier = json.loads((run / "config.json").read_text())["train"]["run"]["summary_json"]
        except (OSError, ValueError, KeyError, TypeError):
            earlier = None
        if earlier and os.path.realpath(earlier) == real:
            return  # written by this run's earlier start
    raise ConfigError(
        f"{flag}: the file exists and is not this run's summary (another run's?); it is not replaced: "
        "choose a new path, or move the file away first"
    )


def summary_line(s: dict) -> str:
    """The one line a finished run prints (from summary.json too, where a figure that was
    not finite is null: n/a)."""

    from bagpipe.train.evaluate import figure

    def fig(key: str, fmt: str = ".4f") -> str:
        return figure(s.get(key), fmt)

    digest = "not computed (--no-digest)" if s["params_sha256"] is None else s["params_sha256"][:16] + "…"
    return (
        f"{s['mode']}: {s['steps']} steps, {fig('samples_per_s', ',.0f')} samples/s, "
        f"train logloss {fig('train_logloss')}, eval logloss {fig('eval_logloss')}, eval AUC {fig('eval_auc')}, "
        f"NE {fig('eval_ne')}, calibration {fig('eval_calibration', '.3f')}, "
        f"peak RSS {s['peak_rss_mb']:.0f} MiB, params_sha256 {digest}"
        + ("" if s.get("exact", True) else f"; not exact: {'; '.join(s.get('not_exact') or ['see summary.json'])}")
    )
