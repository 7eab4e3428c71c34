"""A resumed run's TensorBoard writer purges what an earlier run of it logged past the step
it continues from (``purge_step``), as metrics.jsonl is rewound; a new run purges nothing.
The writer is a stand-in: TensorBoard is an optional extra."""

from __future__ import annotations

import sys
import types

import pytest

from bagpipe.train.tensorboard import with_tensorboard

pytestmark = pytest.mark.unit


class Writer:
    made: list[dict] = []

    def __init__(self, **kw):
        Writer.made.append(kw)

    def close(self) -> None:
        pass


class Log:
    def close(self) -> None:
        pass


def test_purge_step_is_the_step_after_the_one_continued_from(monkeypatch, tmp_path):
    fake = types.ModuleType("torch.utils.tensorboard")
    fake.SummaryWriter = Writer  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", fake)
    Writer.made.clear()
    for since in (0, 20):
        with_tensorboard(Log(), str(tmp_path / "tb"), since=since).close()
    assert [w["purge_step"] for w in Writer.made] == [None, 21]
    assert with_tensorboard(Log(), None, since=20).__class__ is Log  # no folder: no writer
