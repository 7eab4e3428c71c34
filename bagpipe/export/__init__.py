"""A trained model outside bagpipe: export, loading and scoring (docs/export.md).

* :mod:`~bagpipe.export.tensorfile`: safetensors files written chunk by chunk (a table
  larger than memory streams through) and read back memory-mapped;
* :mod:`~bagpipe.export.naming`: TorchRec's state_dict names (tables always; DLRM's dense
  layers where TorchRec's DLRM has the same architecture);
* :mod:`~bagpipe.export.write`: ``bagpipe export``: a run's latest checkpoint -> an export directory;
* :mod:`~bagpipe.export.model`: :class:`~bagpipe.export.model.ExportedModel`, what
  ``bagpipe.load(DIR)`` returns: an ``nn.Module`` scoring ids or raw log lines;
* :mod:`~bagpipe.export.score`: ``bagpipe predict``: raw log lines -> one probability per
  line, parsed and mapped by the preprocessing code.

Nothing here is imported by training.
"""
