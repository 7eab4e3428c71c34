"""The torch versions bagpipe runs under: :data:`TORCH_MINIMUM` and later.

``make setup`` installs the pinned build (pyproject.toml's ``torch==...``, the CPU build
CI tests); a machine lent with a GPU brings its own CUDA build, 2.11 on the machines seen
so far, and cannot install another (no network). So the package uses no torch API newer
than the minimum: every torch name it spells out (``torch.x.y`` attribute paths and
``from torch... import`` / ``import torch...`` statements) is in :data:`TORCH_API`, each
of which torch 2.11 has. ``tests/unit/test_versions.py`` holds the code to this list, the list
to the installed torch, and pyproject.toml's pin, its ``[tool.bagpipe]`` minimum and the
README to this minimum; a name added to the list must be checked against torch's
documentation for 2.11 first (or used behind a fallback).
"""

from __future__ import annotations

TORCH_MINIMUM = (2, 11)

#: Every torch name bagpipe spells out; all of them are in torch 2.11 (most since 1.x; the
#: newest, torch.cuda.is_initialized and torch.autograd.graph.saved_tensors_hooks, since 1.10).
TORCH_API = frozenset(
    {
        "torch.Tensor",
        "torch.__version__",
        "torch.arange",
        "torch.are_deterministic_algorithms_enabled",
        "torch.argsort",
        "torch.autograd.graph.saved_tensors_hooks",
        "torch.bmm",
        "torch.cat",
        "torch.cuda.Event",
        "torch.cuda.Stream",
        "torch.cuda.current_device",
        "torch.cuda.current_stream",
        "torch.cuda.device_count",
        "torch.cuda.get_device_name",
        "torch.cuda.get_device_properties",
        "torch.cuda.is_available",
        "torch.cuda.is_initialized",
        "torch.cuda.max_memory_allocated",
        "torch.cuda.max_memory_reserved",
        "torch.cuda.reset_peak_memory_stats",
        "torch.cuda.set_device",
        "torch.cuda.set_per_process_memory_fraction",
        "torch.cuda.stream",
        "torch.cuda.synchronize",
        "torch.device",
        "torch.distributed",
        "torch.distributed.algorithms.ddp_comm_hooks.default_hooks.allreduce_hook",  # DDP's own hook (since 1.8)
        "torch.distributed.all_reduce",
        "torch.distributed.get_backend",
        "torch.dtype",
        "torch.empty",
        "torch.float32",
        "torch.float64",
        "torch.from_numpy",
        "torch.get_num_threads",
        "torch.get_rng_state",
        "torch.isfinite",
        "torch.load",
        "torch.long",
        "torch.manual_seed",
        "torch.nn",
        "torch.nn.Linear",
        "torch.nn.Module",
        "torch.nn.functional",
        "torch.nn.parallel",
        "torch.nn.parallel.DistributedDataParallel",
        "torch.no_grad",
        "torch.ones",
        "torch.optim.Adagrad",
        "torch.optim.Adam",
        "torch.optim.Optimizer",
        "torch.optim.SGD",
        "torch.randn",
        "torch.random.fork_rng",
        "torch.save",
        "torch.set_num_threads",
        "torch.set_rng_state",
        "torch.sigmoid",
        "torch.stack",
        "torch.tensor",
        "torch.tril_indices",
        "torch.triu_indices",
        "torch.unique",
        "torch.use_deterministic_algorithms",
        "torch.utils.tensorboard.SummaryWriter",
        "torch.version.cuda",
        "torch.zeros",
        "torch.zeros_like",
    }
)


def version_tuple(version: str) -> tuple[int, int]:
    """``"2.11.0+cu130"`` -> ``(2, 11)``."""
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)
