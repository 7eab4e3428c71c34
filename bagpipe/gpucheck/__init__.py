"""``make gpu-check``: the GPU path proven in one command, in a few minutes on a bare GPU machine.

A machine with a GPU is lent now and then, for minutes, with a CUDA build of torch and
no network; this package runs from the working tree by path (``PYTHONPATH=. python -m
bagpipe.gpucheck``), installs nothing, and measures every GPU figure docs/gpu.md shows:

* :mod:`bagpipe.gpucheck.sizes` -- the steps' sizes and time limits (``gpu``: one
  H100-class GPU in at most 8 minutes; ``tiny``: the CPU dry run of the tests);
* :mod:`bagpipe.gpucheck.steps` -- the steps: what each runs as its own child process;
* :mod:`bagpipe.gpucheck.work` -- the steps' bodies (exactness, the budget run, the
  data-parallel run, the benchmark), run in those children;
* :mod:`bagpipe.gpucheck.runner` -- runs the steps, each stopped at its limit, and writes
  the results folder (results.json, results.md, gpu-check.log);
* :mod:`bagpipe.gpucheck.report` -- the Markdown of the results, and the GPU section of
  docs/gpu.md (:mod:`bagpipe.gpucheck.docs` writes it there).

Without a GPU the command says so in one line and runs nothing.
"""
