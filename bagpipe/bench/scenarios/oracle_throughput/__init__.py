"""``bagpipe bench oracle``: the lookahead oracle's planning throughput alone."""
