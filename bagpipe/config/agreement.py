"""The settings every role of a distributed job must share, as each role sees them.

Roles are started separately (by the launcher, by torchrun, by hand on several hosts),
each from its own command line. A role given another ``--seed``, ``--steps`` or data set
than the others would train another model than the one the run reports, or wait forever
in a collective the others never enter. So each role sends :func:`job_settings` in its
handshake (:meth:`bagpipe.distributed.transport.Transport.join`) and every pair of roles
compares them before the first step (:func:`differences`).

Every setting of :class:`~bagpipe.config.train.TrainConfig` is compared except the
:data:`PER_ROLE` ones, which may differ between roles without changing the run; a new
setting is compared unless it is added there, with its reason. A setting whose "not
given" stands for a value derived from others (:data:`RESOLVED`: --embedding-dim is the
recipe's D, --embedding-lr is --lr) is compared, and shown, as that effective value: a
role given ``--embedding-dim 8`` agrees with one given none when the recipe's D is 8.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from bagpipe.config.train import TrainConfig
from bagpipe.models.config import recipe

PER_ROLE = frozenset(
    {
        # where a role keeps or writes its own things
        "out",
        "store",
        "store_dir",
        "summary_json",
        "tensorboard",
        # how a role runs on its own machine: the result is the same on any of them
        "memory_budget_mb",
        "server_memory_budget_mb",
        "device",
        "device_memory_budget_mb",
        "threads",
        "progress",
        "plans_in_flight",
        # how the run's length was given: the --steps it comes to is compared
        "epochs",
        # how a role joins and is restarted (the launcher's and the rendezvous' business)
        "rendezvous_timeout",
        "max_restarts",
        "spares",
        "secret_file",
    }
)
"""Settings a role may hold differently from the others."""

SHOWN_AS = {
    "cache_rows": {0: "auto"},
    "cache_budget_mb": {0: "off"},
    "eval_every": {0: "only-at-the-end"},
    "eval_samples": {0: "the-whole-eval-split"},
    "checkpoint_every": {0: "only-at-the-end"},
}
"""Values shown as what they mean rather than as stored: a --cache-rows not given (0)
picks 5% of all rows, and a user who gave none would not recognise ``--cache-rows 0``.
A setting not given at all (None: --embedding-lr, --hot-rows, --emulate-compute...) is shown
as ``not-given``."""


RESOLVED = {
    "embedding_dim": (("model", "recipe"), lambda cfg: recipe(cfg.arch.model, cfg.arch.recipe).embedding_dim),
    "embedding_lr": (("lr",), lambda cfg: cfg.optim.lr),
}
"""Setting -> (the settings it is derived from when not given, its value then)."""


def option(name: str) -> str:
    """The command-line option of setting ``name`` (``batch_size`` -> ``--batch-size``)."""
    return "--" + name.replace("_", "-")


def job_settings(cfg: TrainConfig, data_fingerprint: str) -> dict[str, str]:
    """Option -> value (as text) of every setting the roles must share; the data set by its
    contents (``data_fingerprint``: :meth:`bagpipe.data.shards.Dataset.fingerprint`), not
    by its path, which may differ between hosts."""
    out: dict[str, str] = {}
    for section in dataclasses.fields(cfg):
        values = getattr(cfg, section.name)
        for f in dataclasses.fields(values):
            if f.name in PER_ROLE:
                continue
            value = getattr(values, f.name)
            if f.name == "data":
                out["--data (its contents)"] = f"fingerprint {data_fingerprint[:12]}"
            elif f.name in RESOLVED:
                out[option(f.name)] = str(RESOLVED[f.name][1](cfg) if value is None else value)
            else:
                shown = "not-given" if value is None else SHOWN_AS.get(f.name, {}).get(value, value)
                out[option(f.name)] = str(shown)
    return out


def differences(mine: Mapping[str, str], theirs: Mapping[str, str]) -> list[str]:
    """What differs between two roles' settings, as ``--seed 3 here, 0 there``, over the
    settings both sent (an embedding server started by hand holds none of them)."""
    return [
        f"{k} {mine[k]} here, {theirs[k]} there" for k in sorted(mine.keys() & theirs.keys()) if mine[k] != theirs[k]
    ]
