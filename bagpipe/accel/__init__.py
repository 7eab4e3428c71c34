"""Hot rows: the profiler, the hot tier in front of the planners, and the FAE and Hotline modes.

* :mod:`bagpipe.accel.profile` -- which rows are hot (``bagpipe profile``): access counts over a
  seeded sample of the train split, the most accessed rows that fit a memory budget, and
  the share of lookups and of inputs they cover.
* :mod:`bagpipe.accel.hot` -- the hot tier: hot rows resident in the trainer for the whole
  run; the planners (lookahead, lru, nocache, unchanged) see only the cold rows.
* :mod:`bagpipe.accel.schedule` -- FAE's regrouped schedule (``--fae-schedule split``).
* :mod:`bagpipe.accel.hotline` -- Hotline's step: a popular and a non-popular micro-batch,
  the cold rows fetched while the popular one computes.

What FAE and Hotline do and what bagpipe takes from each: ``docs/accel.md``.
"""
