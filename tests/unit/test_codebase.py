"""The codebase's own rules, checked so that they stay true.

* No import cycle inside ``bagpipe/``: the graph of every ``import`` statement (lazy
  ones inside functions and ``if TYPE_CHECKING:`` blocks included: a cycle a type
  checker needs is still two modules that cannot be read apart) has no strongly
  connected component larger than one module, and the graph of its folders (each
  module counted in its top-level folder; a module at the top is its own node) has
  none either: every arrow between concepts runs one way.
* No module or package under ``bagpipe/bench/`` is named like a package or top-level
  module of ``bagpipe/`` (a scenario named ``memory`` beside the ``memory`` package).
* "Mode" has one home: no module but ``bagpipe/config/modes.py`` compares a mode's name
  (a string of the table of modes compared with something named like a mode or a
  planner); every mode's planner, step and executor are registered.
* The linter, the formatter and the type checker are clean on ``bagpipe/``, ``tests/``,
  ``benchmarks/`` and ``tools/`` (ruff check, ruff format --check, mypy with
  ``check_untyped_defs``: what ``make lint`` runs).
* No module under ``bagpipe/`` is longer than 500 lines unless its docstring says why
  (the phrase "long because").
* The test of a module is found from its path (tests/README.md): no test module sits
  directly in ``tests/``, each lies in ``unit/``, ``integration/``, ``distributed/`` or
  ``gpu/``, every folder ``tests/unit/<package>/`` names a folder ``bagpipe/<package>/``,
  and no two test modules share a file name (pytest and mypy import them by it).
* No function under ``bagpipe/train/`` is longer than 80 lines (from its ``def`` to its
  last line): the loop and its parts stay readable one piece at a time.
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
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from repo import PACKAGE

from bagpipe.config import settings
from bagpipe.config.options import flag
from bagpipe.config.train import TrainConfig, load_config
from bagpipe.config.typed import choices, field_types, strip_optional
from bagpipe.errors import ConfigError

pytestmark = pytest.mark.unit

MAX_LINES = 500


def module_name(path: Path, root: Path = PACKAGE.parent) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, name: str, known: set[str]) -> set[str]:
    """Modules of ``known`` that the file at ``path`` imports, anywhere in it (functions and
    ``if TYPE_CHECKING:`` blocks too)."""
    found: set[str] = set()
    is_pkg = path.name == "__init__.py"

    class Visitor(ast.NodeVisitor):
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
    files = {module_name(p, package.parent): p for p in package.rglob("*.py")}
    return {name: imported_modules(p, name, set(files)) for name, p in files.items()}


def cycle_path(graph: dict[str, set[str]], component: list[str]) -> str:
    """A shortest cycle through ``component`` (a strongly connected one), as ``a -> b -> a``."""
    start, inside = component[0], set(component)
    came_from: dict[str, str] = {}  # breadth first from start until an arrow leads back to it
    frontier = [start]
    while start not in came_from:
        reached = []
        for v in frontier:
            for w in sorted(graph[v] & inside):
                if w not in came_from:
                    came_from[w] = v
                    reached.append(w)
        frontier = reached
    path = [start]
    while len(path) == 1 or path[-1] != start:
        path.append(came_from[path[-1]])
    return " -> ".join(reversed(path))


def cycle_report(graph: dict[str, set[str]]) -> str:
    return "\n".join(cycle_path(graph, c) for c in cycles(graph))


def test_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycle_report(graph) == "a -> b -> c -> a"
    assert cycles({"a": {"b"}, "b": set()}) == [] and cycle_report({"a": {"b"}, "b": set()}) == ""


def test_import_graph_sees_type_checking_and_lazy_imports(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n")
    graph = import_graph(pkg)
    assert graph["pkg.a"] == {"pkg.b"} and "pkg.a" in graph["pkg.b"]
    assert cycle_report(graph) == "pkg.a -> pkg.b -> pkg.a"


def test_no_import_cycle_inside_bagpipe():
    graph = import_graph(PACKAGE)
    assert "bagpipe.models.config" in graph["bagpipe.models.dlrm"]  # the graph sees real imports
    assert cycles(graph) == [], f"modules that import each other (TYPE_CHECKING imports count):\n{cycle_report(graph)}"


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
    assert cycles(graph) == [], f"folders that import each other (an arrow that runs back up):\n{cycle_report(graph)}"


def core_names(package: Path) -> set[str]:
    """The names ``package`` gives its subpackages and its top-level modules."""
    return {
        p.stem
        for p in package.iterdir()
        if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and not p.stem.startswith("__"))
    }


def named_like(folder: Path, names: set[str]) -> list[str]:
    """Modules and packages under ``folder`` whose name is one of ``names``."""
    return sorted(
        str(p.relative_to(folder.parent))
        for p in folder.rglob("*")
        if (p.suffix == ".py" or (p / "__init__.py").exists()) and p.stem in names
    )


def test_no_bench_module_named_like_a_core_package(tmp_path):
    names = core_names(PACKAGE)
    assert {"budget", "oracle", "config", "accel", "distributed", "bench", "errors"} <= names
    (tmp_path / "bench" / "budget").mkdir(parents=True)
    (tmp_path / "bench" / "budget" / "__init__.py").write_text("")
    (tmp_path / "bench" / "config.py").write_text("")
    (tmp_path / "bench" / "peak_memory.py").write_text("")
    assert named_like(tmp_path / "bench", names) == ["bench/budget", "bench/config.py"]
    clashes = named_like(PACKAGE / "bench", names)
    assert clashes == [], f"named like a package or module of bagpipe/ (rename for what it measures): {clashes}"


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


MAX_FUNCTION_LINES = 80


def long_functions(root: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """Every function (methods and nested ones too) under ``root`` longer than ``limit``
    lines, counted from its ``def`` to its last line (decorators not counted)."""
    long = []
    for p in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno is not None
                n = node.end_lineno - node.lineno + 1
                if n > limit:
                    long.append(f"{p.relative_to(root.parent)}:{node.lineno} {node.name} ({n} lines)")
    return long


def test_long_function_finder_finds_one(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    body = "".join(f"        x{i} = {i}\n" for i in range(80))
    (pkg / "m.py").write_text(f"def short():\n    return 1\n\n\nclass C:\n    def long(self):\n{body}")
    assert long_functions(pkg) == ["pkg/m.py:6 long (81 lines)"]


def test_no_long_function_in_train():
    long = long_functions(PACKAGE / "train")
    assert not long, f"functions in bagpipe/train/ over {MAX_FUNCTION_LINES} lines: " + ", ".join(long)


def test_old_dist_package_is_gone():
    assert not (PACKAGE / "dist").exists() and (PACKAGE / "distributed" / "trainer.py").exists()


TESTS = PACKAGE.parent / "tests"
TEST_FOLDERS = ("unit", "integration", "distributed", "gpu")
"""tests/README.md's folders: unit/ (its modules in unit/<package>/ beside codebase-wide ones), the rest by tier."""


