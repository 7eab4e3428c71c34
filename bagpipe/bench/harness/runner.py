"""Shared plumbing of the benchmark scenarios: training runs as separate processes.

Every measured configuration is one ``python -m bagpipe train ...`` process (so peak
memory, thread pools and page cache state are per run) whose ``--summary-json`` is read
back. :func:`train_args` is the one place its options are built (from a scenario's
:class:`~bagpipe.bench.harness.settings.TrainBench` settings plus the configuration's own);
:func:`launch` runs it. :func:`make_data` makes (or reuses) the generated dataset a
scenario runs on; :func:`prepare_checked` makes it only where the scenario accepts its
size, leaving OUT as it was where it refuses.
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from bagpipe.config.options import flag

if TYPE_CHECKING:
    from bagpipe.data.schema import DatasetMeta

T = TypeVar("T")


class TrainFailed(RuntimeError):
    """A ``bagpipe train`` process exited non-zero; ``stderr`` holds its error output."""

    def __init__(self, label: str, returncode: int, stderr: str):
        self.label = label
        self.returncode = returncode
        self.stderr = stderr
        super().__init__(f"{label} failed:\n{stderr[-3000:]}")

    @property
    def capacity_error(self) -> bool:
        """The cache could not hold one batch's unique rows (bagpipe.errors.CapacityError)."""
        return "cannot hold" in self.stderr


def train_command(args: list[str]) -> list[str]:
    """The argv of ``bagpipe train ARGS`` run with this interpreter."""
    return [sys.executable, "-m", "bagpipe", "train", *[str(a) for a in args]]


def run_train(args: list[str], summary: Path, label: str, timeout: float | None = None, preexec_fn=None) -> dict:
    """Run ``bagpipe train ARGS --summary-json SUMMARY`` in its own process.

    Returns the summary with ``wall_s`` (the process's wall time, start-up included) and
    ``child_io`` (the process's bytes read from block devices, from ``getrusage``'s
    ``ru_inblock``, and its major page faults) added; raises :class:`TrainFailed` if the
    process fails. ``preexec_fn`` runs in the child before ``exec`` (e.g. entering a
    memory group, :mod:`bagpipe.testbed.memlimit`).
    """
    cmd = train_command(args) + ["--summary-json", str(summary)]
    t0 = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, preexec_fn=preexec_fn)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        raise TrainFailed(label, -1, f"timed out after {timeout:.0f} s\n{err}") from None
    if proc.returncode != 0:
        raise TrainFailed(label, proc.returncode, proc.stderr)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    s = json.loads(Path(summary).read_text())
    s["wall_s"] = time.perf_counter() - t0
    s["child_io"] = {
        "read_bytes": (after.ru_inblock - before.ru_inblock) * 512,
        "major_faults": after.ru_majflt - before.ru_majflt,
    }
    return s


def train_args(b, data: Path, run_dir: Path, *, digest: bool = False, **settings) -> list[str]:
    """The options of one ``bagpipe train`` run of scenario settings ``b`` (a TrainBench).

    The shared settings (data, run directory, model, recipe, batch, optimizer, lr,
    steps, warm-up, eval samples, threads, device), then ``settings``: ``bagpipe train``'s options
    in Python spelling (``cache_rows=..., store_dir=...``); one given here replaces the
    shared value, None leaves the option out. Last the benchmark switches: no progress
    bar, no final checkpoint unless ``final_checkpoint=True`` is among the settings, no
    params digest unless ``digest``.
    """
    final = bool(settings.pop("final_checkpoint", False))
    opts = {
        "data": data,
        "out": run_dir,
        "model": b.model,
        "recipe": b.recipe,
        "batch_size": b.batch_size,
        "optimizer": b.optimizer,
        "lr": b.lr,
        "steps": b.steps,
        "warmup_steps": getattr(b, "warmup", None),
        "eval_samples": b.eval_samples,
        "threads": b.threads or None,
        "device": getattr(b, "device", None),
        **settings,
    }
    args = []
    for key, value in opts.items():
        if isinstance(value, bool):  # a switch: --name / --no-name
            args.append(flag(key) if value else "--no-" + flag(key)[2:])
        elif value is not None:
            args += [flag(key), str(value)]
    ends = ["--final-checkpoint" if final else "--no-final-checkpoint"] + ([] if digest else ["--no-digest"])
    return args + ["--no-progress", *ends]


def launch(b, data: Path, run_dir: Path, label: str, preexec_fn=None, **settings) -> dict:
    """Run ``bagpipe train`` with :func:`train_args` (bounded by ``b.run_timeout_s``); its summary."""
    return run_train(
        train_args(b, data, run_dir, **settings),
        run_dir / "summary.json",
        label,
        timeout=b.run_timeout_s or None,
        preexec_fn=preexec_fn,
    )


def data_samples(batch_size: int, steps: int) -> int:
    """Samples to generate so the train split (90%) holds ``steps`` + 2 batches."""
    return int(batch_size * (steps + 2) / 0.9) + 1


