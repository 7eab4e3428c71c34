"""``bagpipe bench peers``: TorchRec's DLRM beside bagpipe (the driver and the TorchRec worker process)."""
