"""The systematic guard on input: every command, every option, every bad value ends in one line.

What this proves, for every subcommand argparse knows (``bagpipe --help``'s commands,
each ``preprocess`` format and each ``bench`` scenario), walked from the parsers
themselves so that a new option is covered the day it is added:

* the baseline command line of each command is valid: with the command's work replaced
  by a sentinel, it reaches the work (so a refusal below is caused by the bad value,
  not by the baseline);
* every option that takes a value, given a wrong-type value (``x``, ``1.5`` for an
  int), an empty one, a non-finite one (``nan``, ``inf``, ``-inf``, ``1e400``), an
  out-of-range one (``-1``, 2^64) or a non-UTF-8 one (a surrogate-escaped byte, as
  Python hands a non-UTF-8 argument over), either is refused with exit code 2 and
  exactly one line on stderr and no traceback -- which wrong-type, empty (for paths),
  non-finite and out-of-range values must be -- or (a non-UTF-8 path, a negative number
  an option allows) is accepted and reaches the work; it never raises;
* the same for every setting of ``bagpipe train``'s TOML file (``--config``): values of
  the wrong TOML type, non-finite floats, out-of-range ints, an unknown key, a mistyped
  table name (answered with the table it meant), a file that is not UTF-8;
* random text for random options (hypothesis) never raises;
* bad environment variables (``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
  ``OMP_NUM_THREADS``, ``TORCHELASTIC_RESTART_COUNT``, ``BAGPIPE_TEST_PAUSE``) break
  no command that does not read them (``--version``, ``check``) and are one line,
  naming the variable, in those that do (``worker``, ``serve``); a port above 65535 is
  refused the same way.

Everything runs in this process through ``bagpipe.cli.main`` (the ``run_cli``
fixture), failing at validation before any training; the parser is built once.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bagpipe.cli as cli

pytestmark = pytest.mark.unit

NON_UTF8 = os.fsdecode(b"\xff\xfe")  # what a non-UTF-8 byte argument becomes in Python


class Reached(BaseException):
    """The command got past its validation to its work (raised in place of the work)."""


def reached(*args, **kwargs):
    raise Reached


# -- the commands' work, replaced by the sentinel -------------------------------------

WORK = {
    "train": [("bagpipe.train.loop", "train"), ("bagpipe.distributed.launch", "launch")],
    "plan": [("bagpipe.budget", "memory_plan")],
    "worker": [("bagpipe.distributed.roles", "run_role")],
    "serve": [("bagpipe.distributed.roles", "serve")],
    "eval": [("bagpipe.train.evaluate", "evaluate")],
    "check": [("bagpipe.data.integrity", "check_dataset")],
    "plot": [("bagpipe.train.plot", "plot_runs")],
    "export": [("bagpipe.export.write", "_write")],
    "predict": [("bagpipe.export.score", "predict_file")],
    "profile": [("bagpipe.accel.profile", "profile")],
    "preprocess": [("bagpipe.preprocess.run", "_convert")],
    "synth": [("bagpipe.commands.synth", "generate")],
}


@pytest.fixture(scope="module")
def world(tiny_data, tmp_path_factory):
    """Inputs every command's baseline needs: the tiny data set, a finished run of it, its
    export, a raw Criteo, Avazu and Taobao file, a hot-row file."""
    from bagpipe.cli import main

    root = tmp_path_factory.mktemp("guard")
    run = root / "run"
    assert (
        main(
            [
                "train",
                "--data",
                tiny_data,
                "--out",
                str(run),
                "--steps",
                "3",
                "--batch-size",
                "64",
                "--no-progress",
                "--threads",
                "1",
                "--no-digest",
            ]
        )
        == 0
    )
    export = root / "export"
    assert main(["export", "--run", str(run), "--out", str(export)]) == 0
    hot = root / "hot.npz"
    assert main(["profile", "--data", tiny_data, "--hot-budget-mb", "0.01", "--out", str(hot), "--no-progress"]) == 0
    raw = root / "raw.tsv"
    raw.write_text("1\t" + "\t".join(["1"] * 13) + "\t" + "\t".join(["a1"] * 26) + "\n")
    return {"data": tiny_data, "run": str(run), "export": str(export), "raw": str(raw), "hot": str(hot), "root": root}


def baselines(w: dict, out: Path) -> dict[tuple[str, ...], list[str]]:
    """A valid command line per leaf command (the path of subcommand names -> its options)."""
    d, o = w["data"], str(out / "o")
    train = ["--data", d, "--out", o, "--steps", "2", "--batch-size", "64", "--no-progress"]
    dist = ["--mode", "lookahead", "--trainers", "1", "--servers", "1"]
    lines: dict[tuple[str, ...], list[str]] = {
        ("synth",): ["--profile", "tiny", "--samples", "1000", "--out", o, "--no-progress"],
        ("profile",): ["--data", d, "--hot-budget-mb", "0.01", "--no-progress"],
        ("train",): train,
        ("plan",): ["--data", d, "--batch-size", "64"],
        ("eval",): ["--run", w["run"], "--data", d],
        ("check",): [d, "--no-progress"],
        ("plot",): [w["run"], "--out", str(out / "c.png")],
        ("export",): ["--run", w["run"], "--out", o],
        ("predict",): ["--model", w["export"], "--input", w["raw"], "--out", str(out / "p.txt")],
        ("serve",): ["--rank", "1", "--trainers", "1", "--servers", "1"],
        ("worker",): [*train, *dist],
    }
    for fmt in ("criteo", "avazu", "taobao"):
        lines[("preprocess", fmt)] = ["--input", w["raw"], "--out", o, "--max-rows-per-table", "10", "--no-progress"]
    from bagpipe.bench.registry import SCENARIOS

    for name in SCENARIOS:
        lines[("bench", name)] = ["--out", o]
    return lines


def leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(path, parser) of every leaf subcommand."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
        return
    for name, p in subs[0].choices.items():
        yield from leaves(p, path + (name,))


def kind(action: argparse.Action) -> str | None:
    """int, float, tuple, choice or str: what an option takes (None: a switch)."""
    if action.nargs == 0 or isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
        return None
    if action.choices is not None:
        return "choice"
    t = action.type
    if t is None or t is str:
        return "str"
    assert callable(t), t  # not a name in argparse's registry of types (none is used)
    for probe in ("1", "1.5"):
        try:
            v = t(probe)
        except (ValueError, TypeError, argparse.ArgumentTypeError):
            continue
        if isinstance(v, tuple):
            return "tuple"
        if isinstance(v, int) and not isinstance(v, bool):
            return "int"
        if isinstance(v, float):
            return "float"
    return "str"


#: value -> must it be refused? (False: it may also be accepted; it may never raise)
BAD = {
    "int": {"x": True, "": True, "1.5": True, "nan": True, "-1": True, str(2**64): True, NON_UTF8: True},
    "float": {"x": True, "": True, "nan": True, "inf": True, "-inf": True, "1e400": True, "-1": True, NON_UTF8: True},
    "tuple": {"x": True, "nan": True, "1,x": True, NON_UTF8: True},
    "choice": {"bogus": True, "": True, NON_UTF8: True},
    "str": {"": True, NON_UTF8: False},
}
#: Options whose negative values, empty text or non-UTF-8 text are meaningful, with why.
MAY_ACCEPT = {
    ("plot", "--title", ""): "an empty title is no title",
    ("plot", "--labels", ""): "an empty legend name",
    ("plot", "--labels", NON_UTF8): "any text labels a curve",
    ("plot", "--title", NON_UTF8): "any text is a title",
}


@pytest.fixture
def guarded(monkeypatch, world, tmp_path, run_cli):
    """``call(args) -> (outcome, rc, err)``: outcome "reached" (the work), "exit" or
    "raised" (an exception escaped main: the defect this guards against)."""
    from bagpipe.bench.registry import SCENARIOS

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda load=None: parser)
    for targets in WORK.values():
        for module, name in targets:
            monkeypatch.setattr(f"{module}.{name}", reached)
    for name, s in SCENARIOS.items():
        monkeypatch.setitem(SCENARIOS, name, dataclasses.replace(s, run=reached))
    for var in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29999")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.chdir(tmp_path)
    return Guarded(parser, run_cli)


class Guarded:
    """The ``guarded`` fixture: called as ``guarded(args)``; ``parser`` is the one ``main`` uses."""

    def __init__(self, parser: argparse.ArgumentParser, run_cli) -> None:
        self.parser, self.run_cli = parser, run_cli

    def __call__(self, args) -> tuple[str, int | None, str]:
        try:
            rc, _, err = self.run_cli(*args)
        except Reached:
            return "reached", None, ""
        except Exception as e:  # noqa: BLE001 - the finding
            return "raised", None, f"{type(e).__name__}: {e}"
        return "exit", rc, err


def one_line(rc, err) -> bool:
    lines = err.strip().splitlines()
    return rc == 2 and len(lines) == 1 and "Traceback" not in err and ": error: " in lines[0]


def test_every_option_refuses_bad_values_in_one_line(guarded, world, tmp_path):
    lines = baselines(world, tmp_path)
    found, walked = [], 0
    for path, parser in leaves(guarded.parser):
        base = lines[path]
        outcome, rc, err = guarded([*path, *base])
        assert outcome == "reached", f"the baseline of {' '.join(path)} is refused: {err}"
        for action in parser._actions:
            k = kind(action)
            if k is None or not action.option_strings:
                continue
            opt = action.option_strings[-1]
            for value, must_refuse in BAD[k].items():
                walked += 1
                outcome, rc, err = guarded([*path, *base, opt, value])
                label = f"{' '.join(path)} {opt} {value!r}"
                if outcome == "raised":
                    found.append(f"{label}: raised {err}")
                elif outcome == "exit" and not one_line(rc, err):
                    found.append(f"{label}: exit {rc}, stderr {err!r}")
                elif outcome == "reached" and must_refuse and (path[0], opt, value) not in MAY_ACCEPT:
                    found.append(f"{label}: accepted")
    assert walked > 900  # every command's options were walked (a parser change that hides them fails here)
    assert not found, f"{len(found)} of {walked}:\n" + "\n".join(found)


def toml_values(tp) -> dict:
    """Wrong-type, non-finite and out-of-range TOML literals for a setting of type ``tp``."""
    from bagpipe.config.typed import choices, strip_optional

    base = strip_optional(tp)
    bad = {"[1, 2]": True, "{ a = 1 }": True, "1979-05-27": True}
    if base is bool:
        bad |= {'"yes"': True, "1": True}
    elif choices(tp) is not None:
        bad |= {'"bogus"': True, "1": True}
    elif base is int:
        bad |= {'"3"': True, "1.5": True, "true": True, "-1": True, "9223372036854775807": False}
    elif base is float:
        bad |= {'"0.1"': True, "nan": True, "inf": True, "-inf": True, "-1.0": True}
    elif base is str:
        bad |= {"1": True, "true": True, '""': True}
    return bad


#: Settings that accept these TOML values, and why (the walk then requires no traceback only).
TOML_MAY_ACCEPT: dict = {}


def test_every_toml_setting_refuses_bad_values_in_one_line(guarded, world, tmp_path):
    from bagpipe.config.options import settings
    from bagpipe.config.train import TrainConfig
    from bagpipe.config.typed import field_types

    base = ["train", "--data", world["data"], "--out", str(tmp_path / "o")]
    found, walked = [], 0
    for name, (section, cls) in settings(TrainConfig).items():
        if name in ("data", "out"):  # the command line's win over the file
            continue
        for literal, must in toml_values(field_types(cls)[name]).items():
            for where in ("top", "table"):
                walked += 1
                text = f"{name} = {literal}\n" if where == "top" else f"[{section}]\n{name} = {literal}\n"
                f = tmp_path / "c.toml"
                f.write_text(text)
                outcome, rc, err = guarded([*base, "--config", f])
                label = f"{where} {name} = {literal}"
                if outcome == "raised":
                    found.append(f"{label}: raised {err}")
                elif outcome == "exit" and not one_line(rc, err):
                    found.append(f"{label}: exit {rc}, {err!r}")
                elif outcome == "reached" and must and (name, literal) not in TOML_MAY_ACCEPT:
                    found.append(f"{label}: accepted")
    assert walked > 500
    assert not found, f"{len(found)} of {walked}:\n" + "\n".join(found)


def test_config_file_mistakes_are_one_line_naming_what_is_wrong(guarded, world, tmp_path):
    base = ["train", "--data", world["data"], "--out", str(tmp_path / "o"), "--no-progress"]
    f = tmp_path / "c.toml"
    cases = {
        b"[cahce]\ncache_rows = 5\n": "unknown table [cahce]; did you mean [cache]?",
        b"cache_rowz = 5\n": "unknown key 'cache_rowz'; did you mean 'cache_rows'?",
        b"[cache]\nlr = 0.1\n": "key 'lr' belongs in [optim], not [cache]",
        # a misspelt value gets the command line's "did you mean" (bagpipe.config.typed.closest)
        b'mode = "lookahed"\n': (
            "c.toml: mode must be one of 'full', 'nocache', 'lru', 'lookahead', 'fae', 'hotline', "
            "got 'lookahed'; did you mean 'lookahead'?"
        ),
        b'[hot]\nfae_schedule = "splt"\n': "fae_schedule must be one of 'keep', 'split', got 'splt'; did you mean 'split'?",
        b"steps = 5\nsteps = 6\n": "c.toml",
        b'title = "caf\xe9"\n': "not UTF-8 text",
        b"steps = \n": "c.toml",
    }
    for text, fragment in cases.items():
        f.write_bytes(text)
        outcome, rc, err = guarded([*base, "--config", f])
        assert outcome == "exit" and one_line(rc, err) and fragment in err, (text, outcome, err)
    outcome, rc, err = guarded([*base, "--config", tmp_path])
    assert outcome == "exit" and one_line(rc, err), err
    for text in (b'mode = "zzz"\n', b"mode = 3\n"):  # nothing close: no suggestion
        f.write_bytes(text)
        outcome, rc, err = guarded([*base, "--config", f])
        assert outcome == "exit" and one_line(rc, err) and "did you mean" not in err, (text, err)
        assert "c.toml: mode must be one of 'full', " in err, err


@pytest.mark.parametrize("opt", ["--summary-json", "--out", "--tensorboard", "--data"])
def test_a_nul_byte_in_a_path_is_one_line(guarded, world, tmp_path, opt):
    """A NUL byte in a path (a config file's "\\u0000"; hypothesis found it in
    --summary-json): a traceback from the first system call that met it, now one line."""
    base = ["train", "--data", world["data"], "--out", str(tmp_path / "o"), "--steps", "2", "--no-progress"]
    outcome, rc, err = guarded([*base, f"{opt}=a\0b"])
    assert outcome == "exit" and one_line(rc, err), err
    assert "NUL byte" in err and ("give another" in err), err


def test_a_misspelt_choice_built_in_python_gets_the_same_suggestion():
    from bagpipe.config.sections import CacheConfig
    from bagpipe.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        CacheConfig(mode="lru ")
    assert str(e.value) == (
        "mode must be one of 'full', 'nocache', 'lru', 'lookahead', 'fae', 'hotline', got 'lru '; did you mean 'lru'?"
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_text_in_any_train_option_never_raises(guarded, world, tmp_path, data):
    parser = guarded.parser._subparsers._group_actions[0].choices["train"]
    options = sorted(a.option_strings[-1] for a in parser._actions if a.option_strings and kind(a) is not None)
    opt = data.draw(st.sampled_from(options))
    value = data.draw(
        st.lists(st.sampled_from([NON_UTF8, "\n", "-", "nan", "1e400", ","]) | st.text(max_size=4), max_size=4).map(
            "".join
        )
    )
    base = ["train", "--data", world["data"], "--out", str(tmp_path / "o"), "--steps", "2", "--no-progress"]
    outcome, rc, err = guarded([*base, f"{opt}={value}"])
    assert outcome != "raised", err
    assert outcome == "reached" or one_line(rc, err), err


# -- environment variables ----------------------------------------------------------------

BAD_ENV = {
    "MASTER_PORT": ["x", "", "70000", "-5", NON_UTF8],
    "RANK": ["x", "-1", "7", NON_UTF8],
    "WORLD_SIZE": ["x", "0", "4"],
    "LOCAL_RANK": ["x", "-1", NON_UTF8],
    "OMP_NUM_THREADS": ["x", "-2"],
    "TORCHELASTIC_RESTART_COUNT": ["x"],
    "BAGPIPE_TEST_PAUSE": ["nonsense"],
}


@pytest.mark.parametrize("var", BAD_ENV)
def test_bad_environment_variables_are_one_line_and_only_where_read(guarded, world, tmp_path, monkeypatch, var):
    train = [
        "--data",
        world["data"],
        "--out",
        str(tmp_path / "o"),
        "--steps",
        "2",
        "--no-progress",
        "--mode",
        "lookahead",
        "--trainers",
        "1",
        "--servers",
        "1",
    ]
    for value in BAD_ENV[var]:
        monkeypatch.setenv(var, value)
        for args in (["--version"], ["check", world["data"], "--no-progress"]):
            outcome, rc, err = guarded(args)
            assert outcome in ("reached", "exit") and rc in (None, 0), (var, value, args, err)
        for args in (["worker", *train], ["serve", "--trainers", "1", "--servers", "1"]):
            outcome, rc, err = guarded(args)
            assert outcome != "raised", (var, value, args, err)
            if outcome == "exit":
                assert one_line(rc, err), (var, value, args, err)
                if value:
                    assert var in err or var == "OMP_NUM_THREADS", (var, value, err)


def test_a_port_above_65535_is_refused(guarded):
    outcome, rc, err = guarded(["serve", "--rank", "1", "--trainers", "1", "--servers", "1", "--master-port", "70000"])
    assert (
        outcome == "exit" and one_line(rc, err) and "--master-port must be an integer in [1, 65535], got 70000" in err
    )
