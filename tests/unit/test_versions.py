"""The torch versions bagpipe runs under (``bagpipe/versions.py``): 2.11 and later.

* pyproject.toml's pin (what ``make setup`` installs) lies in the supported range, and
  its ``[tool.bagpipe] torch-minimum`` is the package's own minimum;
* the README states that range;
* every torch name the code spells out (``torch.x.y`` paths, ``import torch...`` and
  ``from torch... import``) is in the list of names checked against torch 2.11, and every
  listed name is used and exists in the installed torch -- so a newer API cannot slip in
  unnoticed, and the list cannot go stale.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest
import tomllib
from repo import ROOT

from bagpipe.versions import TORCH_API, TORCH_MINIMUM, version_tuple

pytestmark = pytest.mark.unit


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def pinned_torch() -> str:
    pins = [d for d in pyproject()["project"]["dependencies"] if re.match(r"torch\s*[=<>~!]", d)]
    assert len(pins) == 1, pins
    m = re.fullmatch(r"torch==([\d.]+)", pins[0].replace(" ", ""))
    assert m, f"torch is pinned to one version: {pins[0]}"
    return m.group(1)


def test_the_pin_lies_in_the_supported_range_and_pyproject_states_the_minimum():
    minimum = pyproject()["tool"]["bagpipe"]["torch-minimum"]
    assert version_tuple(minimum) == TORCH_MINIMUM == (2, 11)
    assert version_tuple(pinned_torch()) >= TORCH_MINIMUM
    assert version_tuple("2.11.0+cu130") == (2, 11) and version_tuple("2.13.0") == (2, 13)


def test_the_readme_states_the_supported_range():
    readme = (ROOT / "README.md").read_text()
    low = ".".join(map(str, TORCH_MINIMUM))
    assert f"torch {low} and later" in readme
    assert f"torch=={pinned_torch()}" in readme


def torch_names(root: Path) -> dict[str, str]:
    """Every torch name spelled out under ``root`` -> the first file that spells it."""
    found: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Attribute) and id(node) not in inner:
                parts: list[str] = []
                n: ast.expr = node
                while isinstance(n, ast.Attribute):
                    parts.append(n.attr)
                    n = n.value
                if isinstance(n, ast.Name) and n.id == "torch":
                    names.append(".".join(["torch", *reversed(parts)]))
            elif isinstance(node, ast.Import):
                names += [a.name for a in node.names if a.name.startswith("torch.")]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
                names += [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                found.setdefault(name, str(path.relative_to(root.parent)))
    return found


def test_the_code_spells_only_torch_names_checked_against_the_minimum():
    found = torch_names(ROOT / "bagpipe")
    assert "torch.cuda.Stream" in found and "torch.nn.parallel.DistributedDataParallel" in found  # it sees them
    new = {n: f for n, f in found.items() if n not in TORCH_API}
    assert not new, f"torch names not in bagpipe/versions.py's TORCH_API (check they exist in torch 2.11): {new}"
    assert not TORCH_API - set(found), f"listed but unused: {sorted(TORCH_API - set(found))}"


def test_a_name_outside_the_list_is_found(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("import torch\nfrom torch.foo import bar\nx = torch.brand.new(1)\n")
    assert set(torch_names(tmp_path / "pkg")) == {"torch.foo.bar", "torch.brand.new"}


def resolve(name: str):
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError as e:
            if e.name and not e.name.startswith("torch"):
                pytest.skip(f"{name} needs the optional package {e.name}")
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise AssertionError(name)


@pytest.mark.parametrize("name", sorted(TORCH_API))
def test_every_listed_torch_name_exists_in_the_installed_torch(name):
    resolve(name)  # an AttributeError or ImportError when this torch lacks it (torch.version.cuda may be None)
