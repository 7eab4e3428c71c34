"""``bagpipe bench sweep``: lookahead over cache size x L, and the cache-budget auto-tuner."""
