"""What every benchmark scenario shares: the settings bases whose fields become a
scenario's options (:mod:`~bagpipe.bench.harness.settings`), one way to launch a
training run (:mod:`~bagpipe.bench.harness.runner`) and one way to write the results
(:mod:`~bagpipe.bench.harness.report`)."""
