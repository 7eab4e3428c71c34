"""TensorBoard scalars beside metrics.jsonl (``--tensorboard DIR``), when the package is installed.

Every record the loop writes to metrics.jsonl also goes to TensorBoard, one scalar per
figure at its step: ``train/loss``, ``train/samples_per_s``, ``train/lr``,
``train/embedding_lr`` and ``eval/logloss``, ``eval/auc``, ``eval/ne``,
``eval/calibration``, ``eval/accuracy``. TensorBoard is an optional extra
(``pip install 'bagpipe[tensorboard]'``); without it ``--tensorboard`` is a one-line
error before training starts.
"""

from __future__ import annotations

import math

from bagpipe.errors import ConfigError


def tag(key: str) -> str:
    """The TensorBoard tag of a metrics.jsonl key (``eval_auc`` -> ``eval/auc``, ``loss`` -> ``train/loss``)."""
    return "eval/" + key[len("eval_") :] if key.startswith("eval_") else "train/" + key


class TensorBoardLog:
    """Writes metrics.jsonl-style records as TensorBoard scalars into ``directory``.

    ``since``: the step a resumed run continues from; the scalars an earlier run of it wrote
    past that step (after its last checkpoint, before it stopped) are purged, as
    metrics.jsonl's records are (newcomer round 21: TensorBoard drew each such step twice,
    with two samples/s)."""

    def __init__(self, directory: str, since: int = 0):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError(
                "--tensorboard needs the tensorboard package: pip install 'bagpipe[tensorboard]'"
            ) from None
        try:
            self.writer = SummaryWriter(log_dir=directory, purge_step=since + 1 if since > 0 else None)
        except OSError as e:  # checked before the run (commands/train.py): what is left, e.g. a read-only disk
            raise ConfigError(f"--tensorboard {directory}: cannot write there ({e.strerror or e})") from None

    def write(self, step: int, **record) -> None:
        for key, value in record.items():
            if (
                key == "eval_samples"
                or isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
            ):
                continue
            self.writer.add_scalar(tag(key), value, step)

    def close(self) -> None:
        self.writer.close()


class Logs:
    """Several logs written as one (metrics.jsonl and TensorBoard)."""

    def __init__(self, *logs):
        self.logs = logs

    def write(self, **record) -> None:
        for log in self.logs:
            log.write(**record)

    def close(self) -> None:
        for log in self.logs:
            log.close()


def with_tensorboard(log, directory: str | None, since: int = 0):
    """``log`` alone, or with a :class:`TensorBoardLog` into ``directory`` beside it (a run
    continued from step ``since``)."""
    return log if directory is None else Logs(log, TensorBoardLog(directory, since))
