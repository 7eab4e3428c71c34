"""Benchmarks that run the compared configurations side by side in one invocation.

Each scenario writes ``results.json``, ``results.md`` (a Markdown table with ratios)
and PNG plots into its output folder. Configurations are interleaved across
repetitions so machine noise hits them alike; warm-up steps are excluded and the
median and spread of the repetitions are reported.
"""
