"""Roles of one job started with different settings are refused before the first step.

Roles are started one by one (torchrun, by hand, on several hosts), each from its own
command line. Each sends what it was started with (:func:`bagpipe.config.agreement.job_settings`)
in its handshake, and a pair that differs is refused in one line naming the setting, both
values and the peer, by every role of the pair (:meth:`Transport.join`). A value is shown
as the user would recognise it: a --cache-rows not given as ``auto``, not as the 0 it is stored as;
a --embedding-dim or --embedding-lr not given as the value it resolves to (the recipe's D,
--lr), so roles that agree in effect are not refused.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import subprocess
import sys
import time
import typing

import pytest
from runs import outputs, stopped_at_end

from bagpipe.config.agreement import PER_ROLE, RESOLVED, differences, job_settings, option
from bagpipe.config.train import TrainConfig


def _config(tmp_path) -> TrainConfig:
    from bagpipe.config.options import build

    return build(TrainConfig, {"data": str(tmp_path / "data"), "out": str(tmp_path / "out")})


def _other(value, hint):
    """A value other than ``value`` of the setting's type (``hint``)."""
    choices = [a for a in typing.get_args(hint) if isinstance(a, str)]
    if choices:
        return next(c for c in choices if c != value)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 2 + 1
    return f"{value}-other"


@pytest.mark.unit
def test_every_setting_but_the_per_role_ones_is_compared(tmp_path):
    cfg = _config(tmp_path)
    mine = job_settings(cfg, "ab" * 32)
    compared = 0
    for section in dataclasses.fields(cfg):
        values = getattr(cfg, section.name)
        hints = typing.get_type_hints(type(values))
        for f in dataclasses.fields(values):
            other = copy.deepcopy(cfg)
            setattr(getattr(other, section.name), f.name, _other(getattr(values, f.name), hints[f.name]))
            diff = differences(mine, job_settings(other, "ab" * 32))
            if f.name in PER_ROLE or f.name == "data":  # the data set is compared by its contents
                assert diff == [], f.name
                continue
            compared += 1
            assert any(d.startswith(option(f.name) + " ") for d in diff), (f.name, diff)
            # besides it, at most the settings derived from it when not given (their effective value changed)
            derived = {option(n) for n, (sources, _) in RESOLVED.items() if f.name in sources}
            assert {d.split(" ")[0] for d in diff} - {option(f.name)} <= derived, (f.name, diff)
    assert compared >= 40
    # the same data set at another path agrees; other contents do not
    assert differences(mine, job_settings(cfg, "ab" * 32)) == []
    assert differences(mine, job_settings(cfg, "cd" * 32)) == [
        "--data (its contents) fingerprint abababababab here, fingerprint cdcdcdcdcdcd there"
    ]


@pytest.mark.unit
def test_only_the_settings_both_roles_hold_are_compared():
    # an embedding server started by hand (`bagpipe serve`) holds no training settings
    assert differences({"--seed": "3", "--steps": "40"}, {}) == []
    assert differences({"--seed": "3", "--steps": "40"}, {"--seed": "0"}) == ["--seed 3 here, 0 there"]


@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_hand_started_roles_that_disagree_are_refused_before_training(tiny_data, tmp_path):
    """Trainer 0, server 0 and the oracle started by hand as torchrun would: the oracle
    given --seed 3, the server --steps 50. Every role exits 2 naming what differs, and
    nothing trains (no summary, no checkpoint)."""
    from bagpipe.distributed.auth import SECRET_ENV, new_secret
    from bagpipe.distributed.launch import free_port

    port, secret = free_port(), new_secret()
    out = tmp_path / "job"
    common = ["--data", str(tiny_data), "--out", str(out), "--steps", "40", "--batch-size", "64", "--no-progress"]
    common += ["--mode", "lookahead", "--trainers", "1", "--servers", "1", "--cache-rows", "2000", "--lookahead", "4"]
    own = {0: [], 1: ["--steps", "50"], 2: ["--seed", "3"]}
    with stopped_at_end() as procs:
        for rank in range(3):
            env = dict(
                os.environ,
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                RANK=str(rank),
                WORLD_SIZE="3",
                GLOO_SOCKET_IFNAME="lo",
                OMP_NUM_THREADS="1",
            )
            env[SECRET_ENV] = secret.decode()
            cmd = [sys.executable, "-m", "bagpipe.cli", "worker", *common, *own[rank]]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        t0 = time.monotonic()
        results = outputs(procs, 150, t0)
    errors = [err for _, err in results]
    assert [p.returncode for p in procs] == [2, 2, 2], errors
    assert "trainer 0 was started with other settings than server 0 (rank 1): --steps 40 here, 50 there" in errors[0]
    assert "oracle (rank 2): --seed 0 here, 3 there" in errors[0]
    assert "server 0 was started with other settings than trainer 0 (rank 0): --steps 50 here, 40 there" in errors[1]
    assert "oracle was started with other settings than trainer 0 (rank 0): --seed 3 here, 0 there" in errors[2]
    for err in errors:
        assert "start every role of a job with the same options" in err
        assert "Traceback" not in err
    assert not (out / "summary.json").exists()
    assert not list(out.glob("checkpoints/*")) if out.exists() else True


