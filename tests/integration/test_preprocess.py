"""``bagpipe preprocess`` on the real samples and on hand-made files.

The real samples live in ``../shared/data`` (relative to the repository); the tests
that need them skip with a clear reason when that folder is absent. Every expected
number (lines, labels, dense values, categorical ids) is recomputed here from the raw
files with plain Python: a tiny reference parser per format, an independent FNV-1a,
the vocabulary as "sorted distinct keys of the train lines, ids from 1, 0 for the
rest", and the split as "the first floor(0.9 * N) data lines are train".

Also covered: hashing mode equals DLRM's ``int(hex, 16) % M``, --min-count, --vocab-from,
gzip and CRLF input, determinism (byte-identical shards across runs, thread counts and
block sizes), the one-line errors (missing file, empty file, existing output, bad
line with file:line), --on-error skip, and that an interrupted run leaves nothing in --out (it builds beside it).
"""

from __future__ import annotations

import csv
import datetime
import gzip
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from repo import SHARED_DATA

from bagpipe.cli import main
from bagpipe.data.shards import Dataset
from bagpipe.data.stream import BatchStream
from bagpipe.errors import DataError, ParseError
from bagpipe.preprocess.criteo import CriteoFormat
from bagpipe.preprocess.options import Options
from bagpipe.preprocess.run import run_preprocess

pytestmark = pytest.mark.integration

needs_data = pytest.mark.skipif(
    not SHARED_DATA.is_dir(),
    reason=f"real data samples not found: {SHARED_DATA} (../shared/data next to the repository) is absent",
)
CRITEO_TRAIN = SHARED_DATA / "criteo" / "kaggle_train_head10k.tsv"
CRITEO_TEST = SHARED_DATA / "criteo" / "kaggle_test_head10k.tsv"
CRITEO_PART = SHARED_DATA / "criteo" / "kaggle_part0_100.tsv"
AVAZU_TRAIN = SHARED_DATA / "avazu" / "train_head9k.csv"
AVAZU_TEST = SHARED_DATA / "avazu" / "test_1k.csv"
TAOBAO = {s: SHARED_DATA / "taobao" / f"fuxictr_taobao_tiny_{s}_sample.csv" for s in ("train", "valid", "test")}


# ---------------------------------------------------------------------------------
# helpers: the CLI, reading a dataset back, and independent reference parsers
# ---------------------------------------------------------------------------------


def cli(capsys, *args) -> tuple[int, str, str]:
    code = main(["preprocess", *[str(a) for a in args], "--no-progress"])
    out, err = capsys.readouterr()
    return code, out, err


def read_split(out: Path, split: str) -> dict:
    """Everything of one split, concatenated over its shards."""
    ds = Dataset(out)
    parts: dict[str, list] = {"labels": [], "dense": [], "sparse": []}
    mh: dict[str, list] = {f.name: [] for f in ds.meta.multihot_features}
    for i in range(len(ds.shard_sizes(split))):
        sh = ds.shard(split, i)
        parts["labels"].append(np.asarray(sh.labels))
        parts["dense"].append(np.asarray(sh.dense))
        parts["sparse"].append(np.asarray(sh.sparse))
        for name, (values, offsets) in sh.multihot.items():
            mh[name].append((np.asarray(values), np.diff(np.asarray(offsets))))
    res: dict[str, Any] = {k: np.concatenate(v) for k, v in parts.items()}
    res["multihot"] = {n: (np.concatenate([p[0] for p in v]), np.concatenate([p[1] for p in v])) for n, v in mh.items()}
    res["meta"] = ds.meta
    return res


def dense_ref(x: float) -> np.float32:
    return np.float32(np.log1p(np.float64(max(x, 0))))


def fnv(value: str) -> int:
    """Key of a string value: 64-bit FNV-1a of its bytes, top bit cleared; '' -> -1."""
    if value == "":
        return -1
    h = 0xCBF29CE484222325
    for b in value.encode():
        h = ((h ^ b) * 0x100000001B3) % (1 << 64)
    return h % (1 << 63)


