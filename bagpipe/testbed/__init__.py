"""Emulated environments for the benchmarks and the tests: hosts in network namespaces
with shaped links (:mod:`~bagpipe.testbed.netns`), cgroup memory limits
(:mod:`~bagpipe.testbed.memlimit`) and background CPU load
(:mod:`~bagpipe.testbed.load`). Nothing in training imports them."""
