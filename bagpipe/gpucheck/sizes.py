"""How big each step of the gpu-check is, and how long it may take.

``gpu`` is fitted to one H100-class GPU: the limits add up to under 8 minutes with the
start-up of every child process included. ``tiny`` is the dry run on a CPU
(``--device cpu-async``) that the test suite runs in well under a minute: the same
steps, the same files, sizes that only prove the script's logic. No size here is a
measurement; the figures come from the runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Size:
    """The sizes of one gpu-check (see the module).

    Attributes:
        name: ``gpu`` or ``tiny``.
        limits_s: seconds each step may run (its child process, start-up included),
            by step name; a step past its limit is stopped and the next one starts.
        tests: what pytest collects for the ``gpu``-marked tests: the module that holds
            them (tests/README.md), not the whole suite, whose other modules import
            packages a bare GPU machine may lack (psutil).
        tests_last: the tests (a ``pytest -k`` expression) run after all the others: the
            long matrix, so a step stopped at its limit has run every other gpu test.
        samples, steps, batch_size: the ``tiny``-profile data set and the runs of the
            exactness and data-parallel steps.
        cache_rows, lookahead, hot_budget_mb: the cached runs of those steps.
        bench_batches: the batch sizes ``bagpipe bench modes`` runs at, one after the other.
        bench_args: its other options.
        beyond_scale, beyond_samples, beyond_steps, beyond_batch: the ``criteo-kaggle``
            data set (cardinality factor, samples) and the run larger than its budget.
        beyond_recipe: that run's model recipe (D: kaggle 16, debug 8).
        beyond_budget_mb: its ``--device-memory-budget-mb`` (below its full tables).
    """

    name: str
    limits_s: dict[str, float] = field(default_factory=dict)
    tests: tuple[str, ...] = ("tests/gpu/test_gpu.py",)
    tests_last: str = "test_every_cached_mode_on_cuda_equals_full_on_cuda"
    samples: int = 24_000
    steps: int = 60  # test_gpu.py's settings, under which docs/gpu.md states the CPU tolerance
    batch_size: int = 128
    cache_rows: int = 2000
    lookahead: int = 4
    hot_budget_mb: float = 0.05
    bench_batches: tuple[int, ...] = (2048, 16384)
    bench_args: tuple[str, ...] = ()
    beyond_scale: float = 1.0
    beyond_samples: int = 700_000
    beyond_steps: int = 150
    beyond_batch: int = 4096
    beyond_recipe: str = "kaggle"
    beyond_budget_mb: float = 1024.0

    @property
    def total_s(self) -> float:
        return sum(self.limits_s.values())


SIZES = {
    # 33.8M rows x (16 + 1) x 4 B = 2.3 GB of tables and Adagrad state: "larger than the
    # GPU" at a 1 GiB budget; the benchmark is docs/gpu.md's table (Criteo Kaggle at full
    # cardinality, DLRM Kaggle recipe, 5% cache, Adagrad, memory store, batch 2048 then 16384)
    "gpu": Size(
        name="gpu",
        # measured on an H200 (2026-11-27): tests 74 s + 64 matrix runs ~60 s (125 s stopped
        # the first check 38 short), exactness 15-17 s, bench 129 s, beyond 15 s, data-parallel 22-25 s
        limits_s={"tests": 175, "exactness": 35, "bench": 160, "beyond": 30, "data-parallel": 35},
        bench_args=tuple(
            "--stores memory --scale 1 --steps 50 --warmup 10 --reps 1 --eval-samples 4096 --lookahead 20".split()
        ),
    ),
    "tiny": Size(
        name="tiny",
        limits_s={"tests": 60, "exactness": 60, "bench": 60, "beyond": 60, "data-parallel": 60},
        samples=3000,
        steps=12,
        batch_size=64,
        cache_rows=600,
        lookahead=2,
        hot_budget_mb=0.02,
        bench_batches=(64,),  # one tiny batch runs the loop; the gpu size runs two (14.5 -> ~7 s of the dry run)
        bench_args=tuple(
            "--profile tiny --scale 1 --recipe debug --modes full,lookahead --stores memory --steps 4 --warmup 1 "
            "--reps 1 --eval-samples 128 --lookahead 2".split()
        ),
        beyond_scale=0.01,
        beyond_samples=2000,
        beyond_steps=8,
        beyond_batch=64,
        beyond_recipe="debug",
        beyond_budget_mb=8.0,
    ),
}
