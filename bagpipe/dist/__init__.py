"""Distributed training: roles (trainers, embedding servers, the oracle) over torch.distributed.

* :mod:`bagpipe.dist.transport`  one small message interface over gloo point-to-point
* :mod:`bagpipe.dist.layout`     which rank plays which role
* :mod:`bagpipe.dist.server`     the embedding server and its client, :class:`RemoteStore`
* :mod:`bagpipe.dist.partition`  a global plan split into per-trainer plans (the partitioned cache)
* :mod:`bagpipe.dist.oracle_role` the oracle as its own process, with back-pressure
* :mod:`bagpipe.dist.trainer`    a data-parallel trainer (DDP + embedding-gradient sync)
* :mod:`bagpipe.dist.roles`      one process: join the job, play the rank's role, leave
* :mod:`bagpipe.dist.launch`     one machine: every role as a process on loopback
"""
