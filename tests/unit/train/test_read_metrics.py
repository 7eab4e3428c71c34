"""``bagpipe plot``'s reader of metrics.jsonl (``bagpipe/train/plot.py``: ``read_metrics``)
on the damage a crash or a full disk leaves: one line naming file and line, never a traceback."""

from __future__ import annotations

import pytest

from bagpipe.errors import DataError
from bagpipe.train.plot import read_metrics

pytestmark = pytest.mark.unit

GOOD = '{"step": 1, "loss": 0.7}\n{"step": 2, "eval_auc": 0.6}\n'


def test_records_are_split_and_a_cut_last_line_is_dropped(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(GOOD + '{"step": 3, "lo')
    train, evals = read_metrics(tmp_path)
    assert [r["step"] for r in train] == [1] and [r["step"] for r in evals] == [2]


@pytest.mark.parametrize(
    "bad,says",
    [
        (b"[1, 2]\n", ":2: not a record (a JSON list, not an object)"),
        (b"\x00\x00\x00\n", ":2: not a JSON record"),  # NUL bytes a crash leaves
        (b"\xff\xfe{\n", ":2: not a JSON record"),  # not UTF-8: was a UnicodeDecodeError traceback
    ],
)
def test_a_damaged_line_is_one_error_naming_file_and_line(tmp_path, bad, says):
    lines = GOOD.encode().splitlines(keepends=True)
    (tmp_path / "metrics.jsonl").write_bytes(lines[0] + bad + lines[1])
    with pytest.raises(DataError) as e:
        read_metrics(tmp_path)
    assert str(e.value) == f"{tmp_path / 'metrics.jsonl'}{says}"