def vocab_ids(train_keys: list[list[int]], keys: list[list[int]], min_count: int = 1) -> np.ndarray:
    """ids of ``keys`` (rows x features) under the vocabulary of ``train_keys``."""
    out = np.zeros((len(keys), len(keys[0]) if keys else 0), dtype=np.int64)
    for j in range(out.shape[1]):
        counts: dict[int, int] = {}
        for row in train_keys:
            counts[row[j]] = counts.get(row[j], 0) + 1
        kept = sorted(k for k, c in counts.items() if c >= min_count)
        ids = {k: i + 1 for i, k in enumerate(kept)}
        for r, row in enumerate(keys):
            out[r, j] = ids.get(row[j], 0)
    return out


def criteo_ref(line: str, labelled: bool = True):
    f = line.rstrip("\n").split("\t")
    assert len(f) == (40 if labelled else 39)
    label = int(f[0]) if labelled else 0
    o = 1 if labelled else 0
    ints = [int(v) if v else 0 for v in f[o : o + 13]]
    cats = [int(v, 16) if v else -1 for v in f[o + 13 :]]
    return label, [dense_ref(x) for x in ints], cats


def read_lines(path: Path) -> list[str]:
    with open(path) as fh:
        return fh.read().splitlines()


def check_batches(out: Path, split: str = "train") -> None:
    ds = Dataset(out)
    stream = BatchStream(ds, split, 32, seed=1)
    n = 0
    for batch in stream.batches(0, 3):
        assert batch.batch_size == 32
        assert batch.num_features == ds.meta.num_features
        assert batch.dense.shape == (32, ds.meta.num_dense)
        assert int(batch.rows.max()) < ds.meta.total_rows
        n += 1
    assert n == 3


# ---------------------------------------------------------------------------------
# the real samples
# ---------------------------------------------------------------------------------


@needs_data
def test_criteo_real_samples_exact(tmp_path, capsys):
    out = tmp_path / "criteo"
    code, stdout, err = cli(capsys, "criteo", "--input", CRITEO_TRAIN, CRITEO_PART, "--out", out)
    assert code == 0, err
    assert "rows train 9,090, eval 1,010" in stdout and "MB/s" in stdout

    lines = read_lines(CRITEO_TRAIN) + read_lines(CRITEO_PART)
    assert len(lines) == 10_100
    parsed = [criteo_ref(ln) for ln in lines]
    n_train = math.floor(0.9 * len(lines))
    train, ev = parsed[:n_train], parsed[n_train:]
    train_keys = [p[2] for p in train]

    meta = Dataset(out).meta
    assert meta.dense_names == [f"I{i}" for i in range(1, 14)]
    assert [f.name for f in meta.features] == [f"C{i}" for i in range(1, 27)]
    assert meta.id_dtype == "int32"
    for j, f in enumerate(meta.features):
        assert f.num_rows == len({k[j] for k in train_keys}) + 1
    assert meta.source["skipped_lines"] == 0

    for split, rows in (("train", train), ("eval", ev)):
        got = read_split(out, split)
        assert len(got["labels"]) == len(rows)
        assert got["labels"].sum() == sum(p[0] for p in rows)  # the CTR, exactly
        np.testing.assert_array_equal(got["dense"], np.array([p[1] for p in rows], dtype=np.float32))
        np.testing.assert_array_equal(got["sparse"], vocab_ids(train_keys, [p[2] for p in rows]))
    # the sample's CTR as documented in ../shared/data/README.md
    assert round(sum(p[0] for p in parsed[:10_000]) / 10_000, 3) == 0.218
    check_batches(out)

    # the unlabelled Kaggle test file, through the same vocabulary
    test_out = tmp_path / "criteo-test"
    code, stdout, err = cli(
        capsys, "criteo", "--input", CRITEO_TEST, "--no-label", "--vocab-from", out, "--out", test_out
    )
    assert code == 0, err
    test_lines = read_lines(CRITEO_TEST)
    assert len(test_lines) == 10_000
    tparsed = [criteo_ref(ln, labelled=False) for ln in test_lines]
    got = read_split(test_out, "test")
    assert list(Dataset(test_out).meta.splits) == ["test"]
    assert len(got["labels"]) == 10_000 and not got["labels"].any()
    np.testing.assert_array_equal(got["dense"], np.array([p[1] for p in tparsed], dtype=np.float32))
    np.testing.assert_array_equal(got["sparse"], vocab_ids(train_keys, [p[2] for p in tparsed]))
    assert Dataset(test_out).meta.table_sizes == meta.table_sizes
    assert Dataset(test_out).meta.source["labelled"] is False


