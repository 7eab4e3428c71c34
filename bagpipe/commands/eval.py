"""``bagpipe eval``."""

from __future__ import annotations

import argparse
from pathlib import Path

DESCRIPTION = """\
Evaluate a finished (or checkpointed) run on a dataset's eval split: log loss, ROC AUC,
normalized entropy (log loss / entropy of the observed CTR), calibration (mean predicted
CTR / observed CTR) and accuracy (threshold 0.5).

The run's latest checkpoint holds every row written since the start (each other row is
its initial value, made again from the run's seed), whichever mode or store trained it, so
a run trained in any mode evaluates the same way.

Example:
  bagpipe eval --run runs/a --data data/tiny
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from bagpipe.config.argtypes import count, path

    p.add_argument("--run", required=True, type=path, help="run directory written by bagpipe train")
    p.add_argument(
        "--data", required=True, type=path, help="dataset directory with an eval split (refused without one)"
    )
    p.add_argument("--batch-size", type=count(1), default=4096, help="eval batch size (default 4096)")
    p.add_argument(
        "--max-samples",
        type=count(0),
        default=0,
        metavar="N",
        help="evaluate at most the first N samples of the eval split (0, the default: all of them, "
        "as train's --eval-samples 0)",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args: argparse.Namespace) -> int:
    import sys

    import torch

    from bagpipe.checkpoint import latest
    from bagpipe.data.schema import read_json
    from bagpipe.data.shards import Dataset
    from bagpipe.errors import CheckpointError, ConfigError
    from bagpipe.models import ModelConfig, build_model
    from bagpipe.train.evaluate import eval_line, evaluate

    run_dir = Path(args.run)
    cfg_path = run_dir / "config.json"
    if not cfg_path.exists():
        raise ConfigError(f"{run_dir}: not a bagpipe run directory (no config.json)")
    conf = read_json(cfg_path)
    ckpt = latest(run_dir)
    if ckpt is None:
        raise CheckpointError(f"{run_dir}: the run has no checkpoint to evaluate")
    dataset = Dataset(args.data)
    if not dataset.has_split("eval"):
        splits = ", ".join(f"{k} {v.num_samples:,}" for k, v in dataset.meta.splits.items()) or "none"
        raise ConfigError(
            f"{args.data} has no eval split (its splits: {splits}), so there is nothing to evaluate: give --data "
            "a data set that has one, e.g. made with the run's vocabulary by `bagpipe preprocess FORMAT --input "
            "EVAL_FILE --split 0 --vocab-from DATA --out DATA_EVAL` (every line to eval)"
        )
    trained = conf.get("dataset", {}).get("table_sizes")
    have = dataset.meta.table_sizes
    if trained is not None and trained != have:
        diff = next(
            i
            for i in range(max(len(trained), len(have)))
            if i >= len(trained) or i >= len(have) or trained[i] != have[i]
        )
        what = (
            f"table {diff} ({dataset.meta.features[diff].name}) has {have[diff]:,} rows, the run's had {trained[diff]:,}"
            if diff < min(len(trained), len(have))
            else f"{len(have)} tables, the run had {len(trained)}"
        )
        raise ConfigError(f"{args.data} does not match the tables {run_dir} was trained with: {what}")
    if dataset.meta.num_dense != conf.get("dataset", {}).get("num_dense", dataset.meta.num_dense):
        raise ConfigError(
            f"{args.data} has {dataset.meta.num_dense} dense features, the run was trained with {conf['dataset']['num_dense']}"
        )
    was = conf.get("dataset", {}).get("fingerprint")
    if was and was != dataset.fingerprint():  # same tables, other data (a later day's log): legitimate, said
        print(
            f"note: {args.data} is not the data set {run_dir} was trained on (fingerprint {was[:12]}, this one's "
            f"{dataset.fingerprint()[:12]}); its tables match, so it is evaluated -- with another vocabulary its "
            "ids may stand for other values than the run learned",
            file=sys.stderr,
        )
    table = ckpt.reader()
    if table.num_rows != dataset.meta.total_rows:
        raise ConfigError(
            f"{args.data} has {dataset.meta.total_rows} embedding rows but the run was trained with {table.num_rows}"
        )
    try:
        mcfg = ModelConfig(**conf["model"])
        model = build_model(mcfg, dataset.meta.num_dense, dataset.meta.num_features)
        model.load_state_dict(ckpt.dense["model"])
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"{args.data} does not fit the model {run_dir} trained ({first})") from None

    def lookup(rows: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(table.values(rows.numpy())[0])

    res = evaluate(model, lookup, dataset, args.batch_size, args.max_samples)
    res["step"] = ckpt.step
    note = trained_further(run_dir, ckpt.step, "these figures are")
    if note:
        print(note, file=sys.stderr)
    if args.json:
        from bagpipe.jsonout import json_text

        print(json_text(res))
    else:
        print(f"step {ckpt.step}: {eval_line(res)}")
    return 0


def trained_further(run_dir: Path, step: int, what: str) -> str | None:
    """A note when the run's summary.json says it trained past ``step``, its latest
    checkpoint (``--no-final-checkpoint``, or a final checkpoint not written): ``what``
    (e.g. "these figures are") is then step ``step``'s, not the run's end. None otherwise,
    and where the summary is missing or unreadable (the checkpoint's step is said anyway)."""
    import json

    try:
        steps = json.loads((run_dir / "summary.json").read_text(encoding="utf-8")).get("steps")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(steps, int) or steps <= step:
        return None
    try:
        conf = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
        why = " (--no-final-checkpoint)" if conf["train"]["run"]["final_checkpoint"] is False else ""
    except (OSError, ValueError, KeyError, TypeError):
        why = ""
    return (
        f"note: {run_dir} trained to step {steps} (summary.json); its latest checkpoint is step {step}{why}: "
        f"{what} step {step}'s"
    )