def test_the_test_of_a_module_is_found_from_its_path():
    modules = sorted(TESTS.rglob("test_*.py"))
    at_top = [p.name for p in modules if p.parent == TESTS]
    assert not at_top, f"test modules directly in tests/ (move each into one of {'/, '.join(TEST_FOLDERS)}/): {at_top}"
    outside = sorted({str(p.relative_to(TESTS).parts[0]) for p in modules} - set(TEST_FOLDERS))
    assert not outside, f"test folders other than tests/README.md's {TEST_FOLDERS}: {outside}"
    unit = TESTS / "unit"
    unknown = [
        str(p.relative_to(TESTS))
        for p in modules
        if p.parent != unit and p.is_relative_to(unit) and not (PACKAGE / p.relative_to(unit).parts[0]).is_dir()
    ]
    assert not unknown, f"tests/unit/<package>/ that names no bagpipe/<package>/: {unknown}"
    # pytest imports each test module by its file name (no __init__.py), and so does mypy
    same = sorted(name for name, n in Counter(p.name for p in modules).items() if n > 1)
    assert not same, f"test modules sharing a file name: {same}"


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

    base = {"data": "/tmp/d", "out": "/tmp/o", "steps": 3}  # a length: one epoch of /tmp/d would read it
    value = other_value(key)
    settings_ = base | {key: value}
    section = settings(TrainConfig)[key][0]
    flat = tmp_path / "flat.toml"
    flat.write_text("".join(f"{k} = {toml_literal(v)}\n" for k, v in settings_.items()))
    tabled = tmp_path / "tabled.toml"
    # the run's length: a command-line --steps overrides a file's epochs (load_config), so
    # for epochs the tabled file holds the length too, as the flat one does
    in_file = {"steps": base["steps"]} if key == "epochs" else {}
    tabled.write_text(
        "".join(f"{k} = {toml_literal(v)}\n" for k, v in in_file.items())
        + f"[{section}]\n{key} = {toml_literal(value)}\n"
    )
    args = build_parser().parse_args(
        ["train", *cli_words(key, value), *(w for k, v in base.items() if k != key for w in cli_words(k, v))]
    )
    outcomes: list[tuple[str, Any]] = []  # ("ok", the config's JSON) or ("error", its message)
    for load in (
        lambda: load_config(str(flat), {}),
        lambda: load_config(str(tabled), {k: v for k, v in base.items() if k != key and k not in in_file}),
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
