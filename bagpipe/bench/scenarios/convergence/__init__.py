"""``bagpipe bench convergence``: eval curves of full and lookahead, which must be identical."""