def avazu_ref(row: dict[str, str]):
    h = row["hour"]
    day = datetime.date(2000 + int(h[:2]), int(h[2:4]), int(h[4:6]))
    cols = [c for c in AVAZU_COLUMNS if c not in ("id", "click", "hour")]
    return int(row["click"]), [int(h[6:]), day.weekday()], [fnv(row[c]) for c in cols]


AVAZU_COLUMNS = (
    "id click hour C1 banner_pos site_id site_domain site_category app_id app_domain app_category "
    "device_id device_ip device_model device_type device_conn_type C14 C15 C16 C17 C18 C19 C20 C21"
).split()


@needs_data
def test_avazu_real_samples_exact(tmp_path, capsys):
    out = tmp_path / "avazu"
    code, stdout, err = cli(capsys, "avazu", "--input", AVAZU_TRAIN, "--eval-files", AVAZU_TEST, "--out", out)
    assert code == 0, err
    with open(AVAZU_TRAIN, newline="") as fh:
        train_rows = list(csv.DictReader(fh))
    with open(AVAZU_TEST, newline="") as fh:
        test_rows = [dict(zip(AVAZU_COLUMNS, r)) for r in csv.reader(fh)]
    assert len(train_rows) == 8_999 and len(test_rows) == 1_000
    assert all(len(r) == 24 for r in train_rows + test_rows)
    train, ev = [avazu_ref(r) for r in train_rows], [avazu_ref(r) for r in test_rows]
    train_keys = [p[2] for p in train]

    meta = Dataset(out).meta
    assert meta.dense_names == []
    names = [f.name for f in meta.features]
    assert names[:2] == ["hour_of_day", "day_of_week"] and len(names) == 23
    assert [f.num_rows for f in meta.features[:2]] == [24, 7]
    assert meta.splits["train"].num_samples == 8_999 and meta.splits["eval"].num_samples == 1_000
    headers = {Path(i["path"]).name: i["header"] for i in meta.source["inputs"]}
    assert headers == {"train_head9k.csv": True, "test_1k.csv": False}

    for split, rows in (("train", train), ("eval", ev)):
        got = read_split(out, split)
        assert got["labels"].sum() == sum(p[0] for p in rows)
        assert got["dense"].shape == (len(rows), 0)
        np.testing.assert_array_equal(got["sparse"][:, :2], np.array([p[1] for p in rows]))
        np.testing.assert_array_equal(got["sparse"][:, 2:], vocab_ids(train_keys, [p[2] for p in rows]))
    check_batches(out)

    # test_1k.csv alone with --no-header and the train vocabulary: the same ids
    out2 = tmp_path / "avazu-test"
    code, _, err = cli(
        capsys, "avazu", "--input", AVAZU_TEST, "--no-header", "--split", "0", "--vocab-from", out, "--out", out2
    )
    assert code == 0, err
    a, b = read_split(out, "eval"), read_split(out2, "eval")
    np.testing.assert_array_equal(a["sparse"], b["sparse"])
    np.testing.assert_array_equal(a["labels"], b["labels"])


def test_avazu_unlabelled_with_header(tmp_path, capsys):
    cols = [c for c in AVAZU_COLUMNS if c != "click"]
    row = "10000174,14103100,1005,0,1fbe01fe,f3845767,28905ebd,ecad2386,7801e8d9,07d7df22,a99f214a,ddd2926e,44956a24,1,2,15706,320,50,1722,0,35,-1,79"
    src = tmp_path / "test.csv"
    src.write_text(",".join(cols) + "\n" + "\n".join([row] * 40) + "\n")
    code, _, err = cli(capsys, "avazu", "--input", src, "--out", tmp_path / "a", "--max-rows-per-table", 50)
    assert code == 2 and "missing click; for an unlabelled file pass --no-label" in one_line_error(err)
    out = tmp_path / "b"
    code, stdout, err = cli(capsys, "avazu", "--input", src, "--no-label", "--max-rows-per-table", 50, "--out", out)
    assert code == 0, err
    assert "rows test 40" in stdout
    got = read_split(out, "test")
    assert not got["labels"].any()
    assert got["sparse"][0, :2].tolist() == [0, 4]  # 2014-10-31 00h was a Friday
    assert got["sparse"][0, 2] == fnv("1005") % 50


