"""The device memory peak of every bagpipe process a benchmark starts (``bench modes``
keeps no device figure in its summaries).

Put on ``PYTHONPATH`` by the gpu-check's benchmark step, with ``BAGPIPE_DEVICE_PEAK_DIR``
set: Python imports this module at start-up in every child process, and at exit a
process that used CUDA writes ``PID.json`` there: its argv and torch's peak allocated
and reserved bytes on its device.
"""

import atexit
import json
import os
import sys


def _write_peak() -> None:
    where = os.environ.get("BAGPIPE_DEVICE_PEAK_DIR")
    torch = sys.modules.get("torch")
    if not where or torch is None or not torch.cuda.is_initialized():
        return
    peak = {
        "argv": sys.argv,
        "max_allocated_bytes": torch.cuda.max_memory_allocated(),
        "max_reserved_bytes": torch.cuda.max_memory_reserved(),
    }
    with open(os.path.join(where, f"{os.getpid()}.json"), "w") as f:
        json.dump(peak, f, allow_nan=False)


atexit.register(_write_peak)
