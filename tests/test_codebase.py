"""The codebase's own rules, checked so that they stay true.

* No import cycle inside ``bagpipe/``: the graph of every ``import`` statement (lazy
  ones inside functions included, ``if TYPE_CHECKING:`` blocks excluded) has no
  strongly connected component larger than one module, and the graph of its folders
  (each module counted in its top-level folder; a module at the top is its own node)
  has none either: every arrow between concepts runs one way.
* "Mode" has one home: no module but ``bagpipe/config/modes.py`` compares a mode's name
  (a string of the table of modes compared with something named like a mode or a
  planner); every mode's planner, step and executor are registered.
* The linter, the formatter and the type checker are clean on ``bagpipe/`` (ruff check,
  ruff format --check, mypy: what ``make lint`` runs).
* No module under ``bagpipe/`` is longer than 500 lines unless its docstring says why
  (the phrase "long because").
* ``bagpipe train --help`` and the TOML loader agree setting for setting: every
  setting of :class:`TrainConfig` has its ``--option`` in the help, and a TOML file
  giving it a value yields exactly the config the command line gives (or the same
  one-line error).
"""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from bagpipe.config import settings
from bagpipe.config.options import flag
from bagpipe.config.train import TrainConfig, load_config
from bagpipe.config.typed import choices, field_types, strip_optional
from bagpipe.errors import ConfigError

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[1] / "bagpipe"
MAX_LINES = 500


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, name: str, known: set[str]) -> set[str]:
    """Modules of ``known`` that the file at ``path`` imports (anywhere but TYPE_CHECKING blocks)."""
    found: set[str] = set()
    is_pkg = path.name == "__init__.py"

    class Visitor(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            t = node.test
            if getattr(t, "id", None) == "TYPE_CHECKING" or getattr(t, "attr", None) == "TYPE_CHECKING":
                for n in node.orelse:
                    self.visit(n)
                return
            self.generic_visit(node)

        def visit_Import(self, node: ast.Import) -> None:
            found.update(a.name for a in node.names)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_pkg else 0)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.add(mod)
            found.update(f"{mod}.{a.name}" for a in node.names)

    Visitor().visit(ast.parse(path.read_text()))
    out = set()
    for m in found:
        while m and m not in known:
            m = m.rpartition(".")[0]
        if m and m != name:
            out.add(m)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def import_graph(package: Path) -> dict[str, set[str]]:
    files = {module_name(p): p for p in package.rglob("*.py")}
    return {name: imported_modules(p, name, set(files)) for name, p in files.items()}


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_inside_bagpipe():
    graph = import_graph(PACKAGE)
    assert "bagpipe.models.config" in graph["bagpipe.models.dlrm"]  # the graph sees real imports
    assert cycles(graph) == []


def folder_of(module: str) -> str:
    """``bagpipe.train.step.plain`` -> ``train``; a module at the top is its own node."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()) else module


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for a, bs in graph.items():
        out.setdefault(folder_of(a), set()).update(folder_of(b) for b in bs if folder_of(b) != folder_of(a))
    for targets in list(out.values()):
        for t in targets:
            out.setdefault(t, set())
    return out


def test_no_import_cycle_between_folders():
    graph = folder_graph(import_graph(PACKAGE))
    assert "oracle" in graph["train"] and "train" in graph["distributed"]  # the graph sees the folders
    assert cycles({"a.x": {"b"}, "b": {"a.x"}}) == [["a.x", "b"]]
    assert cycles(graph) == [], "folders that import each other (an arrow that runs back up)"


def mode_comparisons(path: Path) -> list[str]:
    """Comparisons in ``path`` of a mode's name with something named like a mode or a planner."""
    from bagpipe.config.modes import MODES

    def strings(node: ast.AST) -> set[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value}
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        return set()

    def names(node: ast.AST) -> set[str]:
        return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
            n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
        }

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if set().union(*map(strings, sides)) & set(MODES) and any(
                "mode" in n or "planner" in n for n in set().union(*map(names, sides))
            ):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_mode_comparison_finder_finds_one(tmp_path):
    sample = PACKAGE / "config" / "_sample_for_test.py"
    try:
        sample.write_text('if cfg.cache.mode in ("fae", "hotline"):\n    pass\nif kind == "full":\n    pass\n')
        assert mode_comparisons(sample) == [
            "bagpipe/config/_sample_for_test.py:1: cfg.cache.mode in ('fae', 'hotline')"
        ]
    finally:
        sample.unlink()


def test_no_mode_name_comparisons_outside_the_mode_table():
    found = [
        hit
        for p in sorted(PACKAGE.rglob("*.py"))
        if p != PACKAGE / "config" / "modes.py"
        for hit in mode_comparisons(p)
    ]
    assert not found, "compare the mode's ModeSpec (cfg.cache.spec), not its name: " + "; ".join(found)


def test_every_mode_is_registered():
    from typing import get_args

    from bagpipe.cache import EXECUTORS
    from bagpipe.config.modes import MODE_TABLE, MODES, Mode
    from bagpipe.oracle.planners import PLANNERS
    from bagpipe.train.step import STEPS

    assert get_args(Mode) == tuple(MODES) == tuple(m.name for m in MODE_TABLE)
    for m in MODE_TABLE:
        assert m.planner is None or m.planner in PLANNERS, m
        assert m.step in STEPS and m.executor in EXECUTORS, m
        assert not m.pipelined or m.looks_ahead, f"{m.name}: only plans made ahead can be executed ahead"


