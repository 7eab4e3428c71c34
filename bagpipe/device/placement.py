"""Which GPU a trainer of a distributed job computes on, and which backend its collectives use.

Under ``torchrun`` (and the local launcher, which sets the same variables) every process
knows ``LOCAL_RANK``, its index among the job's processes on its machine. The roles are
laid out trainers first (:mod:`bagpipe.distributed.layout`), so on a machine that runs
trainers they are local ranks 0, 1, ...: trainer process with local rank k takes GPU
``cuda:k``. It has a GPU *of its own* when k < the machine's GPU count; past that, the
trainers share GPUs round-robin (``cuda:k % count``).

The trainers' collectives (DDP's dense gradients, the embedding all-reduce, the loss
mean) run on NCCL when every trainer has a GPU of its own and the run is on ``cuda``,
and on gloo otherwise (gloo reduces CUDA tensors too, through host memory). Embedding
servers and the oracle stay CPU processes; the point-to-point transport between roles is
gloo on the default group whatever the trainers use.

Every rank must create the trainers' group with the same backend, and only the trainers
know their GPUs: each trainer publishes :attr:`TrainerPlacement.tag` in the job's store,
and every rank reads all of them (:func:`trainer_backend`).
"""

from __future__ import annotations

from dataclasses import dataclass

LOCAL_RANK_ENV = "LOCAL_RANK"


def local_rank(environ: dict | None = None) -> int:
    """This process's LOCAL_RANK (0 when unset: a process alone on its machine); a value
    that is not an integer >= 0 is a one-line ConfigError naming the variable."""
    from bagpipe.config.environ import env_int

    return env_int(LOCAL_RANK_ENV, 0, environ=environ)


@dataclass(frozen=True)
class TrainerPlacement:
    """Where one trainer computes."""

    device: str
    """--device: cpu, cuda or cpu-async."""
    index: int | None
    """The GPU (cuda:index) on cuda, else None."""
    own: bool
    """On cuda: no other trainer of this machine computes on the same GPU."""

    @property
    def tag(self) -> str:
        """What this trainer tells the other ranks: ``gpu`` (a GPU of its own) or ``shared``."""
        return "gpu" if self.device == "cuda" and self.own else "shared"


def place_trainer(device: str, local: int, gpu_count: int) -> TrainerPlacement:
    """The placement of a trainer with LOCAL_RANK ``local`` on a machine with ``gpu_count`` GPUs."""
    if device != "cuda":
        return TrainerPlacement(device, None, False)
    if gpu_count < 1:
        return TrainerPlacement(device, 0, False)  # opening the device will say there is none
    return TrainerPlacement(device, local % gpu_count, local < gpu_count)


def trainer_backend(tags: list[str]) -> str:
    """The trainers' collectives' backend given every trainer's :attr:`TrainerPlacement.tag`."""
    return "nccl" if tags and all(t == "gpu" for t in tags) else "gloo"
