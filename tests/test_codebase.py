"""The codebase's own rules, checked so that they stay true.

* No import cycle inside ``bagpipe/``: the graph of every ``import`` statement (lazy
  ones inside functions included, ``if TYPE_CHECKING:`` blocks excluded) has no
  strongly connected component larger than one module.
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
    args = build_parser().parse_args(["train", *cli_words(key, value), *(w for k, v in base.items() if k != key for w in cli_words(k, v))])
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