TAOBAO_KEYS = (
    "userid adgroup_id pid cate_id campaign_id customer brand cms_segid cms_group_id final_gender_code "
    "age_level pvalue_level shopping_level occupation new_user_class_level"
).split()


@needs_data
def test_taobao_real_samples_exact(tmp_path, capsys):
    out = tmp_path / "taobao"
    code, _, err = cli(capsys, "taobao", "--input", TAOBAO["train"], "--eval-files", TAOBAO["valid"], "--out", out)
    assert code == 0, err

    def load(path):
        with open(path, newline="") as fh:
            return list(csv.DictReader(fh))

    train_rows, valid_rows = load(TAOBAO["train"]), load(TAOBAO["valid"])
    assert len(train_rows) == 100 and len(valid_rows) == 100

    def seq(r):
        return [fnv(x) for x in r["click_sequence"].split("^")] if r["click_sequence"] else []

    train_keys = [[fnv(r[c]) for c in TAOBAO_KEYS] for r in train_rows]
    seq_vocab = sorted({k for r in train_rows for k in seq(r)})
    seq_ids = {k: i + 1 for i, k in enumerate(seq_vocab)}

    meta = Dataset(out).meta
    assert meta.dense_names == ["price"]
    assert [f.name for f in meta.features] == TAOBAO_KEYS + ["click_sequence"]
    assert meta.features[-1].multi_hot and meta.features[-1].num_rows == len(seq_vocab) + 1
    for split, rows in (("train", train_rows), ("eval", valid_rows)):
        got = read_split(out, split)
        assert len(got["labels"]) == 100
        assert got["labels"].sum() == sum(int(r["clk"]) for r in rows)
        np.testing.assert_array_equal(got["dense"][:, 0], [dense_ref(float(r["price"])) for r in rows])
        keys = [[fnv(r[c]) for c in TAOBAO_KEYS] for r in rows]
        np.testing.assert_array_equal(got["sparse"], vocab_ids(train_keys, keys))
        values, lengths = got["multihot"]["click_sequence"]
        np.testing.assert_array_equal(lengths, [len(seq(r)) for r in rows])
        np.testing.assert_array_equal(values, [seq_ids.get(k, 0) for r in rows for k in seq(r)])
    check_batches(out)

    # the test file with the same vocabulary
    out2 = tmp_path / "taobao-test"
    code, stdout, err = cli(
        capsys, "taobao", "--input", TAOBAO["test"], "--split", "0", "--vocab-from", out, "--out", out2
    )
    assert code == 0, err
    assert "eval 100" in stdout


# ---------------------------------------------------------------------------------
# modes and options on small hand-made Criteo files
# ---------------------------------------------------------------------------------


def criteo_line(rng: np.random.Generator, label: int | None = None) -> str:
    lab = str(label if label is not None else rng.integers(0, 2))
    ints = ["" if rng.random() < 0.2 else str(int(rng.integers(-3, 5000))) for _ in range(13)]
    cats = ["" if rng.random() < 0.1 else f"{int(rng.zipf(1.5)) * 2654435761 % (1 << 32):08x}" for _ in range(26)]
    return "\t".join([lab] + ints + cats)


