"""Benchmarks that run the compared configurations side by side in one invocation.

Each scenario writes ``results.json``, ``results.md`` (a Markdown table with ratios)
and PNG plots into its output folder. Configurations are interleaved across
repetitions so machine noise hits them alike; warm-up steps are excluded and the
median and spread of the repetitions are reported.

One design for all, in three parts:

* :mod:`bagpipe.bench.scenarios`: one package per scenario, a settings class (a
  subclass of :mod:`bagpipe.bench.harness.settings`'s bases, whose fields become its
  options) and ``run`` in its ``scenario.py``, its report and cost model beside it;
* :mod:`bagpipe.bench.harness`: the settings bases, every training run launched by
  :mod:`bagpipe.bench.harness.runner`, the results written by
  :mod:`bagpipe.bench.harness.report`;
* :mod:`bagpipe.bench.registry`: lists the scenarios for ``bagpipe bench``.

The emulated environments some scenarios run in (network namespaces, memory limits,
background load) are in :mod:`bagpipe.testbed`.
"""
