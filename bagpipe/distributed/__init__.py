"""Distributed training: roles (trainers, embedding servers, the oracle) over torch.distributed.

* :mod:`bagpipe.distributed.transport`  one small message interface over gloo point-to-point
* :mod:`bagpipe.distributed.layout`     which rank plays which role
* :mod:`bagpipe.distributed.server`     the embedding server and its client, :class:`RemoteStore`
* :mod:`bagpipe.distributed.partition`  a global plan split into per-trainer plans (the partitioned cache)
* :mod:`bagpipe.distributed.exchange`   the owner-based exchange's split (``--cache-sync owner``)
* :mod:`bagpipe.distributed.row_exchange` a trainer's side of it (the rounds of gradients and rows)
* :mod:`bagpipe.distributed.oracle_role` the oracle as its own process, with back-pressure
* :mod:`bagpipe.distributed.trainer`    a data-parallel trainer (DDP + embedding-gradient sync)
* :mod:`bagpipe.distributed.roles`      one process: join the job, play the rank's role, leave
* :mod:`bagpipe.distributed.launch`     one machine: every role as a process on loopback
"""