LINTED = ("bagpipe", "tests", "benchmarks", "tools")
"""What ruff checks and formats (mypy's files are listed in pyproject.toml)."""


def _tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=PACKAGE.parent, capture_output=True, text=True, timeout=240
    )


def test_lint_and_format_are_clean():
    lint = _tool("ruff", "check", "--no-cache", *LINTED)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    fmt = _tool("ruff", "format", "--no-cache", "--check", *LINTED)
    assert fmt.returncode == 0, "run `ruff format " + " ".join(LINTED) + "`: " + fmt.stdout + fmt.stderr


def test_type_check_is_clean():
    check = _tool("mypy")
    assert check.returncode == 0, check.stdout + check.stderr


def test_no_long_module_without_a_reason():
    long = []
    for p in sorted(PACKAGE.rglob("*.py")):
        n = len(p.read_text().splitlines())
        if n > MAX_LINES and "long because" not in (ast.get_docstring(ast.parse(p.read_text())) or ""):
            long.append(f"{p.relative_to(PACKAGE.parent)} ({n} lines)")
    assert not long, "modules over 500 lines without a stated reason: " + ", ".join(long)


def test_old_dist_package_is_gone():
    assert not (PACKAGE / "dist").exists() and (PACKAGE / "distributed" / "trainer.py").exists()


# --------------------------------------------------------------------------- --help vs TOML


def other_value(key: str):
    """A value for setting ``key`` that differs from its default and has its type."""
    _, cls = settings(TrainConfig)[key]
    f = next(f for f in dataclasses.fields(cls) if f.name == key)
    tp = field_types(cls)[key]
    default = None if f.default is dataclasses.MISSING else f.default
    opts = choices(tp)
    if opts is not None:
        return next(c for c in opts if c != default)
    base = strip_optional(tp)
    if base is bool:
        return not default
    if base is int:
        return (default or 0) + 3
    if base is float:
        return (default or 0.0) + 0.25
    if base is str:
        return f"/tmp/some-{key}"
    raise AssertionError(f"no sample value for {key}: {tp}")


def toml_literal(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


def cli_words(key: str, value) -> list[str]:
    if isinstance(value, bool):
        return [flag(key) if value else "--no-" + key.replace("_", "-")]
    return [flag(key), str(value)]


def test_help_names_every_setting(run_cli):
    rc, out, _ = run_cli("train", "--help")
    assert rc == 0
    for key, (section, _) in settings(TrainConfig).items():
        assert flag(key) in out, key
        assert f"[{section}]" in out  # the group says which TOML table holds the key


@pytest.mark.parametrize("key", sorted(settings(TrainConfig)))
def test_toml_key_and_option_agree(key, tmp_path):
    from bagpipe.cli import build_parser
    from bagpipe.config import given

    base = {"data": "/tmp/d", "out": "/tmp/o"}
    value = other_value(key)
    settings_ = base | {key: value}
    section = settings(TrainConfig)[key][0]
    flat = tmp_path / "flat.toml"
    flat.write_text("".join(f"{k} = {toml_literal(v)}\n" for k, v in settings_.items()))
    tabled = tmp_path / "tabled.toml"
    tabled.write_text(f"[{section}]\n{key} = {toml_literal(value)}\n")
    args = build_parser().parse_args(
        ["train", *cli_words(key, value), *(w for k, v in base.items() if k != key for w in cli_words(k, v))]
    )
    outcomes = []
    for load in (
        lambda: load_config(str(flat), {}),
        lambda: load_config(str(tabled), {k: v for k, v in base.items() if k != key}),
        lambda: load_config(None, given(args, TrainConfig)),
    ):
        try:
            outcomes.append(("ok", load().to_json()))
        except ConfigError as e:
            outcomes.append(("error", str(e).split(": ", 1)[-1]))
    assert outcomes[0] == outcomes[1] == outcomes[2], outcomes
    if outcomes[0][0] == "ok":
        got = outcomes[0][1][section][key]
        assert (tuple(got) if isinstance(got, list) else got) == value


def test_wrong_type_in_toml_names_file_and_key(tmp_path):
    conf = tmp_path / "run.toml"
    conf.write_text('data = "d"\nout = "o"\n[cache]\nlookahead = "eight"\n')
    with pytest.raises(ConfigError, match=rf"^{conf}: lookahead must be an int, got 'eight'$"):
        load_config(str(conf), {})


def test_every_summary_field_is_documented_in_runs_md():
    from bagpipe.config.typed import field_docs
    from bagpipe.train import summary

    text = (PACKAGE.parent / "docs" / "runs.md").read_text()
    sections = (summary.Summary, summary.StepTimes, summary.IoPerStep, summary.CacheStats, summary.DistributedStats,
                summary.CheckpointStats, summary.EndOfRun, summary.Approximation, summary.MemoryReport,
                summary.ThreadTime)  # fmt: skip
    for cls in sections:
        docs = field_docs(cls)
        assert set(docs) == {f.name for f in dataclasses.fields(cls)}, f"{cls.__name__}: a field without a docstring"
        missing = [k for k in docs if f"| `{k}` |" not in text]
        assert not missing, f"docs/runs.md does not list {cls.__name__}'s {missing}"