@pytest.mark.unit
def test_a_cache_rows_not_given_is_shown_as_auto(tmp_path):
    # --cache-rows not given is stored as 0 (5% of all rows); the user gave no 0
    cfg = _config(tmp_path)
    assert cfg.cache.cache_rows == 0
    given = copy.deepcopy(cfg)
    given.cache.cache_rows = 500
    mine, theirs = job_settings(cfg, "ab" * 32), job_settings(given, "ab" * 32)
    assert mine["--cache-rows"] == "auto" and theirs["--cache-rows"] == "500"
    assert differences(mine, theirs) == ["--cache-rows auto here, 500 there"]


@pytest.mark.unit
def test_settings_not_given_are_shown_as_what_they_mean(tmp_path):
    # stored placeholders (None, 0 for "off") read as what they mean, never as a value the user gave
    cfg = _config(tmp_path)
    assert cfg.optim.embedding_lr is None and cfg.run.eval_samples == 0 and cfg.cache.cache_budget_mb == 0
    given = copy.deepcopy(cfg)
    given.optim.embedding_lr = 0.1
    given.run.eval_samples = 256
    mine, theirs = job_settings(cfg, "ab" * 32), job_settings(given, "ab" * 32)
    assert mine["--embedding-lr"] == str(cfg.optim.lr) and mine["--eval-samples"] == "the-whole-eval-split"
    assert mine["--cache-budget-mb"] == "off"
    assert not any(v in ("None", "0", "0.0") for k, v in mine.items() if k in ("--embedding-lr", "--eval-samples"))
    assert differences(mine, theirs) == [
        f"--embedding-lr {cfg.optim.lr} here, 0.1 there",  # not given: --lr's, the rate it trains with
        "--eval-samples the-whole-eval-split here, 256 there",
    ]


@pytest.mark.unit
def test_settings_resolved_from_others_are_compared_by_their_effective_value(tmp_path):
    # --embedding-dim not given is the recipe's D; --embedding-lr not given is --lr: a role
    # that gives the same value explicitly agrees ("--embedding-dim 8 here, None there" refused it)
    from bagpipe.models.config import recipe

    cfg = _config(tmp_path)
    d = recipe(cfg.arch.model, cfg.arch.recipe).embedding_dim
    assert cfg.arch.embedding_dim is None and cfg.optim.embedding_lr is None
    same = copy.deepcopy(cfg)
    same.arch.embedding_dim, same.optim.embedding_lr = d, cfg.optim.lr
    mine = job_settings(cfg, "ab" * 32)
    assert mine["--embedding-dim"] == str(d) and differences(mine, job_settings(same, "ab" * 32)) == []
    other = copy.deepcopy(cfg)
    other.arch.embedding_dim = d * 2
    assert differences(mine, job_settings(other, "ab" * 32)) == [f"--embedding-dim {d} here, {d * 2} there"]
    # another recipe, no --embedding-dim on either side: its D is named, not None
    kaggle = copy.deepcopy(cfg)
    kaggle.arch.recipe = "kaggle"
    k = recipe(cfg.arch.model, "kaggle").embedding_dim
    assert k != d
    assert differences(mine, job_settings(kaggle, "ab" * 32)) == [
        f"--embedding-dim {d} here, {k} there",
        "--recipe debug here, kaggle there",
    ]
