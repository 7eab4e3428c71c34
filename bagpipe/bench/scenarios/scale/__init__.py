"""``bagpipe bench scale``: tables larger than memory (runs, report, the reads-only probe process)."""
