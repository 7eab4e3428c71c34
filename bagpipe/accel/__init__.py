"""Hot rows: the profiler, the hot tier in front of the planners, and the FAE and Hotline modes.

* :mod:`bagpipe.accel.profile` -- which rows are hot (``bagpipe profile``): access counts over a
  seeded sample of the train split, the most accessed rows that fit a memory budget, and
  the share of lookups and of inputs they cover.
* :mod:`bagpipe.accel.hot` -- the hot tier: hot rows resident in the trainer for the whole
  run; the planners (lookahead, lru, nocache, unchanged) see only the cold rows.
* :mod:`bagpipe.accel.schedule` -- FAE's regrouped schedule (``--fae-schedule split``).

The steps of the modes that use them live beside the plain step: Hotline's in
:mod:`bagpipe.train.step.hotline`, Slipstream's skip in :mod:`bagpipe.train.step.slipstream`.

What FAE and Hotline do and what bagpipe takes from each: ``docs/accel.md``.
"""
