"""``bagpipe bench memory``: ``bagpipe plan``'s memory estimate against the measured peak of real runs."""
