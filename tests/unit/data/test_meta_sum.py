"""meta.json carries the CRC-32 of its own content (format version 2), so an edit that
keeps valid JSON is found where the data set is opened, not trained on silently.

What this proves:
* a written meta.json carries ``meta_crc32``, the CRC-32 of its canonical content (sorted
  keys, no spaces, the sum itself left out); re-indenting it changes nothing;
* one table's ``num_rows`` grown, a shard size changed, the format version one digit off
  (with the sum still there), or the sum's key gone from a version-2 meta.json: opening
  the data set (``DatasetMeta.load``, ``Dataset``) is one DataError naming meta.json and
  saying it is damaged; the file is left as it was;
* a version-1 meta.json (written before there were such sums, no ``meta_crc32``) still
  opens, and keeps the fingerprint it had (a run trained on it still resumes).
"""

from __future__ import annotations

import json
import zlib

import numpy as np
import pytest

from bagpipe.data.schema import META_FILE, DatasetMeta, FeatureSpec
from bagpipe.data.shards import Dataset, ShardWriter
from bagpipe.errors import DataError

pytestmark = pytest.mark.unit


@pytest.fixture
def data(tmp_path):
    out = tmp_path / "ds"
    w = ShardWriter(out, ["d0"], [FeatureSpec("a", 20), FeatureSpec("b", 30)], rows_per_shard=40)
    rng = np.random.default_rng(0)
    n = 100
    w.append(
        "train",
        rng.integers(0, 2, n).astype(np.float32),
        rng.random((n, 1), dtype=np.float32),
        np.stack([rng.integers(0, 20, n), rng.integers(0, 30, n)], axis=1),
    )
    w.close()
    return out


def canonical_crc(d: dict) -> str:
    body = {k: v for k, v in d.items() if k != "meta_crc32"}
    return f"{zlib.crc32(json.dumps(body, sort_keys=True, separators=(',', ':')).encode()):08x}"


def test_meta_json_carries_the_crc32_of_its_content(data):
    d = json.loads((data / META_FILE).read_text())
    assert d["format_version"] == 2 and d["meta_crc32"] == canonical_crc(d)
    (data / META_FILE).write_text(json.dumps(d))  # other whitespace, the same content
    assert DatasetMeta.load(data).table_sizes == [20, 30]


def _grow_table(d):
    d["features"][1]["num_rows"] = 31


def _shard_size(d):
    d["splits"]["train"]["shard_sizes"][0] = 41
    d["splits"]["train"]["num_samples"] = 101


def _version(d):
    d["format_version"] = 3  # '2' and '3' are one bit apart


@pytest.mark.parametrize("edit", [_grow_table, _shard_size, _version])
def test_an_edit_that_keeps_valid_json_is_a_damaged_meta_json(data, edit):
    path = data / META_FILE
    d = json.loads(path.read_text())
    written = d["meta_crc32"]
    edit(d)
    path.write_text(json.dumps(d, indent=2, sort_keys=True))
    before = path.read_bytes()
    for opening in (DatasetMeta.load, Dataset):
        with pytest.raises(DataError) as e:
            opening(data)
        assert str(e.value) == (
            f"{path}: damaged data set file: its content does not match the CRC-32 it was written with "
            f"(meta_crc32 {written}, the content's {canonical_crc(d)}): it was edited or damaged since it was "
            "written; rebuild the data set or restore its meta.json"
        )
    assert path.read_bytes() == before


def test_a_version_2_meta_json_without_its_sum_is_damaged(data):
    path = data / META_FILE
    d = json.loads(path.read_text())
    del d["meta_crc32"]
    path.write_text(json.dumps(d))
    with pytest.raises(DataError) as e:
        DatasetMeta.load(data)
    assert str(e.value) == (
        f"{path}: damaged data set file: it says format_version 2, which carries the CRC-32 of its content "
        "(meta_crc32), and has none; rebuild the data set or restore its meta.json"
    )


def test_a_version_1_meta_json_without_a_sum_still_opens_with_its_fingerprint(data):
    path = data / META_FILE
    d = json.loads(path.read_text())
    del d["meta_crc32"]
    d["format_version"] = 1  # as bagpipe wrote it before version 2
    path.write_text(json.dumps(d, indent=2, sort_keys=True))
    ds = Dataset(data)
    assert ds.meta.format_version == 1 and ds.meta.table_sizes == [20, 30]
    from bagpipe.data.integrity import fingerprint

    before = fingerprint(data, ds.meta)
    ds.meta.save(data)  # written again by this bagpipe: the sum is added, the version kept
    again = json.loads(path.read_text())
    assert again["format_version"] == 1 and again["meta_crc32"] == canonical_crc(again)
    assert fingerprint(data, DatasetMeta.load(data)) == before