def write_criteo(path: Path, n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    lines = [criteo_line(rng) for _ in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return lines


def test_hashing_is_dlrm_max_ind_range(tmp_path, capsys):
    src = tmp_path / "day.tsv"
    lines = write_criteo(src, 500)
    out = tmp_path / "out"
    code, stdout, err = cli(capsys, "criteo", "--input", src, "--max-rows-per-table", 1000, "--split", 1, "--out", out)
    assert code == 0, err
    assert "hashed to 1,000 rows" in stdout
    got = read_split(out, "train")
    expect = [[int(v, 16) % 1000 if v else 0 for v in ln.split("\t")[14:]] for ln in lines]
    np.testing.assert_array_equal(got["sparse"], expect)
    meta = Dataset(out).meta
    assert meta.table_sizes == [1000] * 26
    assert json.loads((out / "vocab" / "vocab.json").read_text())["mode"] == "hash"
    # --vocab-from a hashed dataset hashes the same way
    out2 = tmp_path / "out2"
    code, _, err = cli(capsys, "criteo", "--input", src, "--vocab-from", out, "--split", 1, "--out", out2)
    assert code == 0, err
    np.testing.assert_array_equal(read_split(out2, "train")["sparse"], got["sparse"])


def test_min_count_and_split(tmp_path, capsys):
    src = tmp_path / "day.tsv"
    lines = write_criteo(src, 1000, seed=3)
    out = tmp_path / "out"
    code, stdout, err = cli(capsys, "criteo", "--input", src, "--min-count", 3, "--split", 0.75, "--out", out)
    assert code == 0, err
    assert "rows train 750, eval 250" in stdout
    parsed = [criteo_ref(ln) for ln in lines]
    train_keys = [p[2] for p in parsed[:750]]
    for split, rows in (("train", parsed[:750]), ("eval", parsed[750:])):
        got = read_split(out, split)
        np.testing.assert_array_equal(got["sparse"], vocab_ids(train_keys, [p[2] for p in rows], min_count=3))
    vocab = json.loads((out / "vocab" / "vocab.json").read_text())
    assert vocab["mode"] == "vocab" and vocab["min_count"] == 3
    keys = np.load(out / "vocab" / "C1.keys.npy")
    counts = np.load(out / "vocab" / "C1.counts.npy")
    assert (np.diff(keys) > 0).all() and counts.sum() == 750
    assert Dataset(out).meta.features[0].num_rows == int((counts >= 3).sum()) + 1


def test_eval_files_and_no_split_default(tmp_path, capsys):
    a, b = tmp_path / "a.tsv", tmp_path / "b.tsv"
    write_criteo(a, 300, seed=1)
    write_criteo(b, 120, seed=2)
    out = tmp_path / "out"
    code, stdout, err = cli(capsys, "criteo", "--input", a, "--eval-files", b, "--out", out)
    assert code == 0, err
    assert "rows train 300, eval 120" in stdout  # with --eval-files, --split defaults to 1.0
    out2 = tmp_path / "out2"
    code, stdout, err = cli(capsys, "criteo", "--input", a, b, "--out", out2)
    assert code == 0, err
    assert "rows train 378, eval 42" in stdout  # the default 0.9 over both files in order


def test_same_input_gives_byte_identical_shards(tmp_path):
    src = tmp_path / "day.tsv"
    write_criteo(src, 3000, seed=5)

    def run(out, workers, block_bytes):
        run_preprocess(
            CriteoFormat(),
            Options(out=str(out), inputs=[str(src)], workers=workers, block_bytes=block_bytes, rows_per_shard=700),
        )

    run(tmp_path / "a", 1, 8 << 20)
    run(tmp_path / "b", 1, 8 << 20)
    run(tmp_path / "c", 3, 16 << 10)

    def files(d):
        return {p.relative_to(d): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}

    fa, fb, fc = files(tmp_path / "a"), files(tmp_path / "b"), files(tmp_path / "c")
    assert len([p for p in fa if p.name == "sparse.npy"]) == 5  # 2700 train + 300 eval rows, 700 per shard
    assert fa == fb
    assert fa == fc  # independent of threads and block size


def test_gzip_crlf_and_missing_final_newline(tmp_path, capsys):
    src = tmp_path / "day.tsv"
    lines = write_criteo(src, 400, seed=7)
    gz = tmp_path / "day.tsv.gz"
    with gzip.open(gz, "wb") as fh:
        fh.write(src.read_bytes())
    crlf = tmp_path / "crlf.tsv"
    crlf.write_bytes(("\r\n".join(lines)).encode())  # CRLF and no newline at the end
    outs = []
    for i, f in enumerate((src, gz, crlf)):
        out = tmp_path / f"out{i}"
        code, stdout, err = cli(capsys, "criteo", "--input", f, "--out", out)
        assert code == 0, err
        assert "rows train 360, eval 40" in stdout
        outs.append(out)
    for split in ("train", "eval"):
        ref = read_split(outs[0], split)
        for out in outs[1:]:
            got = read_split(out, split)
            for k in ("labels", "dense", "sparse"):
                np.testing.assert_array_equal(got[k], ref[k])


# ---------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------


def one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("bagpipe preprocess: error: ")
    return lines[0]


def test_missing_and_empty_input(tmp_path, capsys):
    code, _, err = cli(capsys, "criteo", "--input", tmp_path / "nope.tsv", "--out", tmp_path / "o")
    assert code == 2 and "nope.tsv: no such file" in one_line_error(err)
    empty = tmp_path / "empty.tsv"
    empty.write_bytes(b"")
    code, _, err = cli(capsys, "criteo", "--input", empty, "--out", tmp_path / "o")
    assert code == 2 and "empty.tsv: empty input" in one_line_error(err)
    header_only = tmp_path / "h.csv"
    header_only.write_text(",".join(AVAZU_COLUMNS) + "\n")
    code, _, err = cli(capsys, "avazu", "--input", header_only, "--out", tmp_path / "o")
    assert code == 2 and "h.csv: empty input (only a header line)" in one_line_error(err)
    assert not (tmp_path / "o").exists()


def test_existing_output_needs_overwrite(tmp_path, capsys):
    src = tmp_path / "day.tsv"
    write_criteo(src, 50)
    out = tmp_path / "out"
    assert cli(capsys, "criteo", "--input", src, "--out", out)[0] == 0
    code, _, err = cli(capsys, "criteo", "--input", src, "--out", out)
    assert code == 2 and "already holds a dataset (pass --overwrite" in one_line_error(err)
    code, _, err = cli(capsys, "criteo", "--input", src, "--out", out, "--overwrite", "--max-rows-per-table", 10)
    assert code == 0, err
    assert Dataset(out).meta.table_sizes == [10] * 26


def test_bad_lines_fail_names_file_and_line_or_are_skipped(tmp_path, capsys):
    src = tmp_path / "day.tsv"
    lines = write_criteo(src, 200, seed=9)
    lines[56] = lines[56].replace("\t", "\tx", 1)  # line 57: I1 not an integer
    fields = lines[120].split("\t")
    fields[20] = "zz12345g"  # line 121: C7 not hex
    lines[120] = "\t".join(fields)
    lines[150] = "\t".join(lines[150].split("\t")[:30])  # line 151: wrong field count
    lines[170] = "2" + lines[170][1:]  # line 171: label not 0/1
    src.write_text("\n".join(lines) + "\n")

    code, _, err = cli(capsys, "criteo", "--input", src, "--out", tmp_path / "a")
    msg = one_line_error(err)
    assert code == 2 and f"{src}:57: I1 'x" in msg and "is not an integer" in msg
    assert not (tmp_path / "a" / "meta.json").exists()

    out = tmp_path / "b"
    code, stdout, err = cli(capsys, "criteo", "--input", src, "--out", out, "--on-error", "skip", "--split", 1)
    assert code == 0, err
    assert "skipped 4 bad lines" in stdout
    src_meta = Dataset(out).meta.source
    assert src_meta["skipped_lines"] == 4
    ex = src_meta["skipped_examples"]
    assert [e.split(":")[1] for e in ex] == ["57", "121", "151", "171"]
    assert "C7 'zz12345g' is not a hex category" in ex[1]
    assert "expected 40 tab-separated fields, got 30" in ex[2]
    assert "label '2' is not 0 or 1" in ex[3]
    good = [criteo_ref(ln) for i, ln in enumerate(lines) if i not in (56, 120, 150, 170)]
    got = read_split(out, "train")
    assert len(got["labels"]) == 196
    np.testing.assert_array_equal(got["dense"], np.array([p[1] for p in good], dtype=np.float32))


def test_csv_line_numbers_count_the_header(tmp_path):
    src = tmp_path / "t.csv"
    row = "1000009418151094273,0,14102100,1005,0,1fbe01fe,f3845767,28905ebd,ecad2386,7801e8d9,07d7df22,a99f214a,ddd2926e,44956a24,1,2,15706,320,50,1722,0,35,-1,79"
    bad = row.replace(",14102100,", ",14102199,")  # hour 99
    src.write_text(",".join(AVAZU_COLUMNS) + "\n" + "\n".join([row] * 5 + [bad] + [row] * 3) + "\n")
    from bagpipe.preprocess.avazu import AvazuFormat

    with pytest.raises(ParseError) as e:
        run_preprocess(AvazuFormat(), Options(out=str(tmp_path / "o"), inputs=[str(src)]))
    assert e.value.line == 7 and "hour '14102199'" in e.value.problem


def test_interrupted_run_is_not_a_dataset(tmp_path):
    src = tmp_path / "day.tsv"
    lines = write_criteo(src, 2000, seed=11)
    lines[1900] = "oops"
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    opts = Options(out=str(out), inputs=[str(src)], max_rows_per_table=100, rows_per_shard=100, block_bytes=16 << 10)
    with pytest.raises(ParseError):
        run_preprocess(CriteoFormat(), opts)
    # shards were written before the bad line, beside out; they are gone and out never appeared
    assert not out.exists() and not list(tmp_path.glob(".out.*"))
    with pytest.raises(DataError, match="no such dataset directory"):
        Dataset(out)
    lines[1900] = lines[1899]
    src.write_text("\n".join(lines) + "\n")
    run_preprocess(CriteoFormat(), opts)  # nothing to overwrite
    assert Dataset(out).meta.num_samples("train") == 1800


def test_option_conflicts(tmp_path, capsys):
    src = tmp_path / "day.tsv"
    write_criteo(src, 50)
    code, _, err = cli(capsys, "criteo", "--input", src, "--split", 0, "--out", tmp_path / "o")
    assert code == 2 and "vocabulary mode needs train lines" in one_line_error(err)
    code, _, err = cli(capsys, "criteo", "--input", src, "--no-label", "--out", tmp_path / "o")
    assert code == 2 and "vocabulary mode needs train lines" in one_line_error(err)
    code, _, err = cli(capsys, "criteo", "--input", src, src, "--out", tmp_path / "o")
    assert code == 2 and "given twice" in one_line_error(err)
    out = tmp_path / "crit"
    assert cli(capsys, "criteo", "--input", src, "--out", out)[0] == 0
    avz = tmp_path / "a.csv"
    avz.write_text("x\n")
    code, _, err = cli(capsys, "avazu", "--input", avz, "--vocab-from", out, "--out", tmp_path / "o")
    assert code == 2 and "holds a criteo vocabulary, not avazu" in one_line_error(err)
    with pytest.raises(SystemExit):
        main(
            ["preprocess", "criteo", "--input", str(src), "--out", "x", "--min-count", "2", "--max-rows-per-table", "5"]
        )
    capsys.readouterr()


@needs_data
def test_train_on_preprocessed_criteo_sample_reports_auc(tmp_path, capsys):
    """The real Criteo sample, preprocessed, trains in full and lookahead mode to the same digest."""
    import torch

    out = tmp_path / "criteo"
    code, _, err = cli(capsys, "criteo", "--input", CRITEO_TRAIN, "--out", out)
    assert code == 0, err
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        digests = []
        for mode in ("full", "lookahead"):
            run = tmp_path / mode
            cache = ["--cache-rows", "4000", "--lookahead", "8"] if mode == "lookahead" else []  # full has no cache
            rc = main(
                [
                    "train",
                    "--data",
                    str(out),
                    "--out",
                    str(run),
                    "--model",
                    "dlrm",
                    "--steps",
                    "120",
                    "--batch-size",
                    "64",
                    "--mode",
                    mode,
                    *cache,
                    "--no-progress",
                ]
            )
            captured = capsys.readouterr()
            assert rc == 0, captured.err
            assert "eval AUC" in captured.out
            summary = json.loads((run / "summary.json").read_text())
            assert 0.5 < summary["eval_auc"] < 1.0
            digests.append(summary["params_sha256"])
        assert digests[0] == digests[1]
    finally:
        torch.set_num_threads(threads)
