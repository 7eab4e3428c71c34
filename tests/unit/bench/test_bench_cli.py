"""``bagpipe bench``'s command line, generated from the scenario registry (no runs here).

* ``bagpipe bench --help`` lists every scenario; each ``bagpipe bench SCENARIO --help``
  lists its own options and not the other scenarios'.
* An option only other scenarios have is refused with one line naming it and the
  scenario (exit code 2); so is a bad value, naming the option.
* Every scenario's ``--quick`` settings construct and validate (the settings classes
  subclass bases from another module, whose annotations they do not import).
* The option names users have today reach the settings of the scenarios they applied
  to, and ``--quick`` with an option keeps the rest of the quick size.
* :func:`bagpipe.bench.harness.runner.train_args` builds options ``bagpipe train`` accepts.
* ``bench cluster`` where namespaces cannot be made prints one line saying why and writes it to results.json.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bagpipe.bench.harness.runner import train_args
from bagpipe.bench.registry import SCENARIOS

pytestmark = pytest.mark.unit

#: options of the bench command before the registry -> the scenarios they were passed to
LEGACY = {
    "--out": set(SCENARIOS),
    "--quick": set(SCENARIOS),
    "--scale": {"modes", "oracle", "peers", "sweep", "distributed"},
    "--reps": {"modes", "oracle", "peers", "sweep", "distributed"},
    "--modes": {"modes", "peers", "distributed"},
    "--stores": {"modes"},
    "--steps": {"modes", "peers", "sweep", "distributed", "convergence"},
    "--warmup": {"modes", "peers", "sweep", "distributed"},
    "--batch-size": {"modes", "peers", "sweep", "distributed", "convergence"},
    "--cache-fraction": {"modes", "peers", "distributed", "convergence"},
    "--lookahead": {"modes", "peers", "distributed", "convergence"},
    "--threads": {"modes", "peers", "sweep", "convergence"},
    "--cache-percents": {"sweep"},
    "--autotune-percent": {"sweep"},
    "--eval-every": {"convergence"},
    "--no-criteo": {"convergence"},
    "--batch-sizes": {"oracle"},
    "--lookaheads": {"oracle", "sweep"},
    "--batches": {"oracle"},
}


@pytest.fixture
def captured(monkeypatch):
    """Replace every scenario's run function; returns the settings each call got."""
    got = []

    def fake(b):
        got.append(b)
        return {"table": "| fake |"}

    for name, s in SCENARIOS.items():
        monkeypatch.setitem(SCENARIOS, name, dataclasses.replace(s, run=fake))
    return got


def test_help_lists_every_scenario(run_cli):
    rc, out, _ = run_cli("bench", "--help")
    assert rc == 0
    for name, s in SCENARIOS.items():
        assert name in out and s.about.split()[0] in out
    assert "Examples:" in out


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_scenario_help_lists_its_own_options_only(run_cli, scenario):
    rc, out, _ = run_cli("bench", scenario, "--help")
    assert rc == 0
    assert f"bagpipe bench {scenario}:" in out and "--quick" in out
    mine = SCENARIOS[scenario].config.option_strings()
    for opt in mine:
        assert opt in out, opt
    others = {o for s in SCENARIOS.values() for o in s.config.option_strings()} - set(mine)
    assert not [o for o in others if f"{o} " in out or f"{o}," in out]


