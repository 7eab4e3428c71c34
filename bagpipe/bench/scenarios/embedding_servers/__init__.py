"""``bagpipe bench distributed``: embedding servers against the in-process store; partitioned against replicated cache."""