def make_data(b, data: Path, progress: bool = True) -> bool:
    """The generated data set of a training scenario (seed 1, sized by :func:`data_samples`;
    the scenario's ``zipf_exponent`` when it has one)."""
    samples = data_samples(b.batch_size, b.steps)
    zipf = getattr(b, "zipf_exponent", None)
    return ensure_synth(data, b.profile, samples, b.scale, seed=1, progress=progress, zipf_exponent=zipf)


def prepare_checked(
    b, check: Callable[[Path, DatasetMeta], T], progress: bool = True
) -> tuple[Path, Path, DatasetMeta, T]:
    """:func:`prepare` for a scenario that refuses some data sizes: ``check(data, meta)``
    raises to refuse (a size known only from the data itself, such as a batch's unique
    rows) and its value comes back last.

    A data set this call generates is written to a staging folder beside OUT/data
    (:class:`bagpipe.output_dir.OutputDir`), checked there and swapped in only when
    ``check`` passes; a refusal removes it and the folders this call made (OUT itself
    where there was none), so OUT -- a data set of another size already in it included --
    is left as it was. A data set already of the size asked for is checked where it is.
    """
    from bagpipe.data.schema import META_FILE, DatasetMeta
    from bagpipe.data.synthetic import SynthConfig, generate
    from bagpipe.output_dir import OutputDir

    out = b.out_dir
    data = out / "data"
    samples = data_samples(b.batch_size, b.steps)
    zipf = getattr(b, "zipf_exponent", None)
    if has_synth(data, b.profile, samples, b.scale, seed=1, zipf_exponent=zipf):
        meta = DatasetMeta.load(data)
        return out, data, meta, check(data, meta)
    output = OutputDir(data, "dataset", META_FILE, overwrite=True)
    with output as staging:  # leaving it without commit() removes the staging folder and the folders it made
        skew = SynthConfig.zipf_exponent if zipf is None else zipf
        cfg = SynthConfig(profile=b.profile, samples=samples, scale=b.scale, seed=1, zipf_exponent=skew)
        generate(cfg, staging, progress=progress)  # into the (empty) staging folder
        found = check(staging, DatasetMeta.load(staging))
        output.commit()
    for template in ("store-template", "store-template-frequency"):  # rows of another data set
        shutil.rmtree(out / template, ignore_errors=True)
    return out, data, DatasetMeta.load(data), found


def prepare(b, progress: bool = True):
    """A training scenario's output folder, its generated data set OUT/data (made, or
    reused when it has the size asked for) and that data's :class:`DatasetMeta`. A disk
    table file (OUT/store-template) written for other data is removed."""
    from bagpipe.data.schema import DatasetMeta

    out = b.out_dir
    out.mkdir(parents=True, exist_ok=True)
    data = out / "data"
    if make_data(b, data, progress):
        for template in ("store-template", "store-template-frequency"):  # rows of another data set
            shutil.rmtree(out / template, ignore_errors=True)
    return out, data, DatasetMeta.load(data)


def widest_batch(data: Path, batch_size: int, steps: int) -> int:
    """The most unique rows one of the first ``steps`` training batches has (the stream
    ``bagpipe train`` reads): the smallest cache that can run."""
    import numpy as np

    from bagpipe.data.shards import Dataset
    from bagpipe.data.stream import BatchStream

    stream = BatchStream(Dataset(data), "train", batch_size, seed=0)
    return max(len(np.unique(stream.batch(i).rows.numpy())) for i in range(steps))


def ensure_synth(
    data: Path,
    profile: str,
    samples: int,
    scale: float,
    seed: int,
    progress: bool = True,
    zipf_exponent: float | None = None,
) -> bool:
    """Generate ``profile`` data into ``data`` unless a dataset of that size, scale and
    skew (``zipf_exponent``: None, the generator's default) is there; True when it was
    (re)generated."""
    from bagpipe.data.synthetic import SynthConfig, generate

    zipf = SynthConfig.zipf_exponent if zipf_exponent is None else zipf_exponent
    if has_synth(data, profile, samples, scale, seed, zipf):
        return False
    generate(
        SynthConfig(profile=profile, samples=samples, scale=scale, seed=seed, zipf_exponent=zipf),
        str(data),
        overwrite=True,
        progress=progress,
    )
    return True


def has_synth(
    data: Path, profile: str, samples: int, scale: float, seed: int, zipf_exponent: float | None = None
) -> bool:
    """Whether ``data`` holds the generated data set of that profile, size, scale, seed
    and skew (``zipf_exponent``: None, the generator's default)."""
    from bagpipe.data.synthetic import SynthConfig

    zipf = SynthConfig.zipf_exponent if zipf_exponent is None else zipf_exponent
    meta_file = Path(data) / "meta.json"
    if not meta_file.exists():
        return False
    src = json.loads(meta_file.read_text()).get("source", {})
    have = (src.get("samples"), src.get("scale"), src.get("profile", profile), src.get("seed", seed))
    return have == (samples, scale, profile, seed) and src.get("zipf_exponent", SynthConfig.zipf_exponent) == zipf