@pytest.mark.parametrize(
    "scenario,args,option",
    [
        ("oracle", ["--cache-percents", "1,5"], "--cache-percents"),
        ("oracle", ["--no-criteo"], "--no-criteo"),
        ("sweep", ["--quick", "--lookahead", "4"], "--lookahead"),
        ("convergence", ["--reps", "3"], "--reps"),
        ("modes", ["--batches", "5", "--steps", "9"], "--batches"),
    ],
)
def test_option_of_another_scenario_is_refused(run_cli, captured, tmp_path, scenario, args, option):
    rc, out, err = run_cli("bench", scenario, *args, "--out", tmp_path / "o")
    assert rc == 2
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, err
    assert f"{option} does not apply to the {scenario} scenario" in lines[0]
    assert not captured and not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "scenario,args,option",
    [
        ("modes", ["--reps", "0"], "--reps"),
        ("modes", ["--cache-fraction", "2"], "--cache-fraction"),
        ("peers", ["--cache-fraction", "0"], "--cache-fraction"),
        ("sweep", ["--warmup", "300"], "--warmup"),
        ("sweep", ["--cache-percents", "0,5"], "--cache-percents"),
        ("distributed", ["--modes", "in-process,3x3"], "--modes"),
        ("oracle", ["--batch-sizes", "0"], "--batch-sizes"),
        ("convergence", ["--eval-every", "0"], "--eval-every"),
        ("peers", ["--optimizer", "sgd"], "--optimizer"),
    ],
)
def test_bad_value_is_one_line_naming_the_option(run_cli, captured, scenario, args, option):
    rc, _, err = run_cli("bench", scenario, *args)
    assert rc == 2
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"bagpipe bench: error: {option} "), err
    assert not captured


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_quick_settings_construct_and_validate(scenario):
    cls = SCENARIOS[scenario].config
    fields = {f.name for f in dataclasses.fields(cls)}
    assert set(cls.QUICK) <= fields
    b = cls.quick()
    assert b.name == scenario and b.out == f"bench-out/{scenario}"
    for key, value in cls.QUICK.items():
        assert getattr(b, key) == (tuple(value) if isinstance(value, tuple) else value)
    assert cls.quick(out="x").out == "x"


def test_legacy_option_names_reach_the_settings():
    for opt, scenarios in LEGACY.items():
        if opt == "--quick":
            continue
        for name in scenarios:
            assert opt in SCENARIOS[name].config.option_strings(), (opt, name)


def test_options_and_quick_reach_the_run(run_cli, captured, tmp_path):
    rc, out, _ = run_cli("bench", "modes", "--quick", "--steps", "5", "--modes", "full,lru", "--out", tmp_path / "m")
    assert rc == 0 and "| fake |" in out
    (b,) = captured
    assert (b.steps, b.modes, b.out) == (5, ("full", "lru"), str(tmp_path / "m"))
    assert (b.scale, b.batch_size, b.warmup, b.stores) == (0.01, 256, 2, ("memory",))  # the rest of --quick
    captured.clear()
    assert run_cli("bench", "convergence", "--no-criteo", "--lookahead", "7")[0] == 0
    assert captured[0].criteo is False and captured[0].lookahead == 7 and captured[0].steps == 400


def test_train_args_are_bagpipe_train_options(tmp_path):
    from bagpipe.cli import build_parser

    parser = build_parser()
    b = SCENARIOS["sweep"].config.quick()
    args = train_args(
        b,
        tmp_path / "data",
        tmp_path / "run",
        mode="lookahead",
        cache_rows=100,
        lookahead=4,
        store="disk",
        store_dir=tmp_path / "s",
        trainers=2,
        servers=2,
        cache_sync="replicated",
        eval_every=5,
    )
    ns = parser.parse_args(["train", *args, "--summary-json", str(tmp_path / "s.json")])
    assert (ns.steps, ns.warmup_steps, ns.eval_samples, ns.threads, ns.batch_size) == (24, 4, 512, 1, 256)
    assert (ns.cache_rows, ns.lookahead, ns.store, ns.trainers, ns.servers, ns.cache_sync) == (
        100,
        4,
        "disk",
        2,
        2,
        "replicated",
    )
    assert ns.progress is False and ns.final_checkpoint is False and ns.digest is False
    # no warm-up field (convergence): no --warmup-steps; a shared value replaced, None left out
    c = SCENARIOS["convergence"].config()
    args = train_args(c, Path("d"), Path("r"), digest=True, mode="full", steps=7, eval_samples=None)
    assert "--warmup-steps" not in args and "--eval-samples" not in args and "--no-digest" not in args
    assert args[args.index("--steps") + 1] == "7" and "--threads" not in args
    assert parser.parse_args(["train", *args]).digest is None


