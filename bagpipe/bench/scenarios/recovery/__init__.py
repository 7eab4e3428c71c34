"""``bagpipe bench recovery``: checkpoint cost and recovery time of a killed role."""
