"""``bagpipe bench cluster``: an emulated cluster (settings, runs, report, traffic cost model)."""
