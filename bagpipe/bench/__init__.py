"""Benchmarks that run the compared configurations side by side in one invocation.

Each scenario writes ``results.json``, ``results.md`` (a Markdown table with ratios)
and PNG plots into its output folder. Configurations are interleaved across
repetitions so machine noise hits them alike; warm-up steps are excluded and the
median and spread of the repetitions are reported.

One design for all: a scenario is a module with a settings class (a subclass of
:mod:`bagpipe.bench.config`'s bases, whose fields become its options) and ``run``;
:mod:`bagpipe.bench.registry` lists them for ``bagpipe bench``; every training run is
launched by :mod:`bagpipe.bench.runner` and the results are written by
:mod:`bagpipe.bench.report`.
"""
