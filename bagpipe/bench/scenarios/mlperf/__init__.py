"""``bagpipe bench mlperf``: MLPerf DLRM-DCNv2 at full size for a bounded number of steps."""
