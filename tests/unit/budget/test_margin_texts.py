"""Every text that states the memory budget's margin states the one the code keeps.

The budget plans for M x (1 - ``MARGIN``) (:mod:`bagpipe.budget.sizing`); the help of
``--memory-budget-mb`` and ``--device-memory-budget-mb`` (``train --help``, ``plan
--help``), docs/beyond-memory.md and ``plan``'s own description say what share is kept
free. A percentage "kept free" that is not ``MARGIN``'s fails here, so the texts cannot
drift from the code again (they said 10% while the code kept 15%).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bagpipe.budget.sizing import MARGIN
from bagpipe.config import field_docs
from bagpipe.config.sections import DeviceConfig, MemoryConfig

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
KEPT = re.compile(r"(\d+)% (?:of the budget )?kept free")


def test_the_budget_options_help_states_the_margin_the_code_keeps():
    want = f"{MARGIN:.0%}"
    for cls, name in ((MemoryConfig, "memory_budget_mb"), (DeviceConfig, "device_memory_budget_mb")):
        said = KEPT.findall(field_docs(cls)[name])
        assert said and all(f"{p}%" == want for p in said), (name, said, want)


def test_the_docs_and_plans_description_state_the_margin_the_code_keeps():
    want = f"{MARGIN:.0%}"
    texts = {
        "docs/beyond-memory.md": (ROOT / "docs/beyond-memory.md").read_text(),
        "bagpipe/commands/plan.py": (ROOT / "bagpipe/commands/plan.py").read_text(),
    }
    for where, text in texts.items():
        # a past margin may be told as history ("the 10% the budget then kept free")
        said = KEPT.findall(text)
        assert said and all(f"{p}%" == want for p in said), (where, said, want)
