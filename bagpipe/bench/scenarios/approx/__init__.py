"""``bagpipe bench approx``: exact training against the approximate methods (Slipstream, cDLRM)."""