def test_scale_runs_end_as_a_users_run_when_asked(tmp_path):
    """bench scale --checkpoint-every N --final-checkpoint: every configuration's run takes
    its checkpoints and its final one (the acceptance of runs that end within the limit);
    the table reads each run's last checkpoint step from its LATEST."""
    from bagpipe.bench.scenarios.scale.scenario import CONFIGS, ScaleBench, last_checkpoint_step, settings
    from bagpipe.cli import build_parser

    parser = build_parser()
    b = ScaleBench.quick()
    assert all(v["final_checkpoint"] is False and v["checkpoint_every"] is None for v in settings(b, 1000, 64).values())
    b = ScaleBench(checkpoint_every=250, final_checkpoint=True)
    each = settings(b, 1000, 64)
    assert set(each) == set(CONFIGS) and {"fae", "hotline"} <= set(each)
    for key, opts in each.items():
        ns = parser.parse_args(["train", *train_args(b, tmp_path / "d", tmp_path / key, **opts)])
        assert (ns.checkpoint_every, ns.final_checkpoint) == (250, True), key
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    assert last_checkpoint_step(tmp_path / "run") is None
    (tmp_path / "run" / "checkpoints" / "LATEST").write_text("step-00001000\n")
    assert last_checkpoint_step(tmp_path / "run") == 1000


def test_cluster_skips_in_one_line_without_namespaces(tmp_path, capsys, monkeypatch):
    import json

    import bagpipe.bench.scenarios.cluster.scenario as cluster
    from bagpipe.cli import main

    monkeypatch.setattr(cluster, "unavailable", lambda: "emulated hosts need root (network namespaces, veth, tc)")
    assert main(["bench", "cluster", "--quick", "--out", str(tmp_path / "c")]) == 0
    assert (
        capsys.readouterr().out.splitlines()[0]
        == "bench cluster: skipped: emulated hosts need root (network namespaces, veth, tc)"
    )
    assert json.loads((tmp_path / "c" / "results.json").read_text())["skipped"].startswith("bench cluster: skipped: ")


def test_a_run_a_scenario_did_not_expect_to_fail_is_one_line_naming_it(monkeypatch, tmp_path, run_cli):
    """`bench modes --quick --profile tiny` asked for more cache rows than the tables hold;
    the child train refused, and bench showed a TrainFailed traceback (newcomer round 7)."""
    from bagpipe.bench.harness.runner import TrainFailed

    def fails(b):
        raise TrainFailed("lru/memory", 2, "some progress\nbagpipe train: error: --cache-rows 2,048 is more\n")

    monkeypatch.setitem(SCENARIOS, "modes", dataclasses.replace(SCENARIOS["modes"], run=fails))
    rc, _, err = run_cli("bench", "modes", "--quick", "--out", tmp_path / "b")
    assert rc == 2 and err.strip().splitlines() == [
        "bagpipe bench: error: bench modes: its run lru/memory failed: --cache-rows 2,048 is more"
    ]


def test_the_cache_never_asks_for_more_rows_than_the_tables_hold():
    b = SCENARIOS["modes"].config.quick(out="x")
    assert b.cache_rows(266, 2048) == 266  # tiny tables: every row
    assert b.cache_rows(1_000_000, 2048) == max(int(b.cache_fraction * 1_000_000), 2048)


def test_the_real_data_samples_are_looked_for_beside_the_repository():
    """`bench convergence` and `bench approx` looked in REPO/bagpipe/../shared/data and
    skipped the real Criteo sample as not found (newcomer round 8)."""
    from repo import SHARED_DATA as beside_the_repo

    from bagpipe.bench.scenarios.convergence.scenario import SHARED_DATA

    assert SHARED_DATA == beside_the_repo.resolve()
