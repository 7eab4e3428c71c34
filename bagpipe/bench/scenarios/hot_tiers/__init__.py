"""``bagpipe bench accel``: BagPipe with and without a hot tier, FAE and Hotline under one memory budget."""
