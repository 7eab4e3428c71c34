"""Optimizers and learning-rate schedules.

* :mod:`~bagpipe.optim.sparse`: the row-wise optimizer interface, SGD and Adagrad;
* :mod:`~bagpipe.optim.adam`: row-wise Adam and partial row-wise Adam (FBGEMM's);
* :mod:`~bagpipe.optim.build`: an optimizer by name, row-wise and dense (torch's);
* :mod:`~bagpipe.optim.schedule`: learning-rate schedules (constant, MLPerf DLRM's warm-up + polynomial decay, step);
* :mod:`~bagpipe.optim.names`: the names (no torch: config checks import it).

This ``__init__`` imports nothing, so the names cost no torch import.
"""
