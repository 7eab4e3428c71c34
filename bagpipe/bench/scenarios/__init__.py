"""The benchmark scenarios, one package each: ``scenario.py`` (its settings class and
``run``) and, where it has them, its report, cost model and helper processes beside it.

A package is named for what its scenario measures; four differ from the command's name
(``bagpipe bench NAME``, :mod:`bagpipe.bench.registry`), so that none is named like a
package of ``bagpipe/``: ``oracle`` is :mod:`~bagpipe.bench.scenarios.oracle_throughput`,
``distributed`` :mod:`~bagpipe.bench.scenarios.embedding_servers`, ``accel``
:mod:`~bagpipe.bench.scenarios.hot_tiers` and ``memory``
:mod:`~bagpipe.bench.scenarios.peak_memory`. A package's ``__init__`` imports nothing: a
helper process (``python -m ...``) loads only what it needs.
"""
